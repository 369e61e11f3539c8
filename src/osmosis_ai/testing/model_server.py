"""A scripted model server: a real HTTP fake for tests and benches.

It speaks OpenAI chat completions, and through the policy endpoint's dialects the OpenAI
Responses API (``<prefix>/responses``) and the Anthropic Messages API
(``<prefix>/messages``, and its token counting, ``<prefix>/messages/count_tokens``), so
agents that speak only those can be tested against it.
Owns :class:`ScriptedModelServer` (a raw ASGI app), routing, auth, request recording and a
CLI; the turns of a script are in :mod:`osmosis_ai.testing.turns`, and
:mod:`osmosis_ai.testing.scripted_reply` renders each reply.
The request path is kept lean on purpose: a benchmark drives it at high concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import inspect
import json
import re
import signal
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any, Literal, cast

from osmosis_ai.controller.asgi import dumps, error_body
from osmosis_ai.controller.dialect import Dialect, DialectError
from osmosis_ai.controller.dialects import DIALECTS, MessagesDialect
from osmosis_ai.controller.dialects.messages import COUNT_TOKENS, count_answer
from osmosis_ai.errors import OsmosisError, UsageError
from osmosis_ai.rollout.asgi import (
    SSE_HEADERS,
    Receive,
    Scope,
    Send,
    lifespan,
    read_body,
    send_body,
)
from osmosis_ai.testing.scripted_reply import ScriptedReply, content_text, prompt_tokens
from osmosis_ai.testing.serving import ServerThread, serve_in_task
from osmosis_ai.testing.turns import ScriptedTurn, ToolCall

__all__ = [  # ScriptedTurn and ToolCall are defined in .turns and re-exported here
    "ChatRequest",
    "OnExhausted",
    "RecordedRequest",
    "Responder",
    "ScriptedModelServer",
    "ScriptedTurn",
    "ToolCall",
    "default_key",
    "main",
    "multiply_responder",
]

OnExhausted = Literal["repeat_last", "error"]

_CHAT_SUFFIX = "/chat/completions"
_MODELS_SUFFIX = "/models"
_DIALECT_SUFFIXES = {f"/{name}": dialect for name, dialect in DIALECTS.items()}
_MESSAGES = MessagesDialect()
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What a responder or key callable sees of one chat-completions request.

    ``path_prefix`` is the path before ``/chat/completions`` (``/v1``, ``/v1/rollouts/r1``);
    ``turn`` is the number of assistant messages already in ``messages``. A Responses or
    Messages request is seen as the chat-completions request it maps onto.
    """

    path_prefix: str
    body: dict[str, Any]
    messages: list[dict[str, Any]]
    headers: dict[str, str]
    turn: int


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """A model request kept when ``record_requests=True``: the body as the client sent it
    (chat completions, Responses or Messages, as ``path`` says)."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]


Responder = Callable[[ChatRequest], ScriptedTurn | str | Awaitable[ScriptedTurn | str]]


class _HTTPError(OsmosisError):
    """Ends a request early with an OpenAI-style error body."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def default_key(request: ChatRequest) -> str:
    """The conversation key: the segment after ``/rollouts/`` in the path prefix, if any,
    else the text of the first user message."""
    marker = "/rollouts/"
    at = request.path_prefix.find(marker)
    if at >= 0:
        return request.path_prefix[at + len(marker) :].split("/", 1)[0]
    for message in request.messages:
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


