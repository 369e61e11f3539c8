"""``create_rollout_server``: a FastAPI app serving an execution backend over HTTP.

Both protocol generations share one ``POST /rollout``: a body naming
``completion_callback_url`` runs the callback generation (202 ``{}``, then completion and
grader callbacks); any other body runs the polling generation (202 with a lease, then
``GET /rollout/{id}/result`` long-polls). Status, cancel and health serve both.

A polling ``POST /rollout`` sent again byte for byte while its rollout is held (a resend
after a lost answer) is answered as the first was, lease included; another body for a held
id gets 409. Only a body carrying an ``llm_api_key`` (the controller's secret) may be
replayed: having the whole body, that key included, proves the sender is the one who sent it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from typing import Any, cast

from osmosis_ai.errors import MissingExtraError, UsageError

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response
except ModuleNotFoundError as _exc:  # pragma: no cover - depends on the environment
    raise MissingExtraError("server", "osmosis_ai.rollout.server", _exc.name) from _exc

from pydantic import ValidationError

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.rollout.asgi import (
    JSON_ENCODER,
    ASGIApp,
    Receive,
    Scope,
    Send,
    read_body,
    send_body,
)
from osmosis_ai.rollout.backend.base import ExecutionBackend
from osmosis_ai.rollout.http import aclose_shared_transport
from osmosis_ai.rollout.protocol import (
    POLLING_LEASE_HEADER,
    CancelRolloutsRequest,
    RolloutInitRequest,
)
from osmosis_ai.rollout.server.execution import RolloutRunner
from osmosis_ai.rollout.server.guard import GuardMiddleware
from osmosis_ai.rollout.server.registry import DuplicateRolloutError, Entry, Registry
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


class ServerOptionError(UsageError, ValueError):
    """An option of the rollout server is invalid (also a ``ValueError``, as it always was)."""


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

    The app serves rollouts between the start and the end of its lifespan. Mounted in
    another app, which does not run a mounted app's lifespan, it needs the outer app to
    enter it: ``FastAPI(lifespan=lambda _: app.router.lifespan_context(app))``.

    Raises:
        ServerOptionError: an option is out of range (the message names it and its value).
    """
    _check_options(
        backend=backend,
        lifespan=lifespan,
        wait=result_wait_timeout_sec,
        lease=polling_lease_timeout_sec,
        retention=result_retention_sec,
        drain=drain_timeout_sec,
        max_body_bytes=max_body_bytes,
    )
    if api_key is None:
        api_key = os.environ.get(API_KEY_ENV) or None
    elif not isinstance(cast(object, api_key), str) or not api_key.strip():
        got = "a blank string" if isinstance(cast(object, api_key), str) else type(api_key).__name__
        # (the value itself is not shown: it may be a secret)
        raise ServerOptionError(
            f"api_key must be a non-blank string, or None to disable auth; got {got}"
        )
    if configure_logging and not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
        # One line per model call would drown the rollout's own messages.
        logging.getLogger("httpx").setLevel(logging.WARNING)
    server = RolloutServer(
        backend,
        lifespan=lifespan,
        result_wait_timeout_sec=result_wait_timeout_sec,
        polling_lease_timeout_sec=polling_lease_timeout_sec,
        result_retention_sec=result_retention_sec,
        drain_timeout_sec=drain_timeout_sec,
        save_trajectories=save_trajectories,
    )
    return server.app(api_key=api_key, max_body_bytes=max_body_bytes)


