"""``osmosis train run --ray`` benchmark: step time on Ray against the embedded path.

The same run (the copy-digit template's config, tiny model, same seed and data order, 8
prompts x 8 samples a step, each run warming up alike) three ways:

* ``embedded``: ``osmosis train run`` in one process (the baseline);
* ``ray-1x1``: ``--ray`` on a local two-node cluster with 1 trainer worker and 1 rollout
  server (the issue's target: at most 1.3x the embedded step time);
* ``ray-2x2``: 2 trainer workers (gloo DDP) over 2 rollout servers, for the record (on two
  cores the two workers share the cores the one worker had).

Step time is the median wall time between consecutive steps' metrics records (everything a
step costs: rollouts, update, the step's bookkeeping), with the part the trainer waited for
its rollouts beside it; the first steps are left out (Ray's workers and TRL warm up there).
Ray's own start-up is reported apart: the cluster (head and worker until both are live) and
each ``--ray`` run's time from its start to its first step.

    python bench/train_ray.py [--steps 30] [--repeat 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

SKIP = 3  # first steps left out of the median


def prepare(root: Path) -> Path:
    """The copy-digit template's workspace and tiny model; ``bench.toml`` is its training
    config (8 prompts x 8 samples a step, 60 warm-up steps) without validations and
    checkpoints, which would time the run's bookkeeping rather than its steps."""
    from osmosis_ai.train.demo import setup_workspace
    from osmosis_ai.train.tiny_model import build_tiny_model

    setup_workspace(root)
    build_tiny_model(root / "models" / "tiny")
    training = root / "configs" / "training"
    text = (training / "copy-digit.toml").read_text()
    for key in ("eval_interval", "checkpoint_save_freq"):
        text, found = re.subn(rf"(?m)^{key} = \d+$", f"{key} = 0", text)
        assert found == 1, f"the template's config has no single {key}"
    (training / "bench.toml").write_text(text)
    return root


def run(root: Path, name: str, steps: int, **ray: Any) -> dict[str, Any]:
    from osmosis_ai.train.plan import TrainRunOptions
    from osmosis_ai.train.runner import run_training

    options = TrainRunOptions(
        config_path=root / "configs" / "training" / "bench.toml",
        cwd=root,
        name=name,
        max_steps=steps,
        eval_rows=0,
        torch_threads=1,
        handle_signals=False,
        resume_every=steps,
        **ray,
    )
    began = time.monotonic()
    result = run_training(options)
    wall = time.monotonic() - began
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    times = [datetime.fromisoformat(r["time"]).timestamp() for r in records]
    gaps = [b - a for a, b in itertools.pairwise(times)][SKIP:]
    waits = [float(r.get("rollout_wait_seconds") or 0.0) for r in records[1:]][SKIP:]
    first = times[0] - (time.time() - wall)  # from the call's start to the first step
    return {
        "status": result.status,
        "steps": result.steps_done,
        "wall_s": round(wall, 2),
        "start_to_first_step_s": round(first, 2),
        "step_s_median": round(statistics.median(gaps), 4),
        # the part of a step the trainer waited for its rollouts; the rest is the update and
        # the step's bookkeeping (with dispatch-ahead most rollouts run during the update)
        "rollout_wait_s_median": round(statistics.median(waits), 4),
        "rollouts_per_step": records[-1].get("rollouts"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps of each run")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the three runs")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    from osmosis_ai.distributed.cluster import LocalCluster, connect

    report: dict[str, Any] = {"loadavg_start": os.getloadavg(), "rounds": []}
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-train-ray-") as tmp:
        root = prepare(Path(tmp) / "ws")  # (each run warms up alike: same seed and rows)
        cluster = LocalCluster()
        began = time.monotonic()
        cluster.start()
        try:
            with connect(cluster.address, auth_token=cluster.auth_token) as connection:
                connection.wait_for_nodes(len(cluster.nodes))
                report["cluster_start_s"] = round(time.monotonic() - began, 2)
                for round_ in range(args.repeat):
                    figures = {
                        "embedded": run(root, f"embedded-{round_}", args.steps),
                        "ray-1x1": run(
                            root,
                            f"ray1-{round_}",
                            args.steps,
                            ray_address=cluster.address,
                            trainer_workers=1,
                            rollout_servers=1,
                        ),
                        "ray-2x2": run(
                            root,
                            f"ray2-{round_}",
                            args.steps,
                            ray_address=cluster.address,
                            trainer_workers=2,
                            rollout_servers=2,
                        ),
                    }
                    base = figures["embedded"]["step_s_median"]
                    for name in ("ray-1x1", "ray-2x2"):
                        figures[name]["step_ratio_vs_embedded"] = round(
                            figures[name]["step_s_median"] / base, 3
                        )
                    report["rounds"].append(figures)
                    for name, f in figures.items():
                        ratio = f.get("step_ratio_vs_embedded")
                        shown = f"  x{ratio}" if ratio is not None else ""
                        print(
                            f"round {round_} {name:9s} step {f['step_s_median']:.3f}s{shown}  "
                            f"(rollout wait {f['rollout_wait_s_median']:.3f}s)  "
                            f"start->first step {f['start_to_first_step_s']}s  "
                            f"wall {f['wall_s']}s  rollouts/step {f['rollouts_per_step']}"
                        )
        finally:
            cluster.stop()
    ratios = [r["ray-1x1"]["step_ratio_vs_embedded"] for r in report["rounds"]]
    report["ray_1x1_ratio_median"] = statistics.median(ratios)
    report["loadavg_end"] = os.getloadavg()
    print(
        f"Ray start-up: cluster {report['cluster_start_s']}s; "
        f"ray-1x1 / embedded step time: {report['ray_1x1_ratio_median']:.3f} (target <= 1.3)"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
