"""One rollout app served by several worker processes on one port.

A Python process runs one core's worth of workflow code, and agent frameworks spend
milliseconds of CPU on every model call. ``run_rollout_server(app, workers=N)`` forks N
copies of the process that built the app; they accept connections on one shared listening
socket, each with its own registry and backend.

Each rollout belongs to one worker, picked from its id (``crc32(rollout_id) % N``), so a
controller may send a rollout's calls on any connection: a ``POST /rollout`` or a
``GET /rollout/{id}/result|status`` that lands on another worker is forwarded over loopback
to the owner's private listener, marked with a secret of the run so the owner serves it
itself. ``POST /rollout/cancel`` and ``GET /health`` ask every worker and merge the answers
(see :func:`merge_health` for which fields of a health body add up). A forwarded request
whose kept-alive connection closes before the owner answers is sent again when that is
harmless: a GET, or a polling ``POST /rollout`` the owner answers again as a replay (see
:mod:`osmosis_ai.rollout.server.app`); anything else answers 503.

The parent only supervises: ``SIGINT``/``SIGTERM`` reach every worker, each drains its own
rollouts, and a worker that dies on its own stops the rest (its rollouts are gone, and a
controller is better told by a dead server than by a half of one). A worker whose parent
is gone (``kill -9``) stops itself. Backend limits such as ``max_concurrent`` apply per
worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import hmac
import json
import logging
import os
import re
import secrets
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
import zlib
from collections.abc import Mapping
from typing import Any, cast
from urllib.parse import quote

import httpx

from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.asgi import (
    JSON_ENCODER,
    ASGIApp,
    Message,
    Receive,
    Scope,
    Send,
    read_body,
    send_body,
)
from osmosis_ai.rollout.http1 import LeanTransport, QuickAnswer

__all__ = [
    "WORKERS_ENV",
    "WorkerRouter",
    "WorkerSet",
    "merge_health",
    "resolve_workers",
    "serve_workers",
]

logger = logging.getLogger("osmosis_ai.rollout.server")

WORKERS_ENV = "OSMOSIS_ROLLOUT_WORKERS"
FORWARDED_HEADER = "x-osmosis-rollout-worker"
_FORWARDED = FORWARDED_HEADER.encode("latin-1")
# Not passed on: the hop's own framing, and what the forwarding request sets itself.
_HOP_REQUEST = frozenset(
    {
        b"host",
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"accept-encoding",
        b"te",
        b"upgrade",
        b"expect",
        b"proxy-connection",
        _FORWARDED,
    }
)
# The hop's framing, what this server's own answer adds, and what send_body sets.
_HOP_ANSWER = frozenset(
    {
        "content-length",
        "content-type",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "date",
        "server",
    }
)
# A long poll waits as long as the owner makes it; only the connection itself is bounded.
_TIMEOUTS: Mapping[str, float | None] = {"connect": 10.0, "pool": None, "read": None}
_PARENT_CHECK_SEC = 0.5


@dataclasses.dataclass(frozen=True)
class WorkerSet:
    """This process's place among the workers of one server."""

    index: int
    origins: tuple[str, ...]
    """``http://127.0.0.1:<port>`` of each worker's private listener, by index."""
    secret: str
    """Marks a request one worker forwarded to another."""
    root_path: str = ""
    """uvicorn's ``root_path``: it prefixes every request's path, forwarded ones too."""

    @property
    def count(self) -> int:
        return len(self.origins)

    def owner(self, rollout_id: str) -> int:
        """The index of the worker that runs ``rollout_id`` (the same in every process)."""
        return zlib.crc32(rollout_id.encode("utf-8", "surrogatepass")) % len(self.origins)


class _Serving:
    workers: WorkerSet | None = None
    """Set in a worker process before it serves."""


def resolve_workers(workers: int | None = None) -> int:
    """``workers``, else ``$OSMOSIS_ROLLOUT_WORKERS`` (a number, or ``auto`` for one per
    CPU), else 1."""
    if workers is None:
        raw = os.environ.get(WORKERS_ENV, "").strip()
        if not raw:
            return 1
        if raw.lower() == "auto":
            return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1)
        try:
            workers = int(raw)
        except ValueError:
            raise UsageError(
                f"{WORKERS_ENV}={raw!r} is not a number of workers: set a whole number >= 1 "
                "or 'auto' (one per CPU)"
            ) from None
        source = f"{WORKERS_ENV}={raw!r}"
    else:
        source = f"workers={workers!r}"
    value = cast(object, workers)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"{source} is not a number of workers: use a whole number >= 1")
    return value