class RolloutServer:
    """One rollout server: what it holds while it serves, and the handlers of its routes.

    The registry and the runner exist from the start of the app's lifespan to its end;
    outside it, calls that need them get 503 saying why.
    """

    def __init__(
        self,
        backend: ExecutionBackend,
        *,
        lifespan: Lifespan | None,
        result_wait_timeout_sec: float,
        polling_lease_timeout_sec: float,
        result_retention_sec: float,
        drain_timeout_sec: float,
        save_trajectories: bool,
    ) -> None:
        self.backend = backend
        self.user_lifespan = lifespan
        self.result_wait_timeout_sec = result_wait_timeout_sec
        self.polling_lease_timeout_sec = polling_lease_timeout_sec
        self.result_retention_sec = result_retention_sec
        self.drain_timeout_sec = drain_timeout_sec
        self.save_trajectories = save_trajectories
        self.process_id = uuid.uuid4().hex
        self.instance_id = os.environ.get(INSTANCE_ID_ENV) or self.process_id
        self.runner: RolloutRunner | None = None
        self.accepting = False
        self.stopped = False

    def app(self, *, api_key: str | None, max_body_bytes: int) -> FastAPI:
        """The FastAPI app serving this server."""
        app = FastAPI(
            title="osmosis rollout server", version=PACKAGE_VERSION, lifespan=self.lifespan
        )
        # Innermost first: the guard (auth, body cap) wraps the worker router (which sends a
        # rollout's calls to the worker process owning it, when there are several), which
        # wraps the raw fast path of the two calls every rollout makes, skipping FastAPI's
        # routing; other middleware wraps them all.
        app.add_middleware(_HotRoutes, server=self)
        app.add_middleware(WorkerRouter)
        app.add_middleware(GuardMiddleware, api_key=api_key, max_body_bytes=max_body_bytes)
        # The FastAPI routes of the same two calls answer when the fast path does not apply
        # (a root path, a mounted app) and document them in the OpenAPI schema. Routes take
        # the bare Request and answer with a Response: a typed parameter or return value
        # would have FastAPI build pydantic fields (and import pydantic.v1) at start-up.
        app.add_api_route("/rollout", self.submit_rollout, methods=["POST"], status_code=202)
        app.add_api_route("/rollout/{rollout_id}/result", self.rollout_result, methods=["GET"])
        app.add_api_route("/rollout/{rollout_id}/status", self.rollout_status, methods=["GET"])
        app.add_api_route("/rollout/cancel", self.cancel_rollouts, methods=["POST"])
        app.add_api_route("/health", self.health, methods=["GET"])
        app.state.osmosis_process_id = self.process_id
        return app

    # -- lifespan ------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lifespan(self, app: FastAPI) -> AsyncGenerator[None]:
        if self.runner is not None:
            raise UsageError(
                "this rollout server's lifespan is already running: enter it once (an app "
                "that mounts it enters it from its own lifespan, and must not serve it too)"
            )
        registry = Registry(
            polling_lease_timeout_sec=self.polling_lease_timeout_sec,
            result_retention_sec=self.result_retention_sec,
            on_lease_expired=self._lease_expired,
        )
        # No callback client yet: the runner makes it on first use, keeping aiohttp's
        # import out of the start-up.
        runner = RolloutRunner(self.backend, registry, save_trajectories=self.save_trajectories)
        self.runner, self.accepting, self.stopped = runner, True, False
        try:
            if self.user_lifespan is None:
                yield
            else:
                async with self.user_lifespan(app):
                    yield
        finally:
            self.accepting = False
            try:
                await runner.drain(self.drain_timeout_sec)
                await runner.aclose()
                await self.backend.shutdown()
                await aclose_shared_transport()
            finally:
                self.runner, self.stopped = None, True

    def _lease_expired(self, entry: Entry) -> None:
        if self.runner is not None:
            self.runner.stop_execution(entry)

    def _unavailable(self) -> _Answer:
        """503 for a call that needs the runner, or admission, outside the serving time."""
        if self.runner is not None or self.stopped:
            return _SHUTTING_DOWN
        return _NOT_STARTED

    # -- the hot calls (also served straight over ASGI by _HotRoutes) --------------------

    async def submit(self, body: bytes) -> _Answer:
        """``POST /rollout`` of either generation."""
        try:
            init = RolloutInitRequest.model_validate_json(body)
        except ValidationError as exc:
            return _validation_error(exc)
        runner = self.runner
        if runner is None:
            return self._unavailable()
        replayable = init.generation == "polling" and init.llm_api_key is not None
        if replayable and init.rollout_id is not None:
            # (a replay is no new admission: it is answered while draining or full too)
            token = runner.registry.replay(init.rollout_id, body)
            if token is not None:
                return self._admitted(init.rollout_id, token)
        if not self.accepting:
            return self._unavailable()
        if not self.backend.has_capacity():
            return _QUEUE_FULL
        try:
            admitted = runner.start(init, body=body if replayable else None)
        except DuplicateRolloutError:
            return _DUPLICATE
        if admitted.lease is None:
            return _CALLBACK_ADMITTED
        return self._admitted(admitted.rollout_id, admitted.lease)

    def _admitted(self, rollout_id: str, token: str) -> _Answer:
        """The 202 of a polling-generation admission (and of its replays)."""
        lease = {
            "rollout_id": rollout_id,
            "status": RolloutStatus.QUEUED.value,
            "polling_lease_token": token,
            "result_wait_timeout_sec": self.result_wait_timeout_sec,
            "polling_lease_timeout_sec": self.polling_lease_timeout_sec,
        }
        return _json_answer(202, lease)

    async def result(self, rollout_id: str, token: str | None) -> _Answer:
        """``GET /rollout/{rollout_id}/result``: a long poll with the rollout's lease."""
        if not token:
            return _MISSING_LEASE
        runner = self.runner
        if runner is None:
            return self._unavailable()
        registry = runner.registry
        entry = registry.entries.get(rollout_id)
        if entry is None or entry.generation != "polling":
            return _UNKNOWN_ROLLOUT
        if not registry.lease_matches(entry, token):
            return _INVALID_LEASE
        return _Answer(200, await registry.poll(entry, self.result_wait_timeout_sec))

    # -- the FastAPI routes --------------------------------------------------------------

    async def submit_rollout(self, request: Request) -> Response:
        """Admit a rollout (either generation)."""
        return (await self.submit(await request.body())).response()

    async def rollout_result(self, request: Request) -> Response:
        """Long-poll a polling-generation rollout with its lease."""
        token = request.headers.get(POLLING_LEASE_HEADER)
        return (await self.result(request.path_params["rollout_id"], token)).response()

    async def rollout_status(self, request: Request) -> Response:
        """Current status of a rollout of either generation (``unknown`` if never seen)."""
        if self.runner is None:
            return self._unavailable().response()
        return JSONResponse(self.runner.status(request.path_params["rollout_id"]))

    async def cancel_rollouts(self, request: Request) -> Response:
        """Cancel by ``ids``, ``prefix`` or ``all`` (exactly one)."""
        try:
            cancel = CancelRolloutsRequest.model_validate_json(await request.body())
        except ValidationError as exc:
            return _validation_error(exc).response()
        if self.runner is None:
            return self._unavailable().response()
        dispositions = self.runner.cancel(cancel.ids, cancel.prefix, cancel.all)
        return JSONResponse({"dispositions": dispositions})

    async def health(self) -> Response:
        """Backend health, capacity, identity and admission state."""
        body = dict(self.backend.health())
        body["instance_id"] = self.instance_id
        body["process_id"] = self.process_id
        body["lifecycle"] = {
            "accepting_rollouts": self.accepting,
            "active_rollouts": 0 if self.runner is None else self.runner.registry.active,
        }
        return JSONResponse(
            body,
            headers={
                "x-osmosis-rollout-instance-id": self.instance_id,
                "x-osmosis-rollout-sdk-version": PACKAGE_VERSION,
            },
        )


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
    return _Answer(status, JSON_ENCODER.encode(value).encode(), headers)


