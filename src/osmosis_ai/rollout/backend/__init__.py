"""Execution backends: the ABC and the in-process ``LocalBackend``."""

from osmosis_ai.rollout.backend.base import ExecutionBackend, ResultCallback
from osmosis_ai.rollout.backend.local import LocalBackend

__all__ = ["ExecutionBackend", "LocalBackend", "ResultCallback"]
