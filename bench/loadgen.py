"""Protocol-level load generator: drives any rollout server by URL, in either generation.

Closed loop: ``--concurrency`` workers each submit a rollout (fresh uuid4 id), wait for its
terminal result, then submit the next. Polling generation: ``POST /rollout``, then long-poll
``GET /rollout/{id}/result`` with the lease. Callback generation: a callback receiver runs
in this process on 127.0.0.1 and the grader callback ends the rollout. Latency is submit to
terminal result. After ``--warmup`` seconds the window opens: successes finishing inside it
give the throughput; latency and errors cover every rollout finishing after it opens, those
in flight at its end followed to their end. It lasts ``--duration`` s and until
``--min-rollouts`` and ``--concurrency`` rollouts finished in it (at most 3x the duration,
or the duration + 6 s).
Prints one JSON line::

    python bench/loadgen.py --url http://127.0.0.1:8000 --generation polling \\
        --concurrency 64 --duration 5 --chat-url http://127.0.0.1:9000/v1
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import secrets
import sys
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from osmosis_ai.rollout.http1 import LeanTransport

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TERMINAL = frozenset({"success", "failure", "cancelled"})
LEASE_HEADER = "X-Osmosis-Rollout-Lease"
MAX_ADMISSION_TRIES = 50
MAX_POLLS = 10_000
MAX_RETRY_AFTER_SEC = 5.0
WORKERS_PER_CLIENT = 8
GENERATORS = ("httpx", "lean")
_JSON = {"content-type": "application/json"}


class RolloutError(Exception):
    """One rollout failed; ``kind`` is the bucket it is counted in."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


@dataclass
class Options:
    url: str
    generation: str
    concurrency: int
    duration: float
    warmup: float
    min_rollouts: int
    chat_url: str
    timeout: float
    expect_reward: float | None
    generator: str = "httpx"
    llm_api_key: str = "bench-llm-key"


@dataclass
class Window:
    """What the measuring window saw.

    Throughput counts successes finishing inside the window; latencies and errors cover every
    rollout finishing after the window opened, those in flight at its end followed to their
    end (so rollouts slower than the window are not left out).
    """

    opened: bool = False
    recording: bool = False
    started: float = 0.0
    ended: float = 0.0
    finished_inside: int = 0
    finished_total: int = 0
    succeeded_inside: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)
    retried: int = 0
    submitted: int = 0
    polls: int = 0

    def record(self, latency: float, error: RolloutError | None) -> None:
        self.finished_total += 1
        if self.recording:
            self.finished_inside += 1
            self.succeeded_inside += error is None
        if not self.opened:
            return
        if error is None:
            self.latencies.append(latency)
        else:
            self.errors[error.kind] += 1
            self.examples.setdefault(error.kind, str(error)[:300])


class Receiver:
    """Raw ASGI callback receiver: ``POST /cb/{rollout_id}/completion|grader``."""

    def __init__(self, api_key: str) -> None:
        self.expected = f"Bearer {api_key}".encode()
        self.pending: dict[str, asyncio.Future[tuple[str | None, dict[str, Any]]]] = {}
        self.completions: dict[str, str | None] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        raw = await _read(receive)
        parts = scope["path"].split("/")
        if scope["method"] != "POST" or len(parts) != 4 or parts[1] != "cb":
            await _answer(send, 404, b'{"detail":"not found"}')
            return
        auth = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        if auth != self.expected:
            await _answer(send, 401, b'{"detail":"unauthorized"}')
            return
        rollout_id, kind = parts[2], parts[3]
        future = self.pending.get(rollout_id)
        if future is None:
            await _answer(send, 404, b'{"detail":"unknown rollout_id"}')
            return
        try:
            body = json.loads(raw)
        except ValueError:
            await _answer(send, 422, b'{"detail":"body is not JSON"}')
            return
        if kind == "completion":
            self.completions[rollout_id] = body.get("status")
        elif kind == "grader" and not future.done():
            future.set_result((self.completions.get(rollout_id), body))
        await _answer(send, 200, b'{"ok":true}')