# The fixed answers (their wording is the protocol's, reference §2.1 and protocol §1.4).
_CALLBACK_ADMITTED = _Answer(202, b"{}")
_QUEUE_FULL = _json_answer(
    429,
    {"detail": "rollout queue is full; retry later"},
    [(b"retry-after", str(RETRY_AFTER_SEC).encode())],
)
_DUPLICATE = _json_answer(409, {"detail": "rollout_id is already registered"})
_UNKNOWN_ROLLOUT = _json_answer(404, {"detail": "unknown rollout_id"})
_INVALID_LEASE = _json_answer(403, {"detail": "invalid polling lease"})
_MISSING_LEASE = _json_answer(
    422,
    {
        "detail": [
            {
                "type": "missing",
                "loc": ["header", POLLING_LEASE_HEADER],
                "msg": f"the {POLLING_LEASE_HEADER} header is required",
            }
        ]
    },
)
_SHUTTING_DOWN = _json_answer(503, {"detail": "rollout server is shutting down"})
_NOT_STARTED = _json_answer(
    503,
    {
        "detail": "rollout server has not started: its lifespan has not run. An app that "
        "mounts it must enter it from its own lifespan: "
        "FastAPI(lifespan=lambda _: rollout_app.router.lifespan_context(rollout_app))"
    },
)

