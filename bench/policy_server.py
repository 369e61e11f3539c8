"""Throughput of the local policy: in-process calls vs the same model over HTTP, side by side.

Chat requests of n=8 x 32 tokens (sequential, then concurrent so the policy batches them),
measured in alternating blocks; then weight-update latency in-process and over
``POST /weights``: ``python bench/policy_server.py [--model-dir DIR] [--blocks 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch
from safetensors.torch import save

from osmosis_ai.controller.policy import LocalPolicy
from osmosis_ai.train.tiny_model import build_tiny_model

MESSAGES = [{"role": "user", "content": "Copy: 7"}]


def body(n: int, tokens: int) -> dict[str, Any]:
    return {"messages": MESSAGES, "n": n, "max_tokens": tokens, "temperature": 1.0}


def start_server(model_dir: Path, threads: int) -> tuple[subprocess.Popen[str], str]:
    argv = [sys.executable, "-m", "osmosis_ai.controller.policy", str(model_dir), "--seed", "0"]
    argv += ["--threads", str(threads)]
    server = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    url = server.stdout.readline().strip().removesuffix("/v1")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                return server, url
        except httpx.TransportError:
            time.sleep(0.1)
    server.terminate()
    raise TimeoutError("the policy server did not come up")


def run_block(call: Callable[[], int], requests: int, concurrency: int) -> tuple[int, float]:
    """Completion tokens made and seconds taken by ``requests`` calls, ``concurrency`` at once."""
    started = time.perf_counter()
    if concurrency == 1:
        made = sum(call() for _ in range(requests))
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            made = sum(pool.map(lambda _: call(), range(requests)))
    return made, time.perf_counter() - started


def throughput(policy: LocalPolicy, url: str, args: argparse.Namespace) -> None:
    request = body(args.n, args.tokens)
    client = httpx.Client(base_url=url, timeout=600)

    def local() -> int:
        return int(policy.chat(request)["usage"]["completion_tokens"])

    def remote() -> int:
        answer = client.post("/v1/chat/completions", json=request)
        answer.raise_for_status()
        return int(answer.json()["usage"]["completion_tokens"])

    local()  # warm both
    remote()
    print(
        f"chat n={args.n} x {args.tokens} tokens, {args.requests} requests per block, "
        f"{args.blocks} alternating blocks; {os.cpu_count()} CPUs, torch threads "
        f"{torch.get_num_threads()}"
    )
    print(
        f"{'concurrency':<12}{'in-process tok/s':>18}{'HTTP tok/s':>12}{'HTTP/in-process':>17}"
        f"{'s/request in-proc':>19}{'HTTP':>7}"
    )
    for concurrency in (1, args.concurrency):
        totals = {"local": [0, 0.0], "http": [0, 0.0]}
        for _ in range(args.blocks):
            for name, call in (("local", local), ("http", remote)):
                made, seconds = run_block(call, args.requests, concurrency)
                totals[name][0] += made
                totals[name][1] += seconds
        rate = {k: v[0] / v[1] for k, v in totals.items()}
        per = {k: v[1] / (args.requests * args.blocks) for k, v in totals.items()}
        print(
            f"{concurrency:<12}{rate['local']:>18.0f}{rate['http']:>12.0f}"
            f"{rate['http'] / rate['local']:>17.2f}{per['local']:>19.3f}{per['http']:>7.3f}"
        )
    client.close()


def weight_updates(policy: LocalPolicy, url: str, repeats: int) -> None:
    state = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    local: list[float] = []
    remote: list[float] = []
    with httpx.Client(base_url=url, timeout=600) as client:
        for _ in range(repeats):
            started = time.perf_counter()
            policy.load_state_dict(state)
            local.append(time.perf_counter() - started)
            started = time.perf_counter()
            client.post("/weights", content=save(state)).raise_for_status()
            remote.append(time.perf_counter() - started)
    size = sum(t.numel() * t.element_size() for t in state.values()) / 2**20
    print(
        f"weight update, whole model ({len(state)} tensors, {size:.1f} MiB), "
        f"p50 of {repeats}: in-process {statistics.median(local) * 1000:.1f} ms, "
        f"POST /weights (incl. serializing) {statistics.median(remote) * 1000:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="default: build the tiny model")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--requests", type=int, default=4, help="requests per block")
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--weight-repeats", type=int, default=20)
    parser.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch threads, here and in the server (default: torch's)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model_dir or build_tiny_model(Path(scratch) / "tiny")
        policy = LocalPolicy(model_dir, seed=0)
        server, url = start_server(model_dir, args.threads)
        try:
            throughput(policy, url, args)
            weight_updates(policy, url, args.weight_repeats)
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    main()
