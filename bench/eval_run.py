"""``osmosis eval run`` benchmark: start-up latency and eval throughput, with two references.

In a temporary workspace holding the bare rollout (``bench/rollouts/bare/main.py``, which
needs nothing beyond this interpreter: the fast path) and the scripted model
(``bench/scripted_model.py``: a multiply tool call, then ``#### 42``):

* start → first dispatch: wall time from spawning ``osmosis eval run`` to the run log's
  ``first rollout dispatched`` line (target <= 1.5 s), median of ``--starts`` runs;
* eval throughput: work items per second between the first dispatch and the last result
  of one ``osmosis eval run`` of ``--rows`` rows at each ``--concurrency``;
* beside it, the rollout-server benchmark's figure at the same concurrency
  (``bench/loadgen.py`` driving the bare server directly), and a direct-to-model baseline
  (the same two chat calls per rollout straight to the scripted model, no server at all).

    python bench/eval_run.py [--starts 3] [--rows 1000] [--concurrency 16,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from osmosis_ai.testing.serving import free_port
from rollout_server import Processes, wait_healthy

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable
TARGET_START_S = 1.5
WIDTHS = (5, 13, 17, 17, 12)
CONFIG = """\
[experiment]
rollout = "bare"
entrypoint = "main.py"
model_path = "openai/scripted"
dataset = "bare"

