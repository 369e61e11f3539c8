"""``osmosis eval run --ray`` benchmark: Ray's start-up, and eval throughput over a fleet.

On a local two-node Ray cluster (``LocalCluster``: 127.0.0.2 head, 127.0.0.3 worker, each its
own ``ray start``), with the bare rollout and the scripted model of ``bench/eval_run.py``:

* Ray's own start-up, reported apart: the cluster (head, then worker, until both are live)
  and each ``--ray`` run's time from its start to the first dispatch (joining the cluster,
  starting the actors and their servers);
* eval throughput: work items per second between the first dispatch and the last result,
  for one server started as today (the baseline, no Ray), then the fleet with 1 and 2
  rollout servers at the same ``--max-in-flight``;
* with ``--cpu-ms N`` each rollout's workflow also computes for N ms of CPU (a CPU-bound
  agent: one server is bound by its one core), where two servers on two cores should
  approach twice one (the issue's target: at least 1.6x).

    python bench/eval_ray.py [--rows 400] [--concurrency 32] [--cpu-ms 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from eval_run import BENCH, eval_run, make_workspace
from osmosis_ai.distributed.cluster import LocalCluster, connect
from osmosis_ai.testing.serving import free_port
from rollout_server import Processes, wait_healthy


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=400, help="rows of each throughput run")
    parser.add_argument("--concurrency", type=int, default=32, help="rollouts in flight")
    parser.add_argument(
        "--cpu-ms", type=float, default=0.0, help="CPU time each rollout's workflow computes"
    )
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {"loadavg_start": os.getloadavg()}
    flags = ("--max-in-flight", str(args.concurrency))
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-ray-") as tmp:
        root = Path(tmp)
        (root / "logs").mkdir()
        procs = Processes(root / "logs")
        cluster = LocalCluster()
        try:
            model_port = free_port()
            model = procs.start(
                "model",
                [sys.executable, str(BENCH / "scripted_model.py"), "--port", str(model_port)],
            )
            model_url = f"http://127.0.0.1:{model_port}"
            wait_healthy(model_url, model, "scripted model")
            workspace = make_workspace(root / "ws", args.rows)
            if args.cpu_ms:  # (the fleet's servers get the config's [env], not ours)
                config = workspace / "configs" / "eval" / "bare.toml"
                env = f'\n[env]\nBENCH_WORKFLOW_CPU_MS = "{args.cpu_ms:g}"\n'
                config.write_text(config.read_text() + env)
            report["cpu_ms"] = args.cpu_ms

            began = time.monotonic()
            cluster.start()
            head_up = time.monotonic() - began
            with connect(cluster.address, auth_token=cluster.auth_token) as connection:
                connection.wait_for_nodes(len(cluster.nodes))
            both_live = time.monotonic() - began
            report["cluster_start_s"] = {"head": head_up, "both_nodes": both_live}
            print(f"Ray start-up: head {head_up:.1f} s, both nodes live {both_live:.1f} s")

            runs = [("one server, no Ray", ()), ("--ray, 1 server", ("1",))]
            runs.append(("--ray, 2 servers", ("2",)))
            runs.append(("one server, again", ()))  # the drift of a shared machine, in view
            rates: list[float] = []
            print(f"\n{'run':22s} {'start->dispatch s':>18s} {'items/s':>9s} {'vs one':>7s}")
            for index, (label, servers) in enumerate(runs):
                fleet = ("--ray", cluster.address, "--rollout-servers", *servers) if servers else ()
                run = eval_run(workspace, model_url, f"run-{index}", *flags, *fleet)
                assert run["envelope"]["resource"]["succeeded"] == args.rows, run["envelope"]
                rate = run["results"] / run["dispatch_window_s"]
                rates.append(rate)
                report[label] = {
                    "items_per_s": rate,
                    "start_to_dispatch_s": run["start_to_dispatch_s"],
                }
                print(
                    f"{label:22s} {run['start_to_dispatch_s']:>18.2f} {rate:>9.1f}"
                    f" {rate / rates[0]:>7.2f}"
                )
        finally:
            cluster.stop()
            procs.stop_all()
    report["loadavg_end"] = os.getloadavg()
    start, end = report["loadavg_start"][0], report["loadavg_end"][0]
    print(f"\nload average: start {start:.2f}, end {end:.2f} on {os.cpu_count()} cores")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