# -- the worker processes -----------------------------------------------------------------------


def serve_workers(app: Any, *, host: str, port: int, workers: int, options: dict[str, Any]) -> None:
    """Fork ``workers`` uvicorn servers of ``app`` on ``host:port``; return when all stop.

    Raises ``SystemExit`` with a worker's exit code when one of them died on its own.
    """
    import uvicorn

    _check_forkable(app, workers)
    config = uvicorn.Config(app, host=host, port=port, **options)
    listener = _listen(host, port, config.backlog)
    privates = [
        socket.create_server(("127.0.0.1", 0), backlog=config.backlog) for _ in range(workers)
    ]
    origins = tuple(f"http://127.0.0.1:{sock.getsockname()[1]}" for sock in privates)
    shared = WorkerSet(
        index=0, origins=origins, secret=secrets.token_hex(16), root_path=config.root_path
    )
    supervisor = _Supervisor()
    previous = {
        sig: signal.signal(sig, supervisor.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        for index in range(workers):
            supervisor.fork(config, listener, privates, dataclasses.replace(shared, index=index))
        bound_port = listener.getsockname()[1]
        listener.close()
        for sock in privates:
            sock.close()
        logging.getLogger("uvicorn.error").info(
            "Uvicorn running on http://%s:%d with %d workers (pids %s; Press CTRL+C to quit)",
            host,
            bound_port,
            workers,
            ", ".join(str(pid) for pid in supervisor.children),
        )
        supervisor.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        supervisor.kill_left()
    if supervisor.exit_code:
        raise SystemExit(supervisor.exit_code)


def _check_forkable(app: Any, workers: int) -> None:
    """:class:`UsageError` when ``workers`` processes cannot serve ``app`` here."""
    if not hasattr(os, "fork"):
        raise UsageError(
            f"workers={workers} needs os.fork, which {sys.platform} lacks: serve with workers=1"
        )
    if (
        not isinstance(app, str)
        and getattr(getattr(app, "state", None), "osmosis_process_id", None) is None
    ):
        raise UsageError(
            f"workers={workers} needs the app create_rollout_server built, which sends each "
            f"rollout's calls to the worker running it; got {type(app).__name__}: pass that "
            "app itself (its own add_middleware keeps it), or serve with workers=1"
        )


def _listen(host: str, port: int, backlog: int) -> socket.socket:
    """The shared listening socket; ``SystemExit(1)`` (logged) when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=backlog)
    except OSError as exc:
        logger.error("cannot listen on %s:%d: %s", host, port, exc)
        raise SystemExit(1) from None


class _Supervisor:
    """The parent's side: the worker processes, and stopping them all when one dies on its
    own or a stop signal arrives."""

    def __init__(self) -> None:
        self.children: dict[int, int] = {}
        """Worker index by pid, for the workers still running."""
        self.stopping = False
        self.exit_code = 0

    def fork(
        self,
        config: Any,
        listener: socket.socket,
        privates: list[socket.socket],
        workers: WorkerSet,
    ) -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which never returns
            _run_worker(config, listener, privates, workers)
        self.children[pid] = workers.index

    def on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True
        self.stop_all()

    def stop_all(self, signum: int = signal.SIGTERM) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def wait(self) -> None:
        """Reap the workers until none is left; the first to exit on its own stops the rest
        and sets :attr:`exit_code`."""
        while self.children:
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                break
            index = self.children.pop(pid, None)
            if index is not None and not self.stopping:
                self._died_on_its_own(index, pid, os.waitstatus_to_exitcode(status))

    def _died_on_its_own(self, index: int, pid: int, code: int) -> None:
        logger.error(
            "rollout worker %d (pid %d) exited on its own with %s; stopping the others",
            index,
            pid,
            _describe_exit(code),
        )
        self.exit_code = code if code > 0 else 1
        self.stopping = True
        self.stop_all()

    def kill_left(self) -> None:
        """When the parent itself failed: leave no worker behind."""
        if not self.children:
            return
        self.stop_all(signal.SIGKILL)
        for pid in list(self.children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _describe_exit(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"signal {signal.Signals(-code).name}"
    except ValueError:
        return f"signal {-code}"


def _run_worker(
    config: Any, listener: socket.socket, privates: list[socket.socket], workers: WorkerSet
) -> None:  # pragma: no cover - measured in the child processes of the tests
    code = 1
    try:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _Serving.workers = workers
        for index, sock in enumerate(privates):
            if index != workers.index:
                sock.close()
        _watch_parent(os.getppid())
        import uvicorn

        uvicorn.Server(config).run(sockets=[listener, privates[workers.index]])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except KeyboardInterrupt:
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        logging.shutdown()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def _watch_parent(parent: int) -> None:
    """Stop this worker (as ``SIGTERM`` does) once its parent is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_PARENT_CHECK_SEC)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="osmosis-worker-parent", daemon=True).start()


