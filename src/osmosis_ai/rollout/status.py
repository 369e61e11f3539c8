"""Status and error vocabularies shared by the rollout API and the wire protocol."""

from __future__ import annotations

from enum import StrEnum


class RolloutStatus(StrEnum):
    """Where a rollout stands. ``success``, ``failure`` and ``cancelled`` are terminal."""

    QUEUED = "queued"
    RUNNING = "running"
    GRADING = "grading"
    SUCCESS = "success"
    FAILURE = "failure"
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL


_TERMINAL = frozenset({RolloutStatus.SUCCESS, RolloutStatus.FAILURE, RolloutStatus.CANCELLED})


class RolloutErrorCategory(StrEnum):
    """Why a rollout failed."""

    TIMEOUT = "timeout"
    LEASE_EXPIRED = "lease_expired"
    VALIDATION_ERROR = "validation_error"
    HTTP_ERROR = "http_error"
    AGENT_ERROR = "agent_error"
    INTERNAL_ERROR = "internal_error"


class GraderStatus(StrEnum):
    """Outcome of the grading phase as reported by the 0.3.0 grader callback."""

    PENDING = "pending"
    SUCCESS = "success"
    FAILURE = "failure"


def categorize_exception(exc: BaseException) -> RolloutErrorCategory:
    """Map an exception raised by user code to an error category.

    ``TimeoutError`` is a timeout; ``ValueError``, ``TypeError`` and ``AssertionError`` are
    validation errors; an HTTP status error or a transport error from httpx is an HTTP error;
    everything else is an agent error.
    """
    if isinstance(exc, TimeoutError):
        return RolloutErrorCategory.TIMEOUT
    if isinstance(exc, (ValueError, TypeError, AssertionError)):
        return RolloutErrorCategory.VALIDATION_ERROR
    if _is_http_error(exc):
        return RolloutErrorCategory.HTTP_ERROR
    return RolloutErrorCategory.AGENT_ERROR


def _is_http_error(exc: BaseException) -> bool:
    # Match by class name along the MRO so that no HTTP library has to be imported here:
    # httpx.HTTPError (status and transport errors) and the openai SDK's APIError family.
    names = {cls.__name__ for cls in type(exc).__mro__}
    modules = {cls.__module__.split(".")[0] for cls in type(exc).__mro__}
    if "HTTPError" in names and "httpx" in modules:
        return True
    return bool({"APIError", "APIConnectionError"} & names and "openai" in modules)
