"""Isolation start-up benchmark: a rollout server started contained (bubblewrap, as a platform
run starts it) against the same server started plainly, back to back in one run.

Each start is ``RolloutServerProcess.start()`` of ``bench/rollouts/bare/main.py`` (spawn,
then ``/health`` answering with our instance id) followed by its stop; the two kinds
alternate so that machine noise falls on both. The contained starts use the policy a
platform run gets (:func:`osmosis_ai.platform.worker.execute.contain_policy`): the data dir,
home and keys hidden, the checkout read-only, uid 65534 outside when run as root.

Prints the median start of each kind, their difference and ratio (target: the difference
<= 300 ms), and the CPU the server's process tree used to get healthy (on a busy machine the
wall times scatter by seconds; the CPU difference is what containment itself costs)::

    python bench/isolation_start.py [--starts 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from osmosis_ai.controller.containment import CONTAINMENT_ENV
from osmosis_ai.controller.rollout_process import RolloutServerProcess
from osmosis_ai.platform.settings import load_settings
from osmosis_ai.platform.worker.execute import RunSpec, contain_policy

BENCH = Path(__file__).resolve().parent
ROLLOUT = BENCH / "rollouts" / "bare"
TARGET_MS = 300.0


def start_once(artifacts: Path, *, contained: str | None) -> tuple[float, float]:
    """Wall seconds to a healthy server, and the CPU seconds its process tree used to get
    there (less sensitive than wall time to a busy machine)."""
    if contained is None:
        os.environ.pop(CONTAINMENT_ENV, None)
    else:
        os.environ[CONTAINMENT_ENV] = contained
    server = RolloutServerProcess(
        rollout_dir=ROLLOUT, entrypoint=ROLLOUT / "main.py", artifact_root=artifacts
    )
    began = time.perf_counter()
    server.start()
    took = time.perf_counter() - began
    assert server.process is not None
    cpu = _tree_cpu(server.process.pid)
    server.stop()
    return took, cpu


def _tree_cpu(pid: int) -> float:
    """User and system CPU seconds of ``pid`` and every process beneath it."""
    import psutil

    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description="contained vs. plain rollout server start")
    parser.add_argument("--starts", type=int, default=10)
    args = parser.parse_args()
    if shutil.which("bwrap") is None:
        print("bubblewrap (bwrap) is not installed: apt-get install bubblewrap", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp) / "platform"
        work_dir = data_dir / "work" / "runs" / "bench"
        checkout = work_dir / "checkout"
        checkout.mkdir(parents=True)
        settings = load_settings(data_dir=data_dir)
        spec = RunSpec(
            run_id="bench", kind="eval", worker_id="bench", attempt=1, resumed=False,
            data_dir=str(data_dir), database_url=settings.database_url,
            public_url=settings.public_url, work_dir=str(work_dir), job="bench:none",
            bwrap=shutil.which("bwrap") or "bwrap", sandbox_uid=settings.sandbox_uid,
        )  # fmt: skip
        policy = contain_policy(spec, settings, checkout)
        # The bench's rollout lives outside the checkout: let the contained server read it.
        policy = dataclasses.replace(policy, read_only=(*policy.read_only, str(BENCH)))
        contained = policy.to_json()
        plain: list[float] = []
        boxed: list[float] = []
        plain_cpu: list[float] = []
        boxed_cpu: list[float] = []
        start_once(work_dir / "warm", contained=None)  # page cache, imports
        start_once(work_dir / "warm", contained=contained)
        for index in range(args.starts):
            took, cpu = start_once(work_dir / f"plain-{index}", contained=None)
            plain.append(took)
            plain_cpu.append(cpu)
            took, cpu = start_once(work_dir / f"boxed-{index}", contained=contained)
            boxed.append(took)
            boxed_cpu.append(cpu)
    plain_ms = statistics.median(plain) * 1000
    boxed_ms = statistics.median(boxed) * 1000
    print(f"rollout server start, median of {args.starts} each (bare rollout, /health ready):")
    print(f"  uncontained {plain_ms:7.1f} ms   (each: {[round(t * 1000) for t in plain]})")
    print(f"  contained   {boxed_ms:7.1f} ms   (each: {[round(t * 1000) for t in boxed]})")
    print(
        f"  isolation adds {boxed_ms - plain_ms:+.1f} ms, ratio {boxed_ms / plain_ms:.2f} "
        f"(target: adds <= {TARGET_MS:.0f} ms)"
    )
    plain_cpu_ms = statistics.median(plain_cpu) * 1000
    boxed_cpu_ms = statistics.median(boxed_cpu) * 1000
    print(
        f"  CPU of the started processes: uncontained {plain_cpu_ms:.1f} ms, contained "
        f"{boxed_cpu_ms:.1f} ms, adds {boxed_cpu_ms - plain_cpu_ms:+.1f} ms "
        f"(ratio {boxed_cpu_ms / plain_cpu_ms:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