# -- routing requests to the owner --------------------------------------------------------------


class WorkerRouter:
    """ASGI middleware that sends each rollout's calls to the worker that owns it.

    A pass-through when the process serves alone.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        workers = _Serving.workers
        if workers is None or scope["type"] != "http" or _forwarded(scope, workers):
            await self.app(scope, receive, send)
            return
        path, method = scope["path"], scope["method"]
        root = scope.get("root_path", "")
        if root and path.startswith(root):  # mounted, or served with a root path
            path = path[len(root) :]
        if method == "POST" and path == "/rollout":
            body = await read_body(receive)
            if body is None:
                return  # the client hung up: nobody to answer
            owner, replayable = _read_submit(workers, body)
            if owner is None or owner == workers.index:
                await self.app(scope, _replay(body, receive), send)
            else:
                answer = await _forward(workers, owner, scope, body, idempotent=replayable)
                await _send_answer(send, answer)
            return
        if method == "GET" and path.startswith("/rollout/"):
            rollout_id, _, leaf = path[len("/rollout/") :].rpartition("/")
            if rollout_id and "/" not in rollout_id and leaf in ("result", "status"):
                owner = workers.owner(rollout_id)
                if owner != workers.index:
                    await _send_answer(send, await _forward(workers, owner, scope, b""))
                    return
        elif method == "POST" and path == "/rollout/cancel":
            body = await read_body(receive)
            if body is not None:
                await self._cancel(workers, scope, body, receive, send)
            return
        elif method == "GET" and path == "/health":
            await self._health(workers, scope, receive, send)
            return
        await self.app(scope, receive, send)

    async def _cancel(
        self, workers: WorkerSet, scope: Scope, body: bytes, receive: Receive, send: Send
    ) -> None:
        """Every worker cancels what it owns; each id's disposition comes from its owner."""
        answers = await self._everyone(workers, scope, body, receive)
        failure = _failure(answers, workers.index)
        if failure is not None:
            await _send_answer(send, failure)
            return
        bodies = _objects(answers, "POST /rollout/cancel")
        if isinstance(bodies, QuickAnswer):
            await _send_answer(send, bodies)
            return
        merged: dict[str, Any] = {}
        for index, answered in enumerate(bodies):
            dispositions = answered.get("dispositions")
            for rollout_id, disposition in (
                dispositions.items() if isinstance(dispositions, dict) else ()
            ):
                if workers.owner(rollout_id) == index:
                    merged[rollout_id] = disposition
        local = answers[workers.index]
        await _send_answer(send, _json(200, {"dispositions": merged}, local.headers))

    async def _health(self, workers: WorkerSet, scope: Scope, receive: Receive, send: Send) -> None:
        """The server's health: the workers' bodies merged, with worker 0's headers."""
        answers = await self._everyone(workers, scope, b"", receive)
        failure = _failure(answers, workers.index)
        if failure is not None:
            await _send_answer(send, failure)
            return
        bodies = _objects(answers, "GET /health")
        if isinstance(bodies, QuickAnswer):
            await _send_answer(send, bodies)
            return
        merged = merge_health(bodies)
        merged["workers"] = {"count": workers.count}
        await _send_answer(send, _json(200, merged, answers[0].headers))

    async def _everyone(
        self, workers: WorkerSet, scope: Scope, body: bytes, receive: Receive
    ) -> list[QuickAnswer]:
        async def ask(index: int) -> QuickAnswer:
            if index == workers.index:
                return await _capture(self.app, scope, _replay(body, receive))
            return await _forward(workers, index, scope, body)

        return list(await asyncio.gather(*(ask(index) for index in range(workers.count))))