async def _read(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


async def _answer(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json")]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Answer(Protocol):
    """What the generator reads of an answer (``httpx.Response`` and ``QuickAnswer`` both)."""

    @property
    def status_code(self) -> int: ...
    @property
    def text(self) -> str: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    def json(self) -> Any: ...


class Http(Protocol):
    async def post(self, url: str, content: bytes, headers: dict[str, str]) -> Answer: ...
    async def get(self, url: str, headers: dict[str, str]) -> Answer: ...


class HttpxHttp:
    """``--generator httpx`` (the default): one of several small httpx clients, shared by
    ``WORKERS_PER_CLIENT`` workers (httpcore's pool costs O(connections²) per request). About
    4 ms of CPU per polling rollout here: the ceiling is this generator's limit."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post(self, url: str, content: bytes, headers: dict[str, str]) -> Answer:
        return await self.client.post(url, content=content, headers=headers)

    async def get(self, url: str, headers: dict[str, str]) -> Answer:
        return await self.client.get(url, headers=headers)


class LeanHttp:
    """``--generator lean``: whole exchanges on keep-alive loopback connections (one per
    worker) of the package's HTTP/1.1 client, without httpx's client layer: 0.5 ms of CPU
    per polling rollout here instead of httpx's 4.0, which leaves the two cores to the
    servers being compared. Failures are httpx's exceptions."""

    def __init__(self, connections: int, timeout: float) -> None:
        self.transport = LeanTransport(max_connections=connections)
        self.timeouts = {"connect": 10.0, "pool": timeout, "read": timeout}

    async def post(self, url: str, content: bytes, headers: dict[str, str]) -> Answer:
        return await self.transport.quick(
            "POST", url, headers=headers, content=content, timeouts=self.timeouts
        )

    async def get(self, url: str, headers: dict[str, str]) -> Answer:
        return await self.transport.quick("GET", url, headers=headers, timeouts=self.timeouts)

    async def aclose(self) -> None:
        await self.transport.aclose()


class LoadGenerator:
    def __init__(self, opts: Options, window: Window) -> None:
        self.opts = opts
        self.window = window
        self.base = opts.url.rstrip("/")
        self.receiver: Receiver | None = None
        self.receiver_url = ""

    def _body(self, rollout_id: str) -> dict[str, Any]:
        return {
            "rollout_id": rollout_id,
            "initial_messages": [{"role": "user", "content": "What is 6 * 7?"}],
            "label": "42",
            "chat_completions_url": self.opts.chat_url,
            "llm_api_key": self.opts.llm_api_key,
        }

    async def _submit(self, http: Http, body: dict[str, Any]) -> Answer:
        payload = json.dumps(body).encode()
        for _ in range(MAX_ADMISSION_TRIES):
            response = await http.post(f"{self.base}/rollout", payload, _JSON)
            if response.status_code != 429:
                if response.status_code != 202:
                    raise RolloutError(f"submit_http_{response.status_code}", response.text[:200])
                return response
            if self.window.recording:
                self.window.retried += 1
            await asyncio.sleep(_retry_after(response))
        raise RolloutError("submit_429_exhausted", f"{MAX_ADMISSION_TRIES} tries")

    def _check(self, status: str | None, sample: dict[str, Any] | None) -> None:
        if status != "success":
            raise RolloutError(f"terminal_{status}", json.dumps(sample)[:200])
        if self.opts.expect_reward is not None:
            reward = None if sample is None else sample.get("reward")
            if reward != self.opts.expect_reward:
                raise RolloutError("wrong_reward", f"reward {reward!r}")

    async def polling_rollout(self, http: Http, rollout_id: str) -> None:
        response = await self._submit(http, self._body(rollout_id))
        lease = response.json()["polling_lease_token"]
        url = f"{self.base}/rollout/{rollout_id}/result"
        headers = {LEASE_HEADER: lease}
        for _ in range(MAX_POLLS):
            polled = await http.get(url, headers)
            if self.window.opened:
                self.window.polls += 1
            if polled.status_code != 200:
                raise RolloutError(f"poll_http_{polled.status_code}", polled.text[:200])
            result = polled.json()
            status = result.get("status")
            if status in TERMINAL:
                if status != "success":
                    detail = f"{result.get('err_category')}: {result.get('err_message')}"
                    raise RolloutError(f"terminal_{status}", detail)
                self._check(status, result.get("sample"))
                return
        raise RolloutError("too_many_polls", f"{MAX_POLLS} polls")

    async def callback_rollout(self, http: Http, rollout_id: str) -> None:
        assert self.receiver is not None
        future: asyncio.Future[tuple[str | None, dict[str, Any]]] = (
            asyncio.get_running_loop().create_future()
        )
        self.receiver.pending[rollout_id] = future
        try:
            body = self._body(rollout_id)
            base = f"{self.receiver_url}/cb/{rollout_id}"
            body["completion_callback_url"] = f"{base}/completion"
            body["grader_callback_url"] = f"{base}/grader"
            body["controller_api_key"] = self.opts.llm_api_key + "-controller"
            await self._submit(http, body)
            completion, graded = await future
            if completion != "success":
                raise RolloutError(f"completion_{completion}", str(graded.get("err_message")))
            if graded.get("status") != "success":
                detail = f"{graded.get('err_category')}: {graded.get('err_message')}"
                raise RolloutError(f"grader_{graded.get('status')}", detail)
            self._check("success", graded.get("sample"))
        finally:
            self.receiver.pending.pop(rollout_id, None)
            self.receiver.completions.pop(rollout_id, None)

    async def one(self, http: Http) -> None:
        rollout_id = uuid.uuid4().hex
        if self.opts.generation == "polling":
            await self.polling_rollout(http, rollout_id)
        else:
            await self.callback_rollout(http, rollout_id)

    async def worker(self, http: Http, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.perf_counter()
            error: RolloutError | None = None
            self.window.submitted += self.window.recording
            try:
                async with asyncio.timeout(self.opts.timeout):
                    await self.one(http)
            except RolloutError as exc:
                error = exc
            except TimeoutError:
                error = RolloutError("timeout", f"no terminal result in {self.opts.timeout:g}s")
            except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
                error = RolloutError(type(exc).__name__, str(exc))
            self.window.record(time.perf_counter() - started, error)
            if error is not None and error.kind != "timeout":
                await asyncio.sleep(0.01)  # do not spin on a server that refuses at once


def _retry_after(response: Answer) -> float:
    try:
        value = float(response.headers.get("retry-after", "1"))
    except ValueError:
        value = 1.0
    return min(max(value, 0.05), MAX_RETRY_AFTER_SEC)


def percentile(sorted_values: list[float], pct: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(pct / 100.0 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def run(opts: Options) -> dict[str, Any]:
    """Run one load cell and return its figures."""
    window = Window()
    async with contextlib.AsyncExitStack() as stack:
        https: list[Http]
        if opts.generator == "lean":
            lean = LeanHttp(opts.concurrency, opts.timeout)
            stack.push_async_callback(lean.aclose)
            https = [lean] * opts.concurrency
        else:
            # Several small pools, not one big one: httpcore's pool bookkeeping costs
            # O(connections²) per request, which would make the generator the bottleneck.
            limits = httpx.Limits(
                max_connections=WORKERS_PER_CLIENT * 2,
                max_keepalive_connections=WORKERS_PER_CLIENT * 2,
            )
            timeout = httpx.Timeout(opts.timeout, connect=10.0)
            clients = [
                # verify=False: plain HTTP only, and it spares loading the CA bundle per client
                await stack.enter_async_context(
                    httpx.AsyncClient(limits=limits, timeout=timeout, verify=False)
                )
                for _ in range(-(-opts.concurrency // WORKERS_PER_CLIENT))
            ]
            https = [HttpxHttp(clients[i // WORKERS_PER_CLIENT]) for i in range(opts.concurrency)]
        gen = LoadGenerator(opts, window)
        if opts.generation == "callback":
            from osmosis_ai.testing.serving import serve_in_task

            gen.receiver = Receiver(opts.llm_api_key + "-controller")
            gen.receiver_url = await stack.enter_async_context(
                serve_in_task(
                    gen.receiver, access_log=False, lifespan="off", timeout_keep_alive=600
                )
            )
        stop = asyncio.Event()
        begun = time.perf_counter()
        workers = [asyncio.create_task(gen.worker(http, stop)) for http in https]
        await asyncio.sleep(opts.warmup)
        window.opened = window.recording = True
        window.started = time.perf_counter()
        cpu_start = time.process_time()
        hard_end = window.started + max(opts.duration * 3, opts.duration + 6.0)
        # At least one rollout per worker, so a window cannot fall between two waves.
        enough = max(opts.min_rollouts, opts.concurrency)
        while True:  # bounded by hard_end
            now = time.perf_counter()
            done = window.finished_inside
            if (now - window.started >= opts.duration and done >= enough) or (now >= hard_end):
                break
            await asyncio.sleep(0.02)
        window.recording = False
        window.ended = time.perf_counter()
        cpu_used = time.process_time() - cpu_start
        stop.set()
        _done, pending = await asyncio.wait(workers, timeout=opts.timeout + 5.0)
        for task in pending:
            task.cancel()
        unfinished = len(pending)
        if unfinished:
            window.errors["unfinished"] += unfinished
        if pending:
            await asyncio.wait(pending, timeout=5.0)
    elapsed = window.ended - window.started
    latencies = sorted(window.latencies)
    errors = sum(window.errors.values())

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000.0, 2)

    return {
        "url": opts.url,
        "generation": opts.generation,
        "concurrency": opts.concurrency,
        "window_s": round(elapsed, 3),
        "total_s": round(time.perf_counter() - begun, 3),
        "completed": len(latencies),
        "submitted": window.submitted,
        "errors": errors,
        "error_kinds": dict(window.errors),
        "error_examples": window.examples,
        "retried_429": window.retried,
        "finished_in_window": window.finished_inside,
        "finished_total": window.finished_total,
        "unfinished_at_end": unfinished,
        "rollouts_per_s": round(window.succeeded_inside / elapsed, 2) if elapsed > 0 else 0.0,
        "p50_ms": ms(percentile(latencies, 50)),
        "p95_ms": ms(percentile(latencies, 95)),
        "p99_ms": ms(percentile(latencies, 99)),
        "mean_ms": ms(sum(latencies) / len(latencies)) if latencies else None,
        "max_ms": ms(latencies[-1]) if latencies else None,
        "generator_cpu_pct": round(100.0 * cpu_used / elapsed, 1) if elapsed > 0 else None,
        "polls_per_rollout": round(window.polls / len(latencies), 2) if latencies else None,
    }


def parse_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(
        description="Closed-loop load generator for a rollout server (either generation)."
    )
    parser.add_argument("--url", required=True, help="rollout server origin")
    parser.add_argument("--generation", choices=["polling", "callback"], required=True)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--duration", type=float, default=5.0, help="measuring window, seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured lead-in, seconds")
    parser.add_argument("--min-rollouts", type=int, default=20, help="window runs at least this")
    parser.add_argument("--chat-url", required=True, help="OpenAI base URL handed to rollouts")
    parser.add_argument("--timeout", type=float, default=60.0, help="per-rollout limit, seconds")
    parser.add_argument(
        "--expect-reward", type=float, default=None, help="count other rewards as errors"
    )
    parser.add_argument(
        "--generator",
        choices=GENERATORS,
        default="httpx",
        help="the HTTP client: httpx (default, ~4 ms CPU per rollout) or lean (~0.5 ms)",
    )
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.duration <= 0 or args.warmup < 0:
        parser.error("--concurrency must be >= 1, --duration > 0 and --warmup >= 0")
    return Options(
        url=args.url,
        generation=args.generation,
        concurrency=args.concurrency,
        duration=args.duration,
        warmup=args.warmup,
        min_rollouts=args.min_rollouts,
        chat_url=args.chat_url,
        timeout=args.timeout,
        expect_reward=args.expect_reward,
        generator=args.generator,
        llm_api_key=f"bench-{secrets.token_hex(8)}",
    )


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ModuleNotFoundError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        result = runner.run(run(opts))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