class ScriptedModelServer:
    """A model endpoint that answers from a script: chat completions, and the Responses
    (``<prefix>/responses``) and Messages (``<prefix>/messages``) APIs mapped onto it.

    Give at most one of ``script`` (the same turns for every conversation, indexed by the
    number of assistant messages in the request), ``scripts`` (turns per conversation key,
    see :func:`default_key`) or ``responder`` (called per request). With none, it echoes the
    last user message. Serve it with ``with`` (a thread) or ``async with`` (a task); the
    instance itself is the ASGI app, also reachable as ``.app``.

    ``request_count`` counts model requests, rejected ones included;
    ``requests`` keeps the well-formed ones when ``record_requests=True``. ``models`` are the
    ids ``GET <prefix>/models`` lists; replies always echo the requested ``model``.
    """

    def __init__(
        self,
        script: Sequence[ScriptedTurn | str] | None = None,
        *,
        scripts: Mapping[str, Sequence[ScriptedTurn | str]] | None = None,
        key: Callable[[ChatRequest], str] | None = None,
        responder: Responder | None = None,
        on_exhausted: OnExhausted = "error",
        latency_ms: float = 0.0,
        api_key: str | None = None,
        record_requests: bool = False,
        models: Sequence[str] = ("scripted",),
    ) -> None:
        modes = {"script": script, "scripts": scripts, "responder": responder}
        given = [name for name, value in modes.items() if value is not None]
        if len(given) > 1:
            raise UsageError(f"pass at most one of script=, scripts=, responder= (got {given})")
        if key is not None and scripts is None:
            raise UsageError("key= chooses among scripts=; pass scripts= as well")
        if on_exhausted not in ("repeat_last", "error"):
            raise UsageError(f"on_exhausted={on_exhausted!r}: use 'repeat_last' or 'error'")
        self._script = _normalise("script", script) if script is not None else None
        self._scripts = (
            {k: _normalise(f"scripts[{k!r}]", v) for k, v in scripts.items()}
            if scripts is not None
            else None
        )
        self._key = key or default_key
        self._responder = responder
        self._on_exhausted = on_exhausted
        self._latency_s = latency_ms / 1000.0
        self._auth = f"Bearer {api_key}".encode("latin-1") if api_key is not None else None
        self._api_key = api_key.encode("latin-1") if api_key is not None else None
        self._record = record_requests
        self._models = dumps(
            {
                "object": "list",
                "data": [
                    {"id": m, "object": "model", "created": 0, "owned_by": "osmosis-testing"}
                    for m in models
                ],
            }
        )
        self.requests: list[RecordedRequest] = []
        self.request_count = 0
        self._thread: ServerThread | None = None
        self._task: contextlib.AbstractAsyncContextManager[str] | None = None
        self._url: str | None = None

    # -- lifecycle -------------------------------------------------------------------------

    @property
    def app(self) -> ScriptedModelServer:
        """The ASGI app (this instance), e.g. for ``httpx.ASGITransport(app=server.app)``."""
        return self

    @property
    def url(self) -> str:
        """The origin, ``http://127.0.0.1:<port>``, while the server runs."""
        if self._url is None:
            raise UsageError("the server is not running: use it as `with` or `async with` first")
        return self._url

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, ``<url>/v1``."""
        return f"{self.url}/v1"

    def clear(self) -> None:
        """Forget recorded requests and reset :attr:`request_count`."""
        self.requests.clear()
        self.request_count = 0

    def __enter__(self) -> ScriptedModelServer:
        self._thread = ServerThread(self, access_log=False).start()
        self._url = self._thread.url
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread is not None:
            self._thread.stop()
        self._thread = self._url = None

    async def __aenter__(self) -> ScriptedModelServer:
        self._task = serve_in_task(self, access_log=False)
        self._url = await self._task.__aenter__()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task, self._url = self._task, None, None
        if task is not None:
            await task.__aexit__(exc_type, exc, tb)

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"]
        method: str = scope["method"]
        suffix = path[path.rfind("/") :]
        dialect = _DIALECT_SUFFIXES.get(suffix)
        try:
            if path == "/health":
                await send_body(send, 200, b'{"status":"ok"}')
            elif path.endswith(COUNT_TOKENS):  # not a model call: neither counted nor recorded
                dialect = _MESSAGES
                _allow(method, "POST")
                self._check_auth(scope)
                raw = await read_body(receive)
                if raw is not None:
                    await send_body(send, 200, _count_tokens(raw))
            elif path.endswith(_CHAT_SUFFIX) or dialect is not None:
                self.request_count += 1
                _allow(method, "POST")
                self._check_auth(scope)
                raw = await read_body(receive)
                if raw is None:
                    return  # the client hung up: nobody to answer
                await self._chat(scope, path, raw, send, dialect)
            elif path.endswith(_MODELS_SUFFIX):
                _allow(method, "GET")
                self._check_auth(scope)
                await send_body(send, 200, self._models)
            else:
                raise _HTTPError(404, f"no route for {method} {path}", "not_found")
        except _HTTPError as err:
            payload = (
                _error_body(err.status, err.message, err.code)
                if dialect is None
                else dialect.error_body(err.status, err.message, err.code)
            )
            await send_body(send, err.status, payload)

    def _check_auth(self, scope: Scope) -> None:
        if self._auth is None:
            return
        for name, value in scope["headers"]:
            if (name == b"authorization" and value == self._auth) or (
                name == b"x-api-key" and value == self._api_key
            ):
                return
        raise _HTTPError(
            401,
            "missing or wrong API key: send 'Authorization: Bearer <key>' (or 'x-api-key: <key>')",
            "invalid_api_key",
        )

    async def _chat(
        self, scope: Scope, path: str, raw: bytes, send: Send, dialect: Dialect | None
    ) -> None:
        asked = _parse_object(raw)
        body = asked if dialect is None else _to_chat(dialect, asked)
        messages = _messages_of(body)
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if self._record:
            self.requests.append(RecordedRequest(path, headers, asked))
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        prefix = path[: path.rfind("/")] if dialect is not None else path[: -len(_CHAT_SUFFIX)]
        request = ChatRequest(prefix, body, messages, headers, turn)
        reply = await self._reply(request)
        latency = reply.latency_ms / 1000.0 if reply.latency_ms is not None else self._latency_s
        if latency > 0:
            await asyncio.sleep(latency)
        if reply.status_code >= 400:
            message = reply.error or f"scripted error (HTTP {reply.status_code})"
            raise _HTTPError(reply.status_code, message)
        n = _choice_count(body) if dialect is None else 1
        completion = ScriptedReply(body, messages, reply, n)
        if body.get("stream"):
            if dialect is None:
                events = completion.sse()
            else:
                writer = dialect.writer(asked)
                events = b"".join(writer.feed(c) for c in completion.chunks()) + writer.end()
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            await send({"type": "http.response.body", "body": events})
        elif dialect is None:
            await send_body(send, reply.status_code, dumps(completion.full()))
        else:
            await send_body(send, 200, dumps(dialect.from_chat(asked, completion.full())))

    async def _reply(self, request: ChatRequest) -> ScriptedTurn:
        if self._responder is not None:
            try:
                result = self._responder(request)
                if inspect.isawaitable(result):
                    result = await result
            except Exception as exc:  # a bug in user code: surface it to the client, not a hang
                raise _HTTPError(500, f"responder raised {type(exc).__name__}: {exc}") from exc
            return _as_turn(result)
        if self._script is not None:
            return self._pick(self._script, request, None)
        if self._scripts is not None:
            conversation = self._key(request)
            turns = self._scripts.get(conversation)
            if turns is None:
                known = ", ".join(repr(k) for k in list(self._scripts)[:5])
                raise _HTTPError(
                    400,
                    f"no script for conversation {conversation!r} (known keys: {known})",
                    "unknown_conversation",
                )
            return self._pick(turns, request, conversation)
        return ScriptedTurn(content=_last_user_text(request.messages))

    def _pick(
        self, turns: list[ScriptedTurn], request: ChatRequest, conversation: str | None
    ) -> ScriptedTurn:
        if request.turn < len(turns):
            return turns[request.turn]
        if self._on_exhausted == "repeat_last":
            return turns[-1]
        if conversation is None:
            conversation = default_key(request)
        raise _HTTPError(
            400,
            f"script for conversation {conversation!r} has {len(turns)} turn(s) but this "
            f"request is turn {request.turn} (counted from 0 by assistant messages); add "
            "turns or pass on_exhausted='repeat_last'",
            "script_exhausted",
        )


# -- helpers of the request path -------------------------------------------------------------


def _normalise(what: str, turns: Sequence[ScriptedTurn | str]) -> list[ScriptedTurn]:
    if isinstance(turns, str):
        raise UsageError(f"{what} must be a sequence of turns, not a string: wrap it in a list")
    if not turns:
        raise UsageError(f"{what} is empty: give at least one turn")
    return [ScriptedTurn(content=t) if isinstance(t, str) else t for t in turns]


def _as_turn(result: object) -> ScriptedTurn:
    if isinstance(result, str):
        return ScriptedTurn(content=result)
    if not isinstance(result, ScriptedTurn):
        raise _HTTPError(500, f"responder returned {result!r}: return a ScriptedTurn or a str")
    return result


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            return content_text(message.get("content"))
    return ""


def _parse_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise _HTTPError(400, f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise _HTTPError(400, f"request body must be a JSON object, got {type(body).__name__}")
    return body


def _to_chat(dialect: Dialect, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return dialect.to_chat(body)
    except DialectError as exc:
        raise _HTTPError(exc.status, exc.message) from exc


def _count_tokens(raw: bytes) -> bytes:
    """A Messages ``count_tokens`` answer: the fake prompt tokens a call would report."""
    try:
        chat = _MESSAGES.counting_chat(_parse_object(raw))
    except DialectError as exc:
        raise _HTTPError(exc.status, exc.message) from exc
    return count_answer(prompt_tokens(_messages_of(chat)))


def _messages_of(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise _HTTPError(400, "'messages' is required and must be a list of message objects")
    return messages


def _choice_count(body: dict[str, Any]) -> int:
    n = body.get("n")
    n = 1 if n is None else n
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= 128:
        raise _HTTPError(400, f"'n' must be an integer from 1 to 128, got {n!r}")
    return n


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise _HTTPError(405, f"method {method} not allowed here; use {allowed}")


def _error_body(status: int, message: str, code: str | None = None) -> bytes:
    kind = _ERROR_TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return error_body(message, kind, code)


# -- the multiply solver ----------------------------------------------------------------------

_OPERANDS = re.compile(r"val1\s*=\s*(-?[\d.]+(?:e-?\d+)?)\s+val2\s*=\s*(-?[\d.]+(?:e-?\d+)?)")


def multiply_responder(request: ChatRequest) -> ScriptedTurn:
    """Solve the multiply templates' rows through their tool, as a capable model would.

    First turn: call the request's multiply tool (its first two parameters) on the
    ``val1 = …`` / ``val2 = …`` of the last user message. After the tool's result: answer
    ``#### <result>``. A request with no such operands is answered ``ok``.
    """
    results = [m for m in request.messages if m.get("role") == "tool"]
    if results:
        text = content_text(results[-1].get("content")).strip()
        try:
            return ScriptedTurn(content=f"The product is\n#### {float(text):.4f}")
        except ValueError:
            return ScriptedTurn(content=f"The tool answered {text!r}\n#### {text}")
    users = [m for m in request.messages if m.get("role") == "user"]
    found = _OPERANDS.search(content_text(users[-1].get("content"))) if users else None
    if found is None:
        return ScriptedTurn(content="ok")
    a, b = float(found.group(1)), float(found.group(2))
    name, params = _multiply_tool(request.body.get("tools"))
    if name is None:  # no tool offered: answer directly
        return ScriptedTurn(content=f"The product is\n#### {a * b:.4f}")
    return ScriptedTurn(tool_calls=[ToolCall(name, {params[0]: a, params[1]: b})])


def _multiply_tool(tools: object) -> tuple[str | None, tuple[str, str]]:
    """The offered tool whose name has ``multiply`` in it, and its first two parameters."""
    if not isinstance(tools, list):
        return None, ("a", "b")
    for tool in cast(list[Any], tools):
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if not isinstance(function, dict):
            continue
        spec = cast(dict[str, Any], function)
        name = spec.get("name")
        if isinstance(name, str) and "multiply" in name:
            properties = (spec.get("parameters") or {}).get("properties") or {}
            keys = [k for k in properties if isinstance(k, str)]
            return name, (keys[0], keys[1]) if len(keys) >= 2 else ("a", "b")
    return None, ("a", "b")


RESPONDERS: dict[str, Responder] = {"multiply": multiply_responder}


# -- CLI ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m osmosis_ai.testing.model_server``: serve until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(
        prog="python -m osmosis_ai.testing.model_server",
        description="Serve a scripted OpenAI-compatible chat-completions endpoint on 127.0.0.1.",
    )
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one")
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay before each reply")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--reply", help="answer every request with this text (default: echo)")
    mode.add_argument(
        "--solve",
        choices=sorted(RESPONDERS),
        help="solve a template's rows: 'multiply' calls the multiply tool, then answers "
        "'#### <product>' (the multiply templates pass with it)",
    )
    parser.add_argument("--api-key", help="require 'Authorization: Bearer <key>'")
    args = parser.parse_args(argv)
    server = ScriptedModelServer(
        [args.reply] if args.reply is not None else None,
        responder=RESPONDERS[args.solve] if args.solve is not None else None,
        on_exhausted="repeat_last",
        latency_ms=args.latency_ms,
        api_key=args.api_key,
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    thread = ServerThread(server, port=args.port or None, access_log=False).start()
    print(f"{thread.url}/v1", flush=True)
    try:
        while not stop.wait(0.5):
            pass
    finally:
        thread.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
