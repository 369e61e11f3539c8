"""``RolloutClient``: drive a polling-generation rollout server (protocol 0.4, SDK 0.3.8).

Submits rollouts (retrying ``429`` within an admission budget), then long-polls each result
under its polling lease, retrying transient failures without ever letting the lease lapse.
A submit whose connection closes before the answer is sent once more, byte for byte: the
rollout id makes it safe. A server that admitted the first send answers the second as a
replay, with the same lease (this package's server), or with ``409`` for the same id (0.3.8's,
which issues a lease only once: see :class:`RolloutLeaseLostError`).
:func:`retry_after_sec` reads ``Retry-After`` for every client of the package.
"""

from __future__ import annotations

import asyncio
import datetime
import email.utils
import json as _json
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, TypeVar, Unpack
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from osmosis_ai.errors import OsmosisError, RolloutProtocolError, UsageError
from osmosis_ai.rollout.http import HttpClientOwner
from osmosis_ai.rollout.protocol import (
    POLLING_LEASE_HEADER,
    CancelDisposition,
    CancelRolloutsResponse,
    Generation,
    RolloutInitResponse,
    RolloutResultResponse,
    RolloutStatusResponse,
)
from osmosis_ai.rollout.status import RolloutStatus

if TYPE_CHECKING:
    from osmosis_ai.rollout.http1 import LeanTransport

__all__ = [
    "RolloutAdmissionTimeoutError",
    "RolloutClient",
    "RolloutHandle",
    "RolloutLeaseLostError",
    "RolloutProtocolError",
    "retry_after_sec",
]

DEFAULT_TIMEOUT_SEC = 30.0
POLL_READ_MARGIN_SEC = 10.0
CANCEL_BOUND_SEC = 5.0
RETRY_AFTER_MIN_SEC = 0.05
RETRY_AFTER_MAX_SEC = 60.0
RETRY_AFTER_DEFAULT_SEC = 1.0
TRANSPORT_RETRY_DELAYS = (0.1, 0.5)
GATEWAY_RETRY_DELAYS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_GATEWAY_STATUSES = frozenset({502, 503, 504})
# Polls are idempotent, so any transport failure is retried (within the schedule). Broader
# than dropped connections and read timeouts on purpose: the aiohttp-backed transport of
# rollout.http reports a server disconnect as a connect timeout.
_TRANSPORT_ERRORS = (httpx.TransportError,)
# The connection closed (or broke) after the request may have gone out: a submit is sent
# once more, as its rollout id makes a second one harmless.
_CLOSED_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
_M = TypeVar("_M", bound=BaseModel)


class _Answer(Protocol):
    """What the client reads of an answer: an ``httpx.Response`` or the lean transport's
    ``QuickAnswer``."""

    @property
    def status_code(self) -> int: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content(self) -> bytes: ...
    @property
    def text(self) -> str: ...
    def json(self) -> Any: ...


_Send = Callable[..., Awaitable[_Answer]]


class SubmitOptions(TypedDict, total=False):
    """Keywords of :meth:`RolloutClient.submit`, for :meth:`RolloutClient.run_rollout_async`."""

    rollout_id: str | None
    llm_api_key: str | None
    label: str | None
    metadata: Mapping[str, Any] | None
    grade: bool
    agent_timeout_sec: float | None
    grader_timeout_sec: float | None
    extra_fields: Mapping[str, Any] | None
    admission_timeout_sec: float | None


class RolloutAdmissionTimeoutError(OsmosisError, TimeoutError):
    """The server kept answering ``429`` until the admission budget ran out."""


class RolloutLeaseLostError(RolloutProtocolError):
    """The rollout was admitted, but the answer carrying its polling lease was lost.

    A submit's connection closed before the answer came; sent again, it got ``409`` for
    its own rollout id, so the first one was admitted, by a server that does not answer a
    resent submit with its lease (0.3.8's issues it once, in that lost answer; this
    package's answers the resend 202 instead, unless the body had no ``llm_api_key``). The
    rollout cannot be polled: cancel it and run the work again under a new id.
    ``rollout_status`` is what ``GET /rollout/{id}/status`` reported (``None`` when the
    server does not serve it, as 0.3.8's does not).
    """

    def __init__(
        self, message: str, *, rollout_id: str, rollout_status: RolloutStatus | None
    ) -> None:
        self.rollout_id = rollout_id
        self.rollout_status = rollout_status
        super().__init__(message, status_code=409)


