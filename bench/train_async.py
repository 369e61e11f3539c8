"""Asynchronous training (``[training] max_staleness = K``) against the synchronous loop.

The workload (``--workload slow-tool``, the default) is a latency-bound agent on the
copy-digit task (``bench/rollouts/slow-tool``): after each model answer a tool waits
``--tool-ms`` (asyncio sleep), and with ``--turns 2`` its result goes back for a second
model call; the grader checks the final answer. ``--workload copy-digit`` runs the template's
one-call rollout instead. Every run starts from one warmed-up tiny model (prepared once, as
``train_loop.py`` does), with ``train_loop.py``'s batch, group and learning rate, and the runs
alternate K (0, 1, 0, 1, ...) within each seed (``[training] seed``), so a slow spell of a
shared machine falls on both sides alike.

From each run's ``metrics.jsonl``: the mean ``step_seconds`` (the first 2 steps left out),
the final reward (mean ``training_reward`` of the last 10 % of steps), the means of
``staleness_mean``, ``staleness_max``, ``logprob_mismatch`` and ``rollout_wait_seconds``
where the records carry them, and the reward per tenth of the run. Printed per seed and as a
median: step time K/K0 (target <= 0.6) and final reward K - K0 (target within 0.05).

    python bench/train_async.py [--steps 40] [--seeds 3] [--ks 0,1] [--tool-ms 250]
        [--turns 2] [--workload slow-tool|copy-digit] [--ray] [--json OUT]

``--ray`` runs the same comparison on a local two-node Ray cluster, 2 trainer workers over
2 rollout servers (as ``train_ray.py`` starts it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Generator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from train_loop import MAX_TOKENS, prepare, write_config

HERE = Path(__file__).resolve().parent
SKIP = 2  # first steps left out of the step time (the trainer and its server warm up)
FIGURES = ("staleness_mean", "staleness_max", "logprob_mismatch", "rollout_wait_seconds")
STEP_TARGET, REWARD_TARGET = 0.6, 0.05
ENV_TOKENS = 24  # a user turn between two answers: "\n<|im_start|>user\nCopy: 7<|im_end|>..."


def workspace(root: Path, args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """The copy-digit workspace with its warmed-up model, the slow-tool rollout beside the
    template's, and the ``write_config`` settings of the chosen workload."""
    warm = prepare(root, args.threads, args.hidden, args.layers)
    if args.workload == "copy-digit":
        return warm, {"rollout": "copy-digit"}
    shutil.copytree(HERE / "rollouts" / "slow-tool", root / "rollouts" / "slow-tool")
    return warm, {
        "rollout": "slow-tool",
        # every answer of the chain and the user turns between them, in one training row
        "response_length": MAX_TOKENS * args.turns + ENV_TOKENS * (args.turns - 1),
        "env": {"BENCH_TOOL_MS": str(args.tool_ms), "BENCH_TURNS": str(args.turns)},
    }


