"""Per-call overhead of the policy proxy: the scripted model server direct vs through the proxy.

Three processes on 127.0.0.1 (model server with 0 ms latency, proxy, this client); p50/p95
of sequential and 16-concurrent chat calls, stream false and true, measured in one run; then
the same question through the proxy's three APIs (chat completions, the OpenAI Responses
API, the Anthropic Messages API) one call at a time, each route's p50 overhead over the
direct call set beside chat completions' (target: within 0.2 ms of it):
``python bench/proxy_overhead.py [--calls 2000] [--block 100]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import httpx

from osmosis_ai.testing.serving import free_port

ROLLOUT = "bench"
TOKEN = "bench-token"
REPLY = "The answer is 42, computed by multiplying six by seven."


def serve(app: Any, port: int) -> None:
    import uvicorn

    # Long keep-alive: idle pooled connections must not be closed between measured blocks.
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=600,
    )


def serve_model(port: int) -> None:
    from osmosis_ai.testing.model_server import ScriptedModelServer

    serve(ScriptedModelServer([REPLY], on_exhausted="repeat_last"), port)


def serve_proxy(port: int, upstream_url: str) -> None:
    from osmosis_ai.controller import OpenAICompatibleUpstream, PolicyProxy

    proxy = PolicyProxy(OpenAICompatibleUpstream(upstream_url, None, "policy"), token=TOKEN)
    proxy.register(ROLLOUT)
    serve(proxy, port)


def start(argv: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, *argv], env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def wait_ready(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if (await client.get(url, headers=headers)).status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.05)
    raise TimeoutError(f"{url} did not come up")


QUESTION = "What is six times seven?"
# route -> (request body without "stream", what the last event of its stream holds)
ROUTES: dict[str, tuple[dict[str, Any], bytes]] = {
    "/chat/completions": (
        {"model": "osmosis-rollout", "messages": [{"role": "user", "content": QUESTION}]},
        b"data: [DONE]\n\n",
    ),
    "/responses": ({"model": "osmosis-rollout", "input": QUESTION}, b"event: response.completed\n"),
    "/v1/messages": (
        {
            "model": "osmosis-rollout",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": QUESTION}],
        },
        b'{"type":"message_stop"}\n\n',
    ),
}


async def one_call(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], ending: bytes
) -> float:
    started = time.perf_counter()
    response = await client.post(url, json=body)
    assert response.status_code == 200, response.text
    if body["stream"]:
        assert ending in response.content[-4096:], response.content[-200:]
    return (time.perf_counter() - started) * 1000.0


async def measure(
    client: httpx.AsyncClient,
    url: str,
    stream: bool,
    calls: int,
    concurrency: int,
    route: str = "/chat/completions",
) -> list[float]:
    template, ending = ROUTES[route]
    body = {**template, "temperature": 0.7, "stream": stream}
    url = url.removesuffix("/chat/completions") + route
    latencies: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            latencies.append(await one_call(client, url, body, ending))

    share = calls // concurrency
    await asyncio.gather(*(worker(share) for _ in range(concurrency)))
    return latencies


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc), or NaN elsewhere."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def cell(
    client: httpx.AsyncClient,
    urls: tuple[str, str],
    pids: tuple[int, int],
    stream: bool,
    calls: int,
    block: int,
    concurrency: int,
) -> str:
    """One table row: direct and proxied calls in alternating blocks, so drift in the
    machine's load hits both alike."""
    direct: list[float] = []
    proxied: list[float] = []
    cpu = [0.0, 0.0]
    for _ in range(max(1, calls // block)):
        for which, (url, samples) in enumerate(((urls[0], direct), (urls[1], proxied))):
            before = cpu_seconds(pids[which])
            samples.extend(await measure(client, url, stream, block, concurrency))
            cpu[which] += cpu_seconds(pids[which]) - before
    d50, d95, p50, p95 = pct(direct, 50), pct(direct, 95), pct(proxied, 50), pct(proxied, 95)
    return (
        f"{stream!s:<7}{concurrency:>5}  {d50:>10.3f}{d95:>8.3f}  {p50:>10.3f}{p95:>8.3f}  "
        f"{p50 - d50:>12.3f}{p95 - d95:>8.3f}  {cpu[0] * 1000 / len(direct):>9.3f}"
        f"{cpu[1] * 1000 / len(proxied):>9.3f}"
    )


async def routes(
    client: httpx.AsyncClient,
    urls: tuple[str, str],
    proxy_pid: int,
    stream: bool,
    calls: int,
    block: int,
) -> list[str]:
    """Rows of the API table at c=1: the direct chat call and each proxied route in
    alternating blocks; overhead is a route's p50 minus the direct p50, and the proxy's
    CPU per call is read from /proc around each block."""
    targets = [(urls[0], "/chat/completions"), *((urls[1], route) for route in ROUTES)]
    samples: list[list[float]] = [[] for _ in targets]
    cpu = [0.0 for _ in targets]
    for _ in range(max(1, calls // block)):
        for which, (url, route) in enumerate(targets):
            before = cpu_seconds(proxy_pid)
            samples[which].extend(await measure(client, url, stream, block, 1, route))
            cpu[which] += cpu_seconds(proxy_pid) - before
    direct = pct(samples[0], 50)
    chat = pct(samples[1], 50) - direct
    chat_cpu = cpu[1] * 1000 / len(samples[1])
    rows = []
    for which, (_url, route) in enumerate(targets[1:], start=1):
        values = samples[which]
        overhead = pct(values, 50) - direct
        per_call = cpu[which] * 1000 / len(values)
        rows.append(
            f"{stream!s:<7}{route:<18}  {direct:>10.3f}  {pct(values, 50):>10.3f}"
            f"{pct(values, 95):>8.3f}  {overhead:>12.3f}  {overhead - chat:>+10.3f}"
            f"  {per_call:>9.3f}  {per_call - chat_cpu:>+10.3f}"
        )
    return rows


async def run(calls: int, block: int, warmup: int, apis_only: bool) -> None:
    model_port, proxy_port = free_port(), free_port()
    model = start([__file__, "--serve-model", str(model_port)])
    model_url = f"http://127.0.0.1:{model_port}/v1"
    proxy = start([__file__, "--serve-proxy", str(proxy_port), "--upstream", model_url])
    proxy_url = f"http://127.0.0.1:{proxy_port}/v1/rollouts/{ROLLOUT}"
    urls = (model_url + "/chat/completions", proxy_url + "/chat/completions")
    auth = {"authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    try:
        async with httpx.AsyncClient(headers=auth, limits=limits, timeout=30) as client:
            await wait_ready(client, f"http://127.0.0.1:{model_port}/health", {})
            await wait_ready(client, f"{proxy_url}/models", auth)
            for url in urls:
                for stream in (False, True):
                    for route in ROUTES:
                        await measure(client, url, stream, warmup, 1, route)
            load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
            print(
                f"{calls} calls per target and row, alternating blocks of {block}; model server "
                f"latency 0 ms; {os.cpu_count()} CPUs (load average {load}); times in ms; server "
                "CPU per call from /proc"
            )
            print(
                f"{'stream':<7}{'conc':>5}  {'direct p50':>10}{'p95':>8}  {'proxy p50':>10}"
                f"{'p95':>8}  {'overhead p50':>12}{'p95':>8}  {'CPU model':>9}{'proxy':>9}"
            )
            for stream in () if apis_only else (False, True):
                for concurrency in (1, 16):
                    pids = (model.pid, proxy.pid)
                    print(await cell(client, urls, pids, stream, calls, block, concurrency))
            print()
            print("The proxy's three APIs at c=1 (the direct call is chat completions):")
            print(
                f"{'stream':<7}{'route':<18}  {'direct p50':>10}  {'proxy p50':>10}{'p95':>8}  "
                f"{'overhead p50':>12}  {'vs chat':>10}  {'proxy CPU':>9}  {'vs chat':>10}"
            )
            for stream in (False, True):
                for row in await routes(client, urls, proxy.pid, stream, calls, block):
                    print(row)
    finally:
        for process in (proxy, model):
            process.terminate()
            process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per target and row")
    parser.add_argument("--block", type=int, default=100, help="calls per alternating block")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--apis-only", action="store_true", help="only the table of the APIs")
    parser.add_argument("--serve-proxy", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--serve-model", type=int, metavar="PORT", help=argparse.SUPPRESS)
    parser.add_argument("--upstream", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_model:
        serve_model(args.serve_model)
        return
    if args.serve_proxy:
        serve_proxy(args.serve_proxy, args.upstream)
        return
    asyncio.run(run(args.calls, args.block, args.warmup, args.apis_only))


if __name__ == "__main__":
    main()
