"""Contexts handed to user code, and the ambient per-rollout context.

``RolloutContext`` is the ambient state of one rollout (chat endpoint, key, id, sample
source). Backends enter it around the workflow; integrations read it with
:func:`get_rollout_context` to bind their model to the rollout-scoped endpoint.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar, overload

from osmosis_ai.rollout.config import AgentWorkflowConfig
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutStatus

TConfig = TypeVar("TConfig", bound=AgentWorkflowConfig)

ENV_CHAT_COMPLETIONS_URL = "OSMOSIS_CHAT_COMPLETIONS_URL"
ENV_API_KEY = "OSMOSIS_API_KEY"
ENV_ROLLOUT_ID = "OSMOSIS_ROLLOUT_ID"


class SampleSource(ABC):
    """Something that can produce the rollout's sample when the workflow returns ``None``.

    Agent-framework integrations register one (the agent or its session). A custom source
    whose native history is not OpenAI-chat shaped should set ``trajectory_messages`` itself.
    """

    @abstractmethod
    async def get_sample(self) -> RolloutSample | None:
        """Return the sample of the current rollout."""

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        """Return a partial sample for live previews; ``None`` when not supported."""
        del max_messages
        return None


class ArtifactsFolder:
    """A rollout's artifacts folder, made the first time it is asked for (most rollouts
    never write a file, so most never touch the filesystem). ``make`` returns the folder,
    or ``None`` when none could be made; its answer is kept."""

    __slots__ = ("_folder", "_made", "_make")

    def __init__(self, make: Callable[[], Path | None]) -> None:
        self._make = make
        self._folder: Path | None = None
        self._made = False

    @property
    def made(self) -> bool:
        """Whether the folder was asked for (and so made, or found unusable)."""
        return self._made

    def get(self) -> Path | None:
        if not self._made:
            self._folder = self._make()
            self._made = True
        return self._folder


class _ArtifactsDir:
    """The ``artifacts_dir`` field: a ``Path``, ``None``, or an :class:`ArtifactsFolder`
    that is made on first read. Reads always give ``Path | None``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._key = f"_{name}_value"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> None: ...
    @overload
    def __get__(self, obj: object, owner: type | None = None) -> Path | None: ...
    def __get__(self, obj: object | None, owner: type | None = None) -> Path | None:
        if obj is None:
            return None  # the dataclass default
        value = obj.__dict__.get(self._key)
        return value.get() if isinstance(value, ArtifactsFolder) else value

    def __set__(self, obj: object, value: Path | ArtifactsFolder | None) -> None:
        # A dataclass whose field default is this descriptor passes the descriptor itself.
        obj.__dict__[self._key] = None if isinstance(value, _ArtifactsDir) else value


@dataclass
class AgentWorkflowContext(Generic[TConfig]):
    """What :meth:`AgentWorkflow.run` receives.

    ``prompt`` holds the initial messages; ``config`` is a deep copy per rollout;
    ``artifacts_dir`` is a writable per-rollout folder, or ``None`` when none could be made
    (backends make it on first read).
    """

    prompt: list[dict[str, Any]]
    config: TConfig | None = None
    metadata: dict[str, Any] | None = None
    artifacts_dir: _ArtifactsDir = field(default=_ArtifactsDir(), repr=False, compare=False)


@dataclass
class GraderContext:
    """What :meth:`Grader.grade` receives: the label, the sample, and where to put files."""

    label: str | None = None
    sample: RolloutSample | None = None
    project_path: str | None = None
    metadata: dict[str, Any] | None = None
    artifacts_dir: _ArtifactsDir = field(default=_ArtifactsDir(), repr=False, compare=False)

    def set_reward(self, reward: float) -> None:
        """Attach the reward to the sample. It must be a finite number.

        Raises ``ValueError`` when there is no sample to grade and ``pydantic.ValidationError``
        for NaN, infinities and non-numbers.
        """
        if self.sample is None:
            raise ValueError("cannot set a reward: this rollout produced no sample to grade")
        self.sample.reward = reward


_current: ContextVar[RolloutContext | None] = ContextVar("osmosis_rollout_context", default=None)

StatusHook = Callable[[RolloutStatus], Awaitable[None]]


@dataclass
class RolloutContext:
    """The ambient state of one rollout; a context manager that makes itself current.

    Empty fields are filled from ``OSMOSIS_CHAT_COMPLETIONS_URL``, ``OSMOSIS_API_KEY`` and
    ``OSMOSIS_ROLLOUT_ID`` (how container runners pass them).
    """

    chat_completions_url: str = ""
    api_key: str | None = None
    rollout_id: str = ""
    sample_source: SampleSource | None = None
    status_hook: StatusHook | None = field(default=None, repr=False)
    _tokens: list[Token[RolloutContext | None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.chat_completions_url:
            self.chat_completions_url = os.environ.get(ENV_CHAT_COMPLETIONS_URL, "")
        if self.api_key is None:
            self.api_key = os.environ.get(ENV_API_KEY) or None
        if not self.rollout_id:
            self.rollout_id = os.environ.get(ENV_ROLLOUT_ID, "")

    def __repr__(self) -> str:
        key = None if self.api_key is None else "***"
        return (
            f"RolloutContext(rollout_id={self.rollout_id!r}, "
            f"chat_completions_url={self.chat_completions_url!r}, api_key={key!r})"
        )

    def __enter__(self) -> RolloutContext:
        self._tokens.append(_current.set(self))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        _current.reset(self._tokens.pop())

    async def __aenter__(self) -> RolloutContext:
        return self.__enter__()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.__exit__(exc_type, exc, tb)

    def set_sample_source(self, source: SampleSource) -> None:
        """Register the rollout's one sample source. A second, different source is an error."""
        if self.sample_source is not None and self.sample_source is not source:
            raise ValueError(
                f"rollout {self.rollout_id!r} already has a sample source "
                f"({type(self.sample_source).__name__}); a rollout has exactly one: "
                "use one agent or session per rollout"
            )
        self.sample_source = source

    async def get_sample(self) -> RolloutSample | None:
        """The registered source's sample, or ``None`` when no source is registered."""
        if self.sample_source is None:
            return None
        return await self.sample_source.get_sample()

    async def set_status(self, status: RolloutStatus) -> None:
        """Report a status change (e.g. ``grading``) to whoever runs this rollout."""
        if self.status_hook is not None:
            await self.status_hook(status)


def get_rollout_context() -> RolloutContext | None:
    """The ambient :class:`RolloutContext`, or ``None`` outside a rollout."""
    return _current.get()
