"""The exception tree of osmosis-ai.

Every error the package raises on purpose derives from :class:`OsmosisError`::

    OsmosisError
    ├── UsageError             you called something wrong (bad argument, wrong state)
    │   └── MissingExtraError  an optional extra is not installed
    ├── ConfigError            a configuration value is invalid
    ├── ProtocolError          a peer broke the rollout wire protocol
    │   └── RolloutProtocolError  a rollout server answered with an unexpected status
    └── DeadlineError          a stage waited past its deadline (mixed into each area's own
                               error: UpstreamTimeoutError, EnvironmentBuildTimeoutError, …)

Each area's own errors (``ControllerError``, ``TrainingError``, ``PlatformError``,
``CLIError``, …) derive from one of these; a class keeps a built-in base that catching code
relies on beside it (``SandboxError`` is also a ``RuntimeError``). Every exception class of
the package is an ``OsmosisError`` whose name ends in ``Error`` (``tests/test_architecture.py``).

Messages say what failed, with which value, and what to do about it.
"""

from __future__ import annotations

TYPE_CHECKING = False  # (typing itself is not imported: the CLI's start-up stays light)
if TYPE_CHECKING:
    from typing import Self


class OsmosisError(Exception):
    """Root of every error raised on purpose by osmosis-ai.

    Errors pickle whole (message and attributes) whatever their constructor takes, so they
    cross process boundaries, such as a training run's rollout I/O process, as they are.
    """

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(
    cls: type[OsmosisError], args: tuple[object, ...], state: dict[str, object]
) -> OsmosisError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class UsageError(OsmosisError):
    """An API was used wrongly: a bad argument or a call in the wrong state."""


class MissingExtraError(UsageError, ImportError):
    """An optional dependency group is needed but not installed."""

    def __init__(self, extra: str, feature: str, missing: str | None = None) -> None:
        self.extra = extra
        self.feature = feature
        self.missing = missing
        what = f" (module {missing!r} not found)" if missing else ""
        super().__init__(
            f"{feature} needs the '{extra}' extra{what}: run pip install \"osmosis-ai[{extra}]\""
        )


class ConfigError(OsmosisError):
    """A configuration value is invalid."""


class ProtocolError(OsmosisError):
    """A peer broke the rollout wire protocol."""


class RolloutProtocolError(ProtocolError):
    """A rollout server answered a request with an unexpected HTTP status or body."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        self.status_code = status_code
        super().__init__(message)


class DeadlineError(OsmosisError):
    """A stage waited past its deadline: ``stage`` names it, ``deadline_s`` is the deadline
    and ``setting`` what changes it (the Deadlines table of ``docs/architecture.md``).

    Areas mix it into their own error (``class UpstreamTimeoutError(UpstreamConnectionError,
    DeadlineError)``), so what already catches that area's errors still does; it takes no
    constructor arguments of its own: :meth:`with_deadline` sets the three fields.
    """

    stage: str = ""
    deadline_s: float | None = None
    setting: str = ""

    def with_deadline(self, stage: str, deadline_s: float, setting: str) -> Self:
        self.stage, self.deadline_s, self.setting = stage, deadline_s, setting
        return self
