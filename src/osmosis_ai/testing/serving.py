"""Run an ASGI app on a free loopback port: in a background thread, or as a task.

Both shapes bind 127.0.0.1 only and wait until the socket accepts connections before
returning, so callers can use ``.url`` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncGenerator
from types import TracebackType
from typing import Any

from osmosis_ai.errors import MissingExtraError
from osmosis_ai.procs import LOOPBACK, free_port

__all__ = ["LOOPBACK", "ServerThread", "free_port", "serve_in_task"]


def _uvicorn() -> Any:
    try:
        import uvicorn
    except ModuleNotFoundError as exc:
        raise MissingExtraError("server", "serving an app", exc.name) from exc
    return uvicorn


def _config(app: Any, port: int, **uvicorn_options: Any) -> Any:
    uvicorn = _uvicorn()
    options: dict[str, Any] = {
        "log_level": "warning",
        "lifespan": "on",
        "timeout_graceful_shutdown": 5,
    }
    options.update(uvicorn_options)
    return uvicorn.Config(app, host=LOOPBACK, port=port, **options)


class ServerThread:
    """An ASGI app served by uvicorn in a daemon thread with its own event loop.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, app: Any, *, port: int | None = None, **uvicorn_options: Any) -> None:
        self.app = app
        self.port = port or free_port()
        self._server = _uvicorn().Server(_config(app, self.port, **uvicorn_options))
        self._thread = threading.Thread(target=self._server.run, name="osmosis-serve", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self, timeout: float = 20.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"server on port {self.port} exited during start-up")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on port {self.port} did not start in {timeout}s")
            time.sleep(0.005)
        return self

    def stop(self, timeout: float = 15.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.asynccontextmanager
async def serve_in_task(
    app: Any, *, port: int | None = None, **uvicorn_options: Any
) -> AsyncGenerator[str]:
    """Serve ``app`` on the running event loop; yields the base URL."""
    chosen = port or free_port()
    server = _uvicorn().Server(_config(app, chosen, **uvicorn_options))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError(f"server on port {chosen} exited during start-up")
            await asyncio.sleep(0.005)
        yield f"http://{LOOPBACK}:{chosen}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, timeout=30)
