"""``ControllerService``: the policy proxy and the callback listener on one loopback port.

One ASGI app, served by uvicorn as a task on the running loop, bound to 127.0.0.1 only. The
proxy and the listener keep separate random bearers, so a rollout's model key cannot forge
its callbacks (reference §2.6).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import secrets
import socket
from collections.abc import Generator
from types import TracebackType
from typing import Any
from urllib.parse import quote

from osmosis_ai.controller.errors import ControllerError
from osmosis_ai.controller.listener import ROUTE_PREFIX, CallbackListener
from osmosis_ai.controller.proxy import PolicyProxy
from osmosis_ai.errors import MissingExtraError, UsageError
from osmosis_ai.rollout.asgi import Receive, Scope, Send, lifespan

__all__ = ["LOOPBACK", "ControllerService", "ControllerServiceError"]

LOOPBACK = "127.0.0.1"
_CALLBACK_SUFFIXES = ("/completion", "/grader")
_STOP_GRACE_SEC = 5.0


class ControllerServiceError(ControllerError):
    """The controller service could not start: its port is taken, or uvicorn failed."""


class ControllerService:
    """Serves ``proxy`` (``/v1/rollouts/{id}/chat/completions``, ``/responses``,
    ``/messages``, ``/models``) and a :class:`CallbackListener`
    (``/v1/rollouts/{id}/completion``, ``/grader``) together.

    Args:
        proxy: the policy proxy; its :attr:`~PolicyProxy.token` is the model bearer.
        controller_token: the callback bearer (random when ``None``); must differ from the
            proxy's token.
        port: the port to bind on 127.0.0.1 (``None``: an ephemeral one).
        host: the address to bind and hand to rollout servers: 127.0.0.1, or this machine's
            cluster address when rollout servers run on other machines (a Ray fleet).
    """

    def __init__(
        self,
        proxy: PolicyProxy,
        *,
        controller_token: str | None = None,
        port: int | None = None,
        host: str = LOOPBACK,
    ) -> None:
        token = controller_token if controller_token is not None else secrets.token_urlsafe(32)
        if token == proxy.token:
            raise UsageError(
                "controller_token equals the proxy token: the callback bearer must differ from "
                "the model bearer (pass None for a random one)"
            )
        self.proxy = proxy
        self.listener = CallbackListener(token=token)
        # Servers of the first 0.3.0 releases send controller_api_key on model calls too (they
        # predate llm_api_key); that bearer is theirs already, so accepting it grants nothing.
        proxy.also_accept(token)
        self.requested_port = port
        self.host = host
        self._port: int | None = None
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    # -- tokens and URLs -------------------------------------------------------------------

    @property
    def proxy_token(self) -> str:
        """Bearer agents send to the chat endpoint (``llm_api_key``)."""
        return self.proxy.token

    @property
    def controller_token(self) -> str:
        """Bearer rollout servers send with callbacks (``controller_api_key``)."""
        return self.listener.token

    @property
    def port(self) -> int:
        if self._port is None:
            raise UsageError("the controller service is not running: call start() first")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:<port>`` while the service runs."""
        return f"http://{self.host}:{self.port}"

    def chat_completions_url(self, rollout_id: str) -> str:
        """The rollout's OpenAI base URL, ``<base>/v1/rollouts/<id>`` (agents append
        ``/chat/completions``)."""
        return self.proxy.chat_base_url(rollout_id, self.base_url)

    def completion_url(self, rollout_id: str) -> str:
        """``<base>/v1/rollouts/<id>/completion``."""
        return f"{self._rollout_base(rollout_id)}/completion"

    def grader_url(self, rollout_id: str) -> str:
        """``<base>/v1/rollouts/<id>/grader``."""
        return f"{self._rollout_base(rollout_id)}/grader"

    def _rollout_base(self, rollout_id: str) -> str:
        return f"{self.base_url}{ROUTE_PREFIX}{quote(rollout_id, safe='')}"

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            if path.startswith(ROUTE_PREFIX) and path.endswith(_CALLBACK_SUFFIXES):
                await self.listener(scope, receive, send)
            else:
                await self.proxy(scope, receive, send)
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> ControllerService:
        """Bind 127.0.0.1 and serve on the running loop; returns once connections are taken."""
        if self._task is not None:
            raise UsageError("the controller service is already running")
        sock = _bind(self.host, self.requested_port)
        port = int(sock.getsockname()[1])
        server = _server(self, self.host, port)
        task = asyncio.create_task(server.serve(sockets=[sock]), name="osmosis-controller")
        while not server.started:
            if task.done():
                sock.close()
                exc = None if task.cancelled() else task.exception()
                raise ControllerServiceError(
                    f"the controller service on {self.host}:{port} exited during start-up: {exc!r}"
                ) from exc
            await asyncio.sleep(0.005)
        self._server, self._task, self._port = server, task, port
        return self

    async def stop(self) -> None:
        """Stop serving (idempotent): in-flight requests get a short grace, then are cut."""
        server, task = self._server, self._task
        self._server = self._task = self._port = None
        if server is None or task is None:
            return
        server.should_exit = True
        _done, pending = await asyncio.wait({task}, timeout=_STOP_GRACE_SEC + 1.0)
        if pending:
            server.force_exit = True
            _done, pending = await asyncio.wait({task}, timeout=1.0)
        if pending:
            task.cancel()
            await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            raise ControllerServiceError("the controller service failed") from task.exception()

    async def __aenter__(self) -> ControllerService:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def _bind(host: str, port: int | None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port or 0))
    except OSError as exc:
        sock.close()
        taken = exc.errno == errno.EADDRINUSE
        raise ControllerServiceError(
            f"cannot bind the controller service to {host}:{port}: "
            + (
                "the port is already in use; pick another port or omit it for an ephemeral one"
                if taken
                else str(exc)
            )
        ) from exc
    return sock


def _server(app: ControllerService, host: str, port: int) -> Any:
    try:
        import uvicorn
    except ModuleNotFoundError as exc:
        raise MissingExtraError("server", "ControllerService", exc.name) from exc

    class _EmbeddedServer(uvicorn.Server):
        # The embedding program owns SIGINT/SIGTERM: uvicorn must not capture them.
        @contextlib.contextmanager
        def capture_signals(self) -> Generator[None]:
            yield

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="off",
        ws="none",  # no websocket routes; loading a ws library would slow eval run's start-up
        log_config=None,
        log_level="warning",
        access_log=False,
        proxy_headers=False,  # loopback only: no forwarded-for to trust, and one layer less
        timeout_keep_alive=75,  # outlive clients' keep-alive so reuse never races a close
        timeout_graceful_shutdown=int(_STOP_GRACE_SEC),
    )
    return _EmbeddedServer(config)