def _failure(answers: list[QuickAnswer], index: int) -> QuickAnswer | None:
    """What to pass on when not every worker answered 200: this worker's answer first (a
    validation error is the same everywhere), else the first failure."""
    if answers[index].status_code != 200:
        return answers[index]
    return next((answer for answer in answers if answer.status_code != 200), None)


def _objects(answers: list[QuickAnswer], what: str) -> list[dict[str, Any]] | QuickAnswer:
    """Each worker's answer as a JSON object, or a 502 naming the worker whose is not."""
    bodies: list[dict[str, Any]] = []
    for index, answer in enumerate(answers):
        try:
            body = answer.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            detail = (
                f"rollout worker {index} answered {what} with a body that is not a JSON object: "
                f"{answer.content[:200]!r}"
            )
            logger.error("%s", detail)
            return _json(502, {"detail": detail}, {})
        bodies.append(cast(dict[str, Any], body))
    return bodies


def _forwarded(scope: Scope, workers: WorkerSet) -> bool:
    for name, value in scope["headers"]:
        if name == _FORWARDED:
            return hmac.compare_digest(value, workers.secret.encode("latin-1"))
    return False


def _read_submit(workers: WorkerSet, body: bytes) -> tuple[int | None, bool]:
    """The owner named by a ``POST /rollout`` body (``None`` when it names no rollout id:
    the local worker then answers with the validation error), and whether the body may be
    sent to it twice: a polling-generation body with an ``llm_api_key``, which the owner
    answers again with the same lease. A callback-generation body may not (a second one
    runs the rollout again), nor one without the key (its second send would get 409)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        return None, False
    if not isinstance(parsed, dict):
        return None, False
    fields = cast(dict[str, object], parsed)
    rollout_id = fields.get("rollout_id")
    if not isinstance(rollout_id, str) or not rollout_id:
        return None, False
    key = fields.get("llm_api_key")
    replayable = fields.get("completion_callback_url") is None and isinstance(key, str) and key
    return workers.owner(rollout_id), bool(replayable)


_transports: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LeanTransport] = (
    weakref.WeakKeyDictionary()
)


def _transport() -> LeanTransport:
    loop = asyncio.get_running_loop()
    transport = _transports.get(loop)
    if transport is None:
        # One connection per request in flight: a held long poll keeps its connection.
        transport = _transports[loop] = LeanTransport(max_connections=1 << 20)
    return transport


async def _forward(
    workers: WorkerSet, owner: int, scope: Scope, body: bytes, *, idempotent: bool | None = None
) -> QuickAnswer:
    """The owner's answer to this request; ``idempotent`` (default: by method) lets it go
    twice when a kept-alive connection to the owner closes before answering."""
    headers: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name not in _HOP_REQUEST:
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
    headers[FORWARDED_HEADER] = workers.secret
    target = _target(scope, workers.root_path)
    if not _SENDABLE_TARGET.fullmatch(target):
        shown = target.decode("utf-8", "backslashreplace")
        shown = shown if len(shown) <= 200 else f"{shown[:200]}..."
        return _json(
            400,
            {
                "detail": f"the request path {shown!r} has a space, control or non-ASCII "
                "character, so it cannot be passed to the worker running the rollout: "
                "percent-encode it"
            },
            {},
        )
    url = workers.origins[owner] + target.decode("ascii")
    try:
        return await _transport().quick(
            scope["method"],
            url,
            headers=headers,
            content=body,
            timeouts=_TIMEOUTS,
            idempotent=idempotent,
        )
    except UsageError as exc:  # a header that cannot go on the wire (named, value hidden)
        return _json(400, {"detail": f"the request cannot be forwarded as it is: {exc}"}, {})
    except httpx.HTTPError as exc:
        logger.error("rollout worker %d did not answer a forwarded request: %s", owner, exc)
        return _json(503, {"detail": f"rollout worker {owner} did not answer: {exc}"}, {})


# A request target as it may go on the wire: printable ASCII, no space.
_SENDABLE_TARGET = re.compile(rb"[\x21-\x7e]*")


def _target(scope: Scope, root_path: str) -> bytes:
    """The request target to send the owner: the path as the client sent it (rebuilt,
    percent-encoded, from the decoded path when the server gives no ``raw_path``), less
    the root path, which the owner's uvicorn puts back, with the query string."""
    raw: bytes | None = scope.get("raw_path")
    target = raw if raw else quote(scope["path"], safe="/", errors="surrogatepass").encode()
    root = root_path.encode("latin-1")
    if root and target.startswith(root):
        target = target[len(root) :]
    if scope.get("query_string"):
        target += b"?" + scope["query_string"]
    return target


