"""``create_rollout_server``: a FastAPI app serving an execution backend over HTTP.

Both protocol generations share one ``POST /rollout``: a body naming
``completion_callback_url`` runs the callback generation (202 ``{}``, then completion and
grader callbacks); any other body runs the polling generation (202 with a lease, then
``GET /rollout/{id}/result`` long-polls). Status, cancel and health serve both.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any

from osmosis_ai.errors import MissingExtraError

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
except ModuleNotFoundError as _exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError("server", "osmosis_ai.rollout.server", _exc.name) from _exc

from pydantic import ValidationError

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.rollout.asgi import ASGIApp, Receive, Scope, Send, read_body, send_body
from osmosis_ai.rollout.backend.base import ExecutionBackend
from osmosis_ai.rollout.http import aclose_shared_transport
from osmosis_ai.rollout.protocol import (
    POLLING_LEASE_HEADER,
    CancelRolloutsRequest,
    RolloutInitRequest,
)
from osmosis_ai.rollout.server.execution import RolloutRunner
from osmosis_ai.rollout.server.guard import GuardMiddleware
from osmosis_ai.rollout.server.registry import DuplicateRolloutError, Registry
from osmosis_ai.rollout.server.workers import WorkerRouter
from osmosis_ai.rollout.status import RolloutStatus

logger = logging.getLogger("osmosis_ai.rollout.server")

DEFAULT_RESULT_WAIT_TIMEOUT_SEC = 30.0
DEFAULT_POLLING_LEASE_TIMEOUT_SEC = 120.0
DEFAULT_RESULT_RETENTION_SEC = 900.0
DEFAULT_DRAIN_TIMEOUT_SEC = 10.0
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
API_KEY_ENV = "OSMOSIS_ROLLOUT_SERVER_API_KEY"
INSTANCE_ID_ENV = "_OSMOSIS_ROLLOUT_INSTANCE_ID"
RETRY_AFTER_SEC = 5

Lifespan = Callable[[FastAPI], contextlib.AbstractAsyncContextManager[Any]]


def create_rollout_server(
    *,
    backend: ExecutionBackend,
    lifespan: Lifespan | None = None,
    configure_logging: bool = True,
    result_wait_timeout_sec: float = DEFAULT_RESULT_WAIT_TIMEOUT_SEC,
    polling_lease_timeout_sec: float = DEFAULT_POLLING_LEASE_TIMEOUT_SEC,
    result_retention_sec: float = DEFAULT_RESULT_RETENTION_SEC,
    api_key: str | None = None,
    drain_timeout_sec: float = DEFAULT_DRAIN_TIMEOUT_SEC,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    save_trajectories: bool = True,
) -> FastAPI:
    """Build the rollout server for ``backend``.

    Args:
        backend: runs each admitted rollout.
        lifespan: the caller's own lifespan, entered around the server's.
        configure_logging: install INFO logging when the process has no handlers.
        result_wait_timeout_sec: how long one result poll blocks without a status change.
        polling_lease_timeout_sec: how long a polling rollout survives without a poll;
            must exceed ``result_wait_timeout_sec``.
        result_retention_sec: how long a finished rollout's result stays readable.
        api_key: require ``Authorization: Bearer <api_key>`` on every path. Defaults to
            ``$OSMOSIS_ROLLOUT_SERVER_API_KEY``; unset means no auth.
        drain_timeout_sec: on shutdown, how long running rollouts may finish before they
            are cancelled.
        max_body_bytes: larger request bodies get 413.
        save_trajectories: write ``trajectory.json`` per rollout under the artifact root.
    """
    _check_timeouts(result_wait_timeout_sec, polling_lease_timeout_sec, result_retention_sec)
    if api_key is None:
        api_key = os.environ.get(API_KEY_ENV) or None
    elif not api_key.strip():
        raise ValueError("api_key must be a non-blank string, or None to disable auth")
    if configure_logging and not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        # One line per model call would drown the rollout's own messages.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    process_id = uuid.uuid4().hex
    instance_id = os.environ.get(INSTANCE_ID_ENV) or process_id
    state = _ServerState()
    runner_box: list[RolloutRunner] = []

    def runner() -> RolloutRunner:
        return runner_box[0]

    @contextlib.asynccontextmanager
    async def server_lifespan(app: FastAPI) -> AsyncGenerator[None]:
        registry = Registry(
            polling_lease_timeout_sec=polling_lease_timeout_sec,
            result_retention_sec=result_retention_sec,
            on_lease_expired=lambda entry: runner().stop_execution(entry),
        )
        # No callback client yet: the runner makes it on first use, keeping aiohttp's
        # import out of the start-up.
        runner_box.append(RolloutRunner(backend, registry, save_trajectories=save_trajectories))
        state.accepting = True
        try:
            if lifespan is None:
                yield
            else:
                async with lifespan(app):
                    yield
        finally:
            state.accepting = False
            await runner().drain(drain_timeout_sec)
            await runner().aclose()
            await backend.shutdown()
            await aclose_shared_transport()
            runner_box.clear()

    async def submit(body: bytes) -> _Answer:
        try:
            init = RolloutInitRequest.model_validate_json(body)
        except ValidationError as exc:
            return _validation_error(exc)
        if not state.accepting:
            return _json_answer(503, {"detail": "rollout server is shutting down"})
        if not backend.has_capacity():
            return _json_answer(
                429,
                {"detail": "rollout queue is full; retry later"},
                [(b"retry-after", str(RETRY_AFTER_SEC).encode())],
            )
        try:
            admitted = runner().start(init)
        except DuplicateRolloutError:
            return _json_answer(409, {"detail": "rollout_id is already registered"})
        if admitted.lease is None:
            return _Answer(202, b"{}")
        lease = {
            "rollout_id": admitted.rollout_id,
            "status": RolloutStatus.QUEUED.value,
            "polling_lease_token": admitted.lease,
            "result_wait_timeout_sec": result_wait_timeout_sec,
            "polling_lease_timeout_sec": polling_lease_timeout_sec,
        }
        return _json_answer(202, lease)

    async def result(rollout_id: str, token: str | None) -> _Answer:
        if not token:
            missing = {
                "type": "missing",
                "loc": ["header", POLLING_LEASE_HEADER],
                "msg": f"the {POLLING_LEASE_HEADER} header is required",
            }
            return _json_answer(422, {"detail": [missing]})
        entry = runner().registry.entries.get(rollout_id)
        if entry is None or entry.generation != "polling":
            return _json_answer(404, {"detail": "unknown rollout_id"})
        if not runner().registry.lease_matches(entry, token):
            return _json_answer(403, {"detail": "invalid polling lease"})
        return _Answer(200, await runner().registry.poll(entry, result_wait_timeout_sec))

    app = FastAPI(title="osmosis rollout server", version=PACKAGE_VERSION, lifespan=server_lifespan)
    # Innermost first: the guard (auth, body cap) wraps the worker router (which sends a
    # rollout's calls to the worker process owning it, when there are several), which wraps
    # the raw fast path of the two calls every rollout makes, skipping FastAPI's routing;
    # other middleware wraps them all.
    app.add_middleware(_HotRoutes, submit=submit, result=result)
    app.add_middleware(WorkerRouter)
    app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes)

    # The FastAPI routes of the same two calls answer when the fast path does not apply
    # (a mounted app) and document them in the OpenAPI schema.

    @app.post("/rollout", status_code=202)
    async def submit_rollout(request: Request) -> Response:
        """Admit a rollout (either generation)."""
        return (await submit(await request.body())).response()

    # Routes take the bare Request and answer with a Response: a typed parameter or return
    # value would have FastAPI build pydantic fields (and import pydantic.v1) at start-up.

    @app.get("/rollout/{rollout_id}/result")
    async def rollout_result(request: Request) -> Response:
        """Long-poll a polling-generation rollout with its lease."""
        token = request.headers.get(POLLING_LEASE_HEADER)
        return (await result(request.path_params["rollout_id"], token)).response()

    @app.get("/rollout/{rollout_id}/status")
    async def rollout_status(request: Request) -> Response:
        """Current status of a rollout of either generation (``unknown`` if never seen)."""
        return JSONResponse(runner().status(request.path_params["rollout_id"]))

    @app.post("/rollout/cancel")
    async def cancel_rollouts(request: Request) -> Response:
        """Cancel by ``ids``, ``prefix`` or ``all`` (exactly one)."""
        try:
            cancel = CancelRolloutsRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            return _validation_error(exc).response()
        dispositions = runner().cancel(cancel.ids, cancel.prefix, cancel.all)
        return JSONResponse({"dispositions": dispositions})

    @app.get("/health")
    async def health() -> Response:
        """Backend health, capacity, identity and admission state."""
        body = dict(backend.health())
        body["instance_id"] = instance_id
        body["process_id"] = process_id
        body["lifecycle"] = {
            "accepting_rollouts": state.accepting,
            "active_rollouts": runner().registry.active if runner_box else 0,
        }
        return JSONResponse(
            body,
            headers={
                "x-osmosis-rollout-instance-id": instance_id,
                "x-osmosis-rollout-sdk-version": PACKAGE_VERSION,
            },
        )

    app.state.osmosis_process_id = process_id
    return app


class _Answer:
    """A JSON answer, served as a FastAPI ``Response`` or straight over ASGI."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers

    def response(self) -> Response:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in self.headers}
        return Response(self.body, self.status, headers, media_type="application/json")

    async def send(self, send: Send) -> None:
        await send_body(send, self.status, self.body, self.headers)