def train(
    root: Path,
    warm: Path,
    setup: dict[str, Any],
    args: argparse.Namespace,
    seed: int,
    k: int,
    ray: dict[str, Any],
) -> dict[str, Any]:
    """One training run; its figures from ``metrics.jsonl``, or the error that stopped it."""
    from osmosis_ai.errors import OsmosisError
    from osmosis_ai.train.plan import TrainRunOptions
    from osmosis_ai.train.runner import run_training

    name = f"async-s{seed}-k{k}"
    config = write_config(root, warm, args.steps, name=name, seed=seed, max_staleness=k, **setup)
    options = TrainRunOptions(
        config_path=config,
        cwd=root,
        name=name,
        max_steps=args.steps,
        eval_rows=0,
        torch_threads=args.threads,
        resume_every=args.steps,
        handle_signals=False,
        **ray,
    )
    began = time.monotonic()
    try:
        result = run_training(options)
    except OsmosisError as exc:
        return {"seed": seed, "k": k, "error": f"{type(exc).__name__}: {exc}"}
    wall = time.monotonic() - began
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    rewards = [r.get("training_reward") for r in records]
    times = [datetime.fromisoformat(r["time"]).timestamp() for r in records]
    tenth = max(1, len(records) // 10)
    figures: dict[str, Any] = {
        "seed": seed,
        "k": k,
        "status": result.status,
        "steps": len(records),
        "wall_seconds": round(wall, 2),
        "step_seconds": mean([r.get("step_seconds") for r in records[SKIP:]]),
        # wall time between consecutive records: the step with its bookkeeping
        "step_gap_seconds": mean([b - a for a, b in itertools.pairwise(times)][SKIP - 1 :]),
        "final_reward": mean(rewards[-tenth:]),
        "reward_curve": [mean(rewards[i : i + tenth]) for i in range(0, len(rewards), tenth)],
    }
    for key in FIGURES:
        figures[key] = mean([r.get(key) for r in records])
    return figures


def mean(values: list[Any]) -> float | None:
    picked = [float(v) for v in values if v is not None]
    return round(sum(picked) / len(picked), 4) if picked else None


@contextmanager
def ray_cluster(enabled: bool) -> Generator[dict[str, Any]]:
    """``TrainRunOptions`` settings placing a run on a local two-node cluster (2 trainer
    workers, 2 rollout servers), started here and stopped on exit; ``{}`` without ``--ray``."""
    if not enabled:
        yield {}
        return
    from osmosis_ai.distributed.cluster import LocalCluster, connect

    cluster = LocalCluster()
    cluster.start()
    try:
        with connect(cluster.address, auth_token=cluster.auth_token) as connection:
            connection.wait_for_nodes(len(cluster.nodes))
            yield {"ray_address": cluster.address, "trainer_workers": 2, "rollout_servers": 2}
    finally:
        cluster.stop()


def require_ray() -> None:
    """Exit with the install command when Ray (the ``distributed`` extra) is missing."""
    from osmosis_ai.distributed.cluster import require_ray as load
    from osmosis_ai.errors import MissingExtraError

    try:
        load("bench/train_async.py --ray")
    except MissingExtraError as exc:
        raise SystemExit(f"{exc} (or run without --ray)") from exc


def compare(runs: list[dict[str, Any]], ks: list[int]) -> dict[str, Any]:
    """Each K against the first (the baseline), per seed and as the median over seeds."""
    base, table = ks[0], {}
    by = {(r["seed"], r["k"]): r for r in runs if "error" not in r}
    seeds = sorted({r["seed"] for r in runs})
    for k in ks[1:]:
        pairs = [(s, by[s, base], by[s, k]) for s in seeds if (s, base) in by and (s, k) in by]
        figures: dict[str, Any] = {}
        for name, key, ratio in (
            ("step_ratio", "step_seconds", True),
            ("gap_ratio", "step_gap_seconds", True),
            ("reward_diff", "final_reward", False),
        ):
            per_seed = {
                s: round(b[key] / a[key] if ratio else b[key] - a[key], 3)
                for s, a, b in pairs
                if a[key] is not None and b[key] is not None and (a[key] or not ratio)
            }
            figures[name] = per_seed
            figures[f"{name}_median"] = statistics.median(per_seed.values()) if per_seed else None
        table[f"k{k}_vs_k{base}"] = figures
    return table


def show(figure: float | None, spec: str = ".3f") -> str:
    return "-" if figure is None else format(figure, spec)


def print_run(run: dict[str, Any]) -> None:
    head = f"seed {run['seed']} K={run['k']}"
    if "error" in run:
        print(f"{head}: failed: {run['error']}")
        return
    curve = " ".join(show(x, ".2f") for x in run["reward_curve"])
    print(
        f"{head}: {run['status']} {run['steps']} steps, step {show(run['step_seconds'])}s "
        f"(between records {show(run['step_gap_seconds'])}s), "
        f"final reward {show(run['final_reward'])}, rollout wait "
        f"{show(run['rollout_wait_seconds'])}s, staleness mean {show(run['staleness_mean'])} "
        f"max {show(run['staleness_max'])}, logprob mismatch "
        f"{show(run['logprob_mismatch'], '.4f')}, wall {run['wall_seconds']}s\n"
        f"    reward per tenth: {curve}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--workload", choices=["slow-tool", "copy-digit"], default="slow-tool")
    parser.add_argument("--steps", type=int, default=40, help="GRPO steps of each run")
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1, each run per K")
    parser.add_argument("--ks", default="0,1", help="max_staleness values; the first is the base")
    parser.add_argument("--tool-ms", type=int, default=250, help="the slow tool's wait")
    parser.add_argument("--turns", type=int, default=2, help="model calls per slow-tool rollout")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--hidden", type=int, default=128, help="model width (tiny: 128)")
    parser.add_argument("--layers", type=int, default=2, help="model depth (tiny: 2)")
    parser.add_argument("--ray", action="store_true", help="on a local Ray cluster, 2x2")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    parser.add_argument("--keep", action="store_true", help="keep the workspace and run dirs")
    args = parser.parse_args(argv)
    try:
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        parser.error(f"--ks {args.ks!r}: give comma-separated integers >= 0, such as 0,1")
    if not ks or min(ks) < 0 or len(set(ks)) != len(ks):
        parser.error(f"--ks {args.ks!r}: give distinct integers >= 0, such as 0,1")
    if args.steps <= SKIP or args.seeds < 1 or args.turns < 1 or args.tool_ms < 0:
        parser.error(f"need --steps > {SKIP}, --seeds >= 1, --turns >= 1 and --tool-ms >= 0")
    if args.ray:
        require_ray()
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"

    report: dict[str, Any] = {
        "settings": {**vars(args), "json": str(args.json) if args.json else None, "ks": ks},
        "loadavg_start": os.getloadavg(),
        "runs": [],
    }
    root = Path(tempfile.mkdtemp(prefix="osmosis-bench-train-async-"))
    try:
        print(f"preparing {root} (tiny model + 60-step warm-up) ...", flush=True)
        warm, setup = workspace(root, args)
        with ray_cluster(args.ray) as ray:
            for seed in range(args.seeds):
                for k in ks:
                    run = train(root, warm, setup, args, seed, k, ray)
                    report["runs"].append(run)
                    print_run(run)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    report["loadavg_end"] = os.getloadavg()
    report["comparisons"] = compare(report["runs"], ks)
    where = "a local Ray cluster (2 trainers x 2 rollout servers)" if args.ray else "embedded"
    tool = (
        f", tool {args.tool_ms} ms x {args.turns} turn(s)" if args.workload == "slow-tool" else ""
    )
    print(
        f"\n{args.workload}{tool}, {where}: {args.steps} steps, seeds {args.seeds}, "
        f"load {report['loadavg_start'][0]:.1f} -> {report['loadavg_end'][0]:.1f}"
    )
    for name, c in report["comparisons"].items():
        ratios = ", ".join(f"seed {s}: {x:.2f}" for s, x in c["step_ratio"].items())
        diffs = ", ".join(f"seed {s}: {x:+.3f}" for s, x in c["reward_diff"].items())
        ratio, diff = c["step_ratio_median"], c["reward_diff_median"]
        print(
            f"{name}: step time {show(ratio, '.2f')}x median ({ratios or 'none'}; "
            f"target <= {STEP_TARGET}; between records {show(c['gap_ratio_median'], '.2f')}x), "
            f"final reward {show(diff, '+.3f')} median "
            f"({diffs or 'none'}; target within {REWARD_TARGET})"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