async def _capture(app: ASGIApp, scope: Scope, receive: Receive) -> QuickAnswer:
    """Run ``app`` for one request and keep its answer instead of sending it."""
    status = 500
    headers: dict[str, str] = {}
    parts: list[bytes] = []

    async def send(message: Message) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            for name, value in message.get("headers", []):
                headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))

    await app(scope, receive, send)
    return QuickAnswer(status, headers, b"".join(parts))


async def _send_answer(send: Send, answer: QuickAnswer) -> None:
    """Pass an answer on; every answer of the rollout server is JSON."""
    headers = [
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in answer.headers.items()
        if name not in _HOP_ANSWER
    ]
    await send_body(send, answer.status_code, answer.content, headers)


def _json(status: int, value: object, headers: Mapping[str, str]) -> QuickAnswer:
    return QuickAnswer(status, headers, JSON_ENCODER.encode(value).encode())


# How the workers' health bodies make the server's, by key path (see merge_health).
_HEALTH_TOTALS: tuple[tuple[str, ...], ...] = (
    ("concurrency", "queued"),  # counts
    ("concurrency", "running"),
    ("lifecycle", "active_rollouts"),
    ("concurrency", "max_concurrent"),  # per-worker capacity limits
    ("max_queue_depth",),
)
_HEALTH_EVERY: tuple[tuple[str, ...], ...] = (("lifecycle", "accepting_rollouts"),)


def merge_health(bodies: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``/health`` body for the whole server from each worker's, in worker order.

    Worker 0's body, with these fields made the server's:

    - counts (``concurrency.queued``, ``concurrency.running``,
      ``lifecycle.active_rollouts``) add up;
    - capacity limits (``concurrency.max_concurrent``, ``max_queue_depth``) hold per worker,
      each running its own backend, so the server's capacity, which a controller caps its
      rollouts in flight to, is their total;
    - ``lifecycle.accepting_rollouts`` holds when it holds for every worker, and ``status``
      is the first that is not ``"ok"``, if any.

    Any other field (identity, versions, ports, timestamps, a backend's own) stays worker
    0's: adding them up would make nonsense of them, and one worker's answer is the same
    whichever worker the request reached. A field is merged only when every body has it
    with the expected type; else worker 0's value stands.
    """
    merged = copy.deepcopy(bodies[0])
    for path in _HEALTH_TOTALS:
        values = [_at(body, path) for body in bodies]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            _put(merged, path, sum(cast(list[int], values)))
    for path in _HEALTH_EVERY:
        values = [_at(body, path) for body in bodies]
        if all(isinstance(v, bool) for v in values):
            _put(merged, path, all(values))
    if "status" in merged:
        troubled = (body.get("status") for body in bodies)
        merged["status"] = next(
            (s for s in troubled if isinstance(s, str) and s != "ok"), merged["status"]
        )
    return merged


_MISSING = object()


def _at(body: dict[str, Any], path: tuple[str, ...]) -> object:
    value: object = body
    for key in path:
        if not isinstance(value, dict):
            return _MISSING
        value = cast(dict[str, object], value).get(key, _MISSING)
    return value


def _put(body: dict[str, Any], path: tuple[str, ...], value: object) -> None:
    for key in path[:-1]:
        body = body[key]
    body[path[-1]] = value


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands over ``body`` (already read) once, then the real one's."""
    pending = True

    async def replay() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