[secrets]
required = []
"""


def make_workspace(root: Path, rows: int) -> Path:
    shutil.copytree(BENCH / "rollouts" / "bare", root / "rollouts" / "bare")
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "configs" / "eval" / "bare.toml").write_text(CONFIG)
    (root / "data").mkdir()
    row = json.dumps({"user_prompt": "What is 6 * 7?", "ground_truth": "42"}) + "\n"
    (root / "data" / "bare.jsonl").write_text(row * rows)
    return root


def log_time(line: str) -> float:
    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()


def eval_run(workspace: Path, model_url: str, name: str, *flags: str) -> dict[str, Any]:
    """One ``osmosis eval run``; its envelope, and the start / dispatch / result times."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["OPENAI_BASE_URL"] = f"{model_url}/v1"
    command = [PYTHON, "-m", "osmosis_ai.cli.main", "eval", "run", "configs/eval/bare.toml"]
    started = time.time()
    done = subprocess.run(
        [*command, "-y", "--json", "--name", name, *flags],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"osmosis eval run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    logs = (workspace / ".osmosis" / "evals" / name / "logs.txt").read_text().splitlines()
    first = next(log_time(line) for line in logs if "first rollout dispatched" in line)
    results = [log_time(line) for line in logs if " [result] " in line]
    marks = {
        step: next((log_time(line) - started for line in logs if text in line), None)
        for step, text in (
            ("server_spawned", "starting rollout server"),
            ("model_checked", "model answered"),
            ("server_healthy", "rollout server healthy"),
        )
    }
    return {
        "envelope": json.loads(done.stdout),
        "start_to_dispatch_s": first - started,
        "dispatch_window_s": max(results) - first if results else None,
        "results": len(results),
        "marks_s": marks,
    }


async def direct_model(model_url: str, concurrency: int, duration: float) -> float:
    """Rollouts per second when the two chat calls of a bare rollout go straight to the model."""
    done = 0
    stop = time.perf_counter() + duration
    url = f"{model_url}/v1/chat/completions"
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal done
        while time.perf_counter() < stop:
            messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 6 * 7?"}]
            for _ in range(2):
                body = {"model": "scripted", "messages": messages}
                reply = (await client.post(url, json=body)).json()["choices"][0]["message"]
                messages.append(reply)
                for call in reply.get("tool_calls") or []:
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "42"})
            done += 1

    # One small client per 8 workers, as loadgen does: httpx's pool is O(connections²).
    clients = [
        httpx.AsyncClient(limits=limits, timeout=60, verify=False)
        for _ in range(-(-concurrency // 8))
    ]
    try:
        began = time.perf_counter()
        await asyncio.gather(*(worker(clients[i // 8]) for i in range(concurrency)))
        return done / (time.perf_counter() - began)
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))


def loadgen(procs: Processes, model_url: str, concurrency: int, artifacts: Path) -> float:
    """The rollout-server benchmark's rollouts/s: loadgen against the bare server directly."""
    port = free_port()
    env = {"_OSMOSIS_ROLLOUT_PORT": str(port), "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(artifacts)}
    server = procs.start("bare", [PYTHON, str(BENCH / "rollouts" / "bare" / "main.py")], env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server, "bare rollout server")
        argv = [PYTHON, str(BENCH / "loadgen.py"), "--url", url, "--generation", "polling"]
        argv += ["--concurrency", str(concurrency), "--duration", "4", "--warmup", "1"]
        argv += ["--chat-url", f"{model_url}/v1", "--expect-reward", "1"]
        out = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=BENCH.parent)
        return float(json.loads(out.stdout.strip().splitlines()[-1])["rollouts_per_s"])
    finally:
        procs.stop(server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=3, help="start-up samples (median shown)")
    parser.add_argument("--rows", type=int, default=1000, help="rows of the throughput runs")
    parser.add_argument("--concurrency", default="16,64", help="comma-separated in-flight limits")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    report: dict[str, Any] = {"loadavg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-eval-") as tmp:
        root = Path(tmp)
        (root / "logs").mkdir()
        procs = Processes(root / "logs")
        try:
            model_port = free_port()
            model = procs.start(
                "model", [PYTHON, str(BENCH / "scripted_model.py"), "--port", str(model_port)]
            )
            model_url = f"http://127.0.0.1:{model_port}"
            wait_healthy(model_url, model, "scripted model")
            workspace = make_workspace(root / "ws", max(args.rows, 4))

            starts = [
                eval_run(workspace, model_url, f"start-{i}", "--rows", "0-3")
                for i in range(args.starts)
            ]
            median = statistics.median(s["start_to_dispatch_s"] for s in starts)
            report["start"] = {"median_s": median, "samples": starts}
            verdict = "met" if median <= TARGET_START_S else "MISSED"
            print(
                f"start -> first dispatch (fast path): median {median:.2f} s over {len(starts)}"
                f"  (target <= {TARGET_START_S} s: {verdict})"
            )
            for key, value in starts[len(starts) // 2]["marks_s"].items():
                print(f"    {key:15s} at {value:.2f} s" if value is not None else f"    {key}: -")
            # Every sample, in order: on a shared machine the spread says how far to trust it.
            samples = " ".join(f"{s['start_to_dispatch_s']:.2f}" for s in starts)
            print(f"    {'samples':15s} {samples} s")

            heads = ("conc", "eval run r/s", "server bench r/s", "direct model r/s", "eval/server")
            print("\n" + " ".join(f"{h:>{w}}" for h, w in zip(heads, WIDTHS, strict=True)))
            report["throughput"] = []
            for level in levels:
                run = eval_run(workspace, model_url, f"tp-{level}", "--max-in-flight", str(level))
                assert run["envelope"]["resource"]["succeeded"] == args.rows, run["envelope"]
                eval_rate = run["results"] / run["dispatch_window_s"]
                server_rate = loadgen(procs, model_url, level, root / "artifacts")
                direct = asyncio.run(direct_model(model_url, level, 4.0))
                report["throughput"].append(
                    {
                        "concurrency": level,
                        "eval_run": eval_rate,
                        "server_bench": server_rate,
                        "direct_model": direct,
                    }
                )
                print(
                    f"{level:>5} {eval_rate:>13.1f} {server_rate:>17.1f} {direct:>17.1f}"
                    f" {eval_rate / server_rate:>12.0%}"
                )
        finally:
            procs.stop_all()
    report["loadavg_end"] = os.getloadavg()
    start, end = report["loadavg_start"][0], report["loadavg_end"][0]
    print(f"\nload average: start {start:.2f}, end {end:.2f} on {os.cpu_count()} cores")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