def _encoded(value: object) -> bytes:
    """A JSON request body; the same value always gives the same bytes (a resent submit
    must match the first byte for byte to be answered as its replay)."""
    return _json.dumps(value, separators=(",", ":"), allow_nan=False).encode()


def _detail(response: _Answer) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or "<empty body>"
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # FastAPI-style validation errors: "loc: msg; ..."
        detail = "; ".join(
            f"{'.'.join(map(str, e.get('loc', [])))}: {e.get('msg')}"
            if isinstance(e, dict)
            else str(e)
            for e in detail
        )
    return str(detail)[:500]


def _unexpected(response: _Answer, what: str) -> RolloutProtocolError:
    return RolloutProtocolError(
        f"{what} answered HTTP {response.status_code}: {_detail(response)}",
        status_code=response.status_code,
    )


def _parse(model: type[_M], response: _Answer, what: str) -> _M:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise RolloutProtocolError(
            f"{what} answered a malformed {model.__name__}: {exc}",
            status_code=response.status_code,
        ) from exc


def retry_after_sec(value: str | None, *, now: float | None = None) -> float:
    """A ``Retry-After`` value in seconds: delay-seconds or an HTTP-date (counted from
    ``now``, Unix seconds, default the clock), clamped to 0.05-60 s; 1 s when absent or
    unreadable."""
    if value is None:
        return RETRY_AFTER_DEFAULT_SEC
    try:
        delay = float(value)
    except ValueError:
        delay = _until_date(value, time.time() if now is None else now)
    if not math.isfinite(delay):
        delay = RETRY_AFTER_DEFAULT_SEC
    return min(max(delay, RETRY_AFTER_MIN_SEC), RETRY_AFTER_MAX_SEC)


def _until_date(value: str, now: float) -> float:
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return RETRY_AFTER_DEFAULT_SEC
    if when.tzinfo is None:  # "-0000": UTC, as HTTP-dates are
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp() - now


def _lean_transport(client: httpx.AsyncClient, base_url: str) -> LeanTransport | None:
    """The client's lean transport when a request to ``base_url`` would go straight to it
    (an ``http://`` server, no mounted proxy transports), else ``None``."""
    from osmosis_ai.rollout.http1 import LeanTransport

    transport = getattr(client, "_transport", None)
    mounts = getattr(client, "_mounts", None)
    if isinstance(transport, LeanTransport) and not mounts and base_url[:7].lower() == "http://":
        return transport
    return None


def _plain(client: httpx.AsyncClient) -> bool:
    """Whether the client adds nothing to a request that the quick path would leave out:
    no cookies, auth, event hooks or default query parameters."""
    hooks = client.event_hooks
    return (
        client.auth is None
        and not client.cookies
        and not client.params
        and not hooks["request"]
        and not hooks["response"]
    )