def _json_answer(
    status: int, value: object, headers: Sequence[tuple[bytes, bytes]] = ()
) -> _Answer:
    body = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    return _Answer(status, body, headers)


_RESULT_PREFIX, _RESULT_SUFFIX = "/rollout/", "/result"


class _HotRoutes:
    """ASGI middleware that answers ``POST /rollout`` and ``GET /rollout/{id}/result``
    itself, skipping the router, dependency solving and request objects: every rollout
    makes these calls, and FastAPI's layers cost more than the work behind them."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        submit: Callable[[bytes], Awaitable[_Answer]],
        result: Callable[[str, str | None], Awaitable[_Answer]],
    ) -> None:
        self.app = app
        self.submit = submit
        self.result = result
        self.lease_header = POLLING_LEASE_HEADER.lower().encode("latin-1")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope.get("root_path"):
            path, method = scope["path"], scope["method"]
            if method == "POST" and path == "/rollout":
                body = await read_body(receive)
                if body is not None:  # else the client hung up: nobody to answer
                    await (await self.submit(body)).send(send)
                return
            if (
                method == "GET"
                and path.startswith(_RESULT_PREFIX)
                and path.endswith(_RESULT_SUFFIX)
                and "/" not in (rollout_id := path[len(_RESULT_PREFIX) : -len(_RESULT_SUFFIX)])
                and rollout_id
            ):
                token = None
                for name, value in scope["headers"]:
                    if name == self.lease_header:
                        token = value.decode("latin-1")
                        break
                await (await self.result(rollout_id, token)).send(send)
                return
        await self.app(scope, receive, send)


class _ServerState:
    def __init__(self) -> None:
        self.accepting = False
        self.started_at = time.time()


def _check_timeouts(wait: float, lease: float, retention: float) -> None:
    import math

    if not (math.isfinite(wait) and wait > 0):
        raise ValueError(f"result_wait_timeout_sec must be a finite number > 0, got {wait!r}")
    if not (math.isfinite(lease) and lease > wait):
        raise ValueError(
            f"polling_lease_timeout_sec must be finite and greater than result_wait_timeout_sec "
            f"({wait!r}), got {lease!r}"
        )
    if not (math.isfinite(retention) and retention >= 0):
        raise ValueError(f"result_retention_sec must be a finite number >= 0, got {retention!r}")


def _clean(message: str) -> str:
    return message.removeprefix("Value error, ")


def _validation_error(exc: ValidationError) -> _Answer:
    # Inputs are not echoed back: a body may carry API keys.
    detail = [
        {"type": err["type"], "loc": ["body", *err["loc"]], "msg": _clean(err["msg"])}
        for err in exc.errors(include_url=False, include_input=False)
    ]
    return _json_answer(422, {"detail": detail})
