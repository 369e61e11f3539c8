"""Isolation start-up benchmark: a rollout server started contained (bubblewrap, as a platform
run starts it) against the same server started plainly, back to back in one run.

Each start is ``RolloutServerProcess.start()`` of ``bench/rollouts/bare/main.py`` (spawn,
then ``/health`` answering with our instance id) followed by its stop; the two kinds
alternate so that machine noise falls on both. The contained starts use the policy a
platform run gets (:func:`osmosis_ai.platform.worker.execute.contain_policy`): the data dir,
home and keys hidden, the checkout read-only, uid 65534 outside when run as root.

Prints the median start of each kind, their difference and ratio (target: the difference
<= 300 ms)::

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


def start_once(artifacts: Path, *, contained: str | None) -> float:
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
    server.stop()
    return took


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
        start_once(work_dir / "warm", contained=None)  # page cache, imports
        start_once(work_dir / "warm", contained=contained)
        for index in range(args.starts):
            plain.append(start_once(work_dir / f"plain-{index}", contained=None))
            boxed.append(start_once(work_dir / f"boxed-{index}", contained=contained))
    plain_ms = statistics.median(plain) * 1000
    boxed_ms = statistics.median(boxed) * 1000
    print(f"rollout server start, median of {args.starts} each (bare rollout, /health ready):")
    print(f"  uncontained {plain_ms:7.1f} ms   (each: {[round(t * 1000) for t in plain]})")
    print(f"  contained   {boxed_ms:7.1f} ms   (each: {[round(t * 1000) for t in boxed]})")
    print(
        f"  isolation adds {boxed_ms - plain_ms:+.1f} ms, ratio {boxed_ms / plain_ms:.2f} "
        f"(target: adds <= {TARGET_MS:.0f} ms)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