class RolloutClient(HttpClientOwner):
    """Client of one rollout server; use as ``async with RolloutClient(url) as client``.

    Args:
        base_url: the server's root URL, e.g. ``http://127.0.0.1:8000``.
        api_key: sent as ``Authorization: Bearer`` on every call when set.
        http_client: an :class:`httpx.AsyncClient` to use; it is not closed by this client.
        timeout: seconds allowed for each non-polling request (polls use the server's wait
            timeout plus a margin).
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        timeout: float = DEFAULT_TIMEOUT_SEC,
    ) -> None:
        from osmosis_ai.rollout.http1 import check_header_fields

        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        check_header_fields(self._headers)  # a key read from a file may end with a newline
        self._init_http(http_client, lambda: httpx.AsyncClient(timeout=timeout))
        self._http = self.http_client
        self._lean = _lean_transport(self._http, self.base_url)
        if self._lean is not None:  # the client's own headers, once (not its compression)
            self._lean_headers = {
                k: v for k, v in self._http.headers.items() if k.lower() != "accept-encoding"
            }

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        headers: Mapping[str, str] | None = None,
        request_timeout: httpx.Timeout | float | None = None,
        idempotent: bool | None = None,
    ) -> _Answer:
        """One call, with ``json`` as its body when given; ``idempotent`` (default: by
        method) lets the transport send it once more when a reused connection closes
        before answering."""
        timeout = self.timeout if request_timeout is None else request_timeout
        content = b"" if json is None else _encoded(json)
        extra = headers or {}
        if json is not None:
            extra = {**extra, "content-type": "application/json"}
        if self._lean is not None and _plain(self._http):
            # A whole exchange on the lean pool: httpx's client layer cost more than the
            # connection itself on these small, hot calls.
            sent = {**self._lean_headers, **self._headers, **extra}
            limits = httpx.Timeout(timeout).as_dict()
            return await self._lean.quick(
                method,
                self.base_url + path,
                headers=sent,
                content=content,
                timeouts=limits,
                idempotent=idempotent,
            )
        from osmosis_ai.rollout.http1 import IDEMPOTENT_EXTENSION

        return await self._http.request(
            method,
            self.base_url + path,
            content=content if json is not None else None,
            headers={**self._headers, **extra},
            timeout=timeout,
            extensions=None if idempotent is None else {IDEMPOTENT_EXTENSION: idempotent},
        )

    # -- rollouts ------------------------------------------------------------------------

    async def submit(
        self,
        initial_messages: Sequence[Mapping[str, Any]],
        chat_completions_url: str,
        *,
        rollout_id: str | None = None,
        llm_api_key: str | None = None,
        label: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        grade: bool = True,
        agent_timeout_sec: float | None = None,
        grader_timeout_sec: float | None = None,
        extra_fields: Mapping[str, Any] | None = None,
        admission_timeout_sec: float | None = None,
    ) -> RolloutHandle:
        """Submit one rollout; returns its handle once the server answers ``202``.

        ``429`` is retried after ``Retry-After`` (clamped to 0.05–60 s, 1 s when absent)
        until ``admission_timeout_sec`` runs out (``None``: no limit), then
        :class:`RolloutAdmissionTimeoutError`. A connection that closes before the answer
        comes is followed by one more send of the same bytes: a server that admitted the
        first answers it with the same lease (a replay) or with ``409``, which means the
        first was admitted and its lease lost: :class:`RolloutLeaseLostError`. Any other
        status is a :class:`RolloutProtocolError`; other transport errors propagate.
        """
        rollout_id = rollout_id if rollout_id is not None else uuid.uuid4().hex
        optional: dict[str, Any] = {
            "label": label,
            "metadata": None if metadata is None else dict(metadata),
            "llm_api_key": llm_api_key,
            "agent_timeout_sec": agent_timeout_sec,
            "grader_timeout_sec": grader_timeout_sec,
            "extra_fields": None if extra_fields is None else dict(extra_fields),
        }
        body: dict[str, Any] = {
            "initial_messages": [dict(m) for m in initial_messages],
            "chat_completions_url": chat_completions_url,
            "rollout_id": rollout_id,
            "grade": grade,
            **{k: v for k, v in optional.items() if v is not None},
        }
        deadline = None
        if admission_timeout_sec is not None:
            deadline = time.monotonic() + admission_timeout_sec
        resent = False  # a send before this one may have reached the server
        while True:
            started = time.monotonic()
            try:
                response = await self._request("POST", "/rollout", json=body, idempotent=False)
            except _CLOSED_ERRORS:
                if resent:
                    raise
                resent = True
                continue
            if response.status_code == 202:
                lease = self._parse_lease(response, rollout_id)
                return RolloutHandle(self, self._request, lease, started)
            if response.status_code == 409 and resent:
                raise await self._lease_lost(rollout_id)
            if response.status_code != 429:
                raise _unexpected(response, f"POST /rollout for rollout {rollout_id!r}")
            delay = retry_after_sec(response.headers.get("retry-after"))
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RolloutAdmissionTimeoutError(
                        f"rollout {rollout_id!r} was not admitted within "
                        f"{admission_timeout_sec:g}s: the server kept answering 429 "
                        f"({_detail(response)}); lower the concurrency or raise the budget"
                    )
                delay = min(delay, remaining)
            await asyncio.sleep(delay)

    async def _lease_lost(self, rollout_id: str) -> RolloutLeaseLostError:
        """The error for a submit whose resend got ``409``: admitted, its lease lost. The
        status call says where the rollout is, when the server serves it."""
        try:
            status: RolloutStatus | None = (await self.status(rollout_id)).status
            seen = f"GET /rollout/{rollout_id}/status reports it {status.value!r}"
        except (httpx.HTTPError, RolloutProtocolError) as exc:
            status = None
            seen = f"its status could not be read ({type(exc).__name__}: {exc})"
        return RolloutLeaseLostError(
            f"POST /rollout for rollout {rollout_id!r} was admitted, but its answer was lost: "
            f"the connection closed before the answer came, and the resend got 409 for this "
            f"rollout id; {seen}. Its polling lease was in the lost answer, and this server "
            f"does not hand it back to a resend, so it cannot be polled: cancel it and run "
            f"the work again under a new rollout_id",
            rollout_id=rollout_id,
            rollout_status=status,
        )

    @staticmethod
    def _parse_lease(response: _Answer, rollout_id: str) -> RolloutInitResponse:
        try:
            lease = RolloutInitResponse.model_validate_json(response.content)
        except ValidationError as exc:
            raise RolloutProtocolError(
                f"POST /rollout for rollout {rollout_id!r} answered 202 without a polling "
                f"lease (body {response.text[:200]!r}); is this a callback-generation (0.3.0) "
                f"server? ({exc.error_count()} validation errors)",
                status_code=response.status_code,
            ) from exc
        if lease.rollout_id != rollout_id:
            raise RolloutProtocolError(
                f"POST /rollout for rollout {rollout_id!r} answered a lease for "
                f"rollout {lease.rollout_id!r}",
                status_code=response.status_code,
            )
        return lease

    async def run_rollout_async(
        self,
        initial_messages: Sequence[Mapping[str, Any]],
        chat_completions_url: str,
        **options: Unpack[SubmitOptions],
    ) -> RolloutResultResponse:
        """:meth:`submit` (same keywords), then wait for the terminal result."""
        handle = await self.submit(initial_messages, chat_completions_url, **options)
        return await handle.wait_for_completion()

    async def cancel_rollout(self, rollout_id: str) -> CancelDisposition:
        """Cancel one rollout (bounded to 5 s); returns its disposition."""
        async with asyncio.timeout(CANCEL_BOUND_SEC):
            response = await self.cancel(ids=[rollout_id])
        return response.dispositions.get(rollout_id, "not_found")

    async def cancel(
        self, ids: Sequence[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> CancelRolloutsResponse:
        """``POST /rollout/cancel`` with exactly one selector."""
        if (ids is not None) + (prefix is not None) + bool(all) != 1:
            raise UsageError("cancel() takes exactly one selector: ids=, prefix= or all=True")
        body: dict[str, Any] = {"all": True} if all else {}
        if ids is not None:
            body["ids"] = list(ids)
        if prefix is not None:
            body["prefix"] = prefix
        # Cancelling is idempotent (a second cancel answers the first disposition).
        response = await self._request("POST", "/rollout/cancel", json=body, idempotent=True)
        if response.status_code != 200:
            raise _unexpected(response, "POST /rollout/cancel")
        return _parse(CancelRolloutsResponse, response, "POST /rollout/cancel")

    async def status(self, rollout_id: str) -> RolloutStatusResponse:
        """``GET /rollout/{id}/status`` (served for callback-generation progress)."""
        what = f"GET /rollout/{rollout_id}/status"
        response = await self._request("GET", f"/rollout/{quote(rollout_id, safe='')}/status")
        if response.status_code != 200:
            raise _unexpected(response, what)
        return _parse(RolloutStatusResponse, response, what)

    # -- server state ----------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """The ``GET /health`` body."""
        response = await self._request("GET", "/health")
        if response.status_code != 200:
            raise _unexpected(response, "GET /health")
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise RolloutProtocolError(
                f"GET /health answered a non-object body: {response.text[:200]!r}",
                status_code=response.status_code,
            )
        return body

    async def generation(self) -> Generation:
        """The protocol generation the server speaks, from its ``/health``: a body with
        ``process_id`` and ``lifecycle`` is a polling server's, any other a callback one's."""
        body = await self.health()
        return "polling" if "process_id" in body and "lifecycle" in body else "callback"

    async def wait_idle(
        self,
        timeout_sec: float = 120.0,
        poll_interval_sec: float = 1.0,
        process_id: str | None = None,
    ) -> dict[str, Any]:
        """Wait until the server reports no active rollouts; returns the last health body.

        The server must report ``process_id`` and ``lifecycle.active_rollouts``; a
        ``process_id`` different from ``process_id`` (or from the first one seen) means the
        server restarted and raises :class:`RolloutProtocolError`. Raises ``TimeoutError``
        after ``timeout_sec``.
        """
        deadline = time.monotonic() + timeout_sec
        while True:
            body = await self.health()
            seen = body.get("process_id")
            lifecycle = body.get("lifecycle")
            active = lifecycle.get("active_rollouts") if isinstance(lifecycle, dict) else None
            if not isinstance(seen, str) or not isinstance(active, int):
                raise RolloutProtocolError(
                    "GET /health lacks process_id or lifecycle.active_rollouts: this server "
                    "cannot report idleness (is it older than the polling protocol?)"
                )
            if process_id is None:
                process_id = seen
            elif seen != process_id:
                raise RolloutProtocolError(
                    f"rollout server restarted while waiting for it to go idle: process_id "
                    f"changed from {process_id!r} to {seen!r}"
                )
            if active == 0:
                return body
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(
                    f"rollout server still had {active} active rollouts after {timeout_sec:g}s"
                )
            await asyncio.sleep(min(poll_interval_sec, remaining))


class RolloutHandle:
    """One admitted rollout. Await it (or :meth:`wait_for_completion`) for the result.

    Waiters share one poll at a time; the lease is renewed by each poll.
    """

    def __init__(
        self,
        client: RolloutClient,
        send: _Send,
        lease: RolloutInitResponse,
        submitted_at: float,
    ) -> None:
        self.rollout_id = lease.rollout_id
        self.lease = lease
        self.status: RolloutStatus = lease.status
        self.latest_result: RolloutResultResponse | None = None
        self._client = client
        self._send = send
        self._lease_deadline = submitted_at + lease.polling_lease_timeout_sec
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"RolloutHandle(rollout_id={self.rollout_id!r}, status={self.status.value!r})"

    def done(self) -> bool:
        """``True`` once a terminal result has been received."""
        return self.status.is_terminal

    async def wait_for_running(self) -> RolloutResultResponse | None:
        """Wait until the rollout has left ``queued``; returns the latest result."""
        return await self._wait_until(lambda s: s != RolloutStatus.QUEUED)

    async def wait_for_grading(self) -> RolloutResultResponse | None:
        """Wait until the rollout is grading or finished; returns the latest result."""
        return await self._wait_until(lambda s: s == RolloutStatus.GRADING or s.is_terminal)

    async def wait_for_completion(self) -> RolloutResultResponse:
        """Poll until the rollout is terminal; returns the terminal result."""
        result = await self._wait_until(lambda s: s.is_terminal)
        assert result is not None  # a terminal status only ever comes from a result
        return result

    def __await__(self) -> Generator[Any, None, RolloutResultResponse]:
        return self.wait_for_completion().__await__()

    async def cancel(self) -> CancelDisposition:
        """Ask the server to cancel this rollout; await the handle for the final result."""
        return await self._client.cancel_rollout(self.rollout_id)

    async def _wait_until(
        self, reached: Callable[[RolloutStatus], bool]
    ) -> RolloutResultResponse | None:
        while not reached(self.status):
            async with self._lock:
                if reached(self.status):
                    break
                self._record(await self._poll())
        return self.latest_result

    def _record(self, result: RolloutResultResponse) -> None:
        self.latest_result = result
        self.status = result.status

    async def _poll(self) -> RolloutResultResponse:
        path = f"/rollout/{quote(self.rollout_id, safe='')}/result"
        what = f"GET /rollout/{self.rollout_id}/result"
        timeout = httpx.Timeout(
            self._client.timeout, read=self.lease.result_wait_timeout_sec + POLL_READ_MARGIN_SEC
        )
        headers = {POLLING_LEASE_HEADER: self.lease.polling_lease_token}
        delays = {"transport": iter(TRANSPORT_RETRY_DELAYS), "gateway": iter(GATEWAY_RETRY_DELAYS)}

        async def backoff(kind: str) -> bool:
            delay = next(delays[kind], None)  # never sleep past the local lease deadline
            if delay is None or time.monotonic() + delay >= self._lease_deadline:
                return False
            await asyncio.sleep(delay)
            return True

        while True:
            started = time.monotonic()
            try:
                response = await self._send("GET", path, headers=headers, request_timeout=timeout)
            except _TRANSPORT_ERRORS:
                if await backoff("transport"):
                    continue
                raise
            if response.status_code in _GATEWAY_STATUSES:
                if await backoff("gateway"):
                    continue
                raise _unexpected(response, f"{what} (retries spent or the lease would lapse)")
            if response.status_code != 200:
                raise _unexpected(response, what)
            result = _parse(RolloutResultResponse, response, what)
            if result.rollout_id != self.rollout_id:
                raise RolloutProtocolError(
                    f"{what} answered the result of rollout {result.rollout_id!r}",
                    status_code=response.status_code,
                )
            self._lease_deadline = started + self.lease.polling_lease_timeout_sec
            return result
