"""Stopping a run cleanly: the first Ctrl-C (or SIGTERM) asks the run to finish its step
and save; a second one raises ``KeyboardInterrupt`` at once. Plus :class:`Background`, a
thread whose error is re-raised where it is waited for.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType, TracebackType
from typing import Any


class StopRequest:
    """A flag set by the first SIGINT/SIGTERM while installed (main thread only), or by
    setting ``external`` (a caller that handles signals itself, e.g. a platform worker)."""

    def __init__(
        self,
        on_request: Callable[[int], None] | None = None,
        external: threading.Event | None = None,
    ) -> None:
        self._requested = False
        self.on_request = on_request
        self.external = external
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self._requested or (self.external is not None and self.external.is_set())

    def request(self) -> None:
        """Ask for the stop from code (as the first signal would, without its callback)."""
        self._requested = True

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._requested:
            raise KeyboardInterrupt
        self._requested = True
        if self.on_request is not None:
            self.on_request(signum)


class Background:
    """Runs ``call`` in a daemon thread; :meth:`wait` re-raises its error in the caller."""

    def __init__(self, call: Callable[[], object]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as exc:
            self._error = exc

    def wait(self, *, raise_error: bool = True) -> None:
        self._thread.join()
        if raise_error and self._error is not None:
            raise self._error