_RESULT_PREFIX, _RESULT_SUFFIX = "/rollout/", "/result"


class _HotRoutes:
    """ASGI middleware that answers ``POST /rollout`` and ``GET /rollout/{id}/result``
    itself, skipping the router, dependency solving and request objects: every rollout
    makes these calls, and FastAPI's layers cost more than the work behind them."""

    def __init__(self, app: ASGIApp, *, server: RolloutServer) -> None:
        self.app = app
        self.submit = server.submit
        self.result = server.result
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


def _check_options(
    *,
    backend: object,
    lifespan: object,
    wait: float,
    lease: float,
    retention: float,
    drain: float,
    max_body_bytes: int,
) -> None:
    if not isinstance(backend, ExecutionBackend):
        what = f"the class {backend.__name__}" if isinstance(backend, type) else _shown(backend)
        raise ServerOptionError(
            f"backend must be an ExecutionBackend instance, got {what}: pass an instance, "
            "such as LocalBackend(workflow=MyWorkflow, grader=MyGrader)"
        )
    if lifespan is not None and not callable(lifespan):
        raise ServerOptionError(
            f"lifespan must be a callable taking the app and returning an async context "
            f"manager, or None; got {_shown(lifespan)}"
        )
    if not (_is_number(wait) and math.isfinite(wait) and wait > 0):
        raise ServerOptionError(
            f"result_wait_timeout_sec must be a finite number > 0, got {_shown(wait)}"
        )
    if not (_is_number(lease) and math.isfinite(lease) and lease > wait):
        raise ServerOptionError(
            f"polling_lease_timeout_sec must be finite and greater than result_wait_timeout_sec "
            f"({wait!r}), got {_shown(lease)}"
        )
    if not (_is_number(retention) and math.isfinite(retention) and retention >= 0):
        raise ServerOptionError(
            f"result_retention_sec must be a finite number >= 0, got {_shown(retention)}"
        )
    if not (_is_number(drain) and math.isfinite(drain) and drain >= 0):
        raise ServerOptionError(
            f"drain_timeout_sec must be a finite number >= 0, got {_shown(drain)}"
        )
    size = cast(object, max_body_bytes)
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ServerOptionError(
            f"max_body_bytes must be a whole number of bytes >= 1, got {_shown(size)}"
        )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """``value`` for an error message: its repr, with its type when that is not plain."""
    if value is None or isinstance(value, bool | int | float):
        return repr(value)
    return f"{type(value).__name__} {value!r}"[:200]


def _clean(message: str) -> str:
    return message.removeprefix("Value error, ")


def _validation_error(exc: ValidationError) -> _Answer:
    # Inputs are not echoed back: a body may carry API keys.
    detail = [
        {"type": err["type"], "loc": ["body", *err["loc"]], "msg": _clean(err["msg"])}
        for err in exc.errors(include_url=False, include_input=False)
    ]
    return _json_answer(422, {"detail": detail})
