"""TRL's own GRPO loop vs ours, side by side, on the tiny model: wall time and peak RSS.

``plain``: ``GRPOTrainer`` generating itself, with a plain exact-match reward function.
``ours``: ``osmosis train run``'s path (rollout server process, protocol, policy proxy,
grader, ``rollout_func``) with the same warmed-up weights, seed, order, batch and steps;
measured with the resumable state saved once (``ours``), every step (``ours+save``), and
with asynchronous training (``ours-async``: ``max_staleness = 1``, the next step's rollouts
generated and graded during the update). Each variant runs in its own process; peak RSS sums
its process tree (ours includes the rollout server). ``--repeat N`` runs the variants N
times, interleaved, and reports each round's ratios and their median (single runs on a
shared 2-core machine vary by ±10%).
``python bench/train_loop.py [--steps 40] [--threads 1] [--repeat 3] [--variants ...]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

LR, BATCH, GROUP, MAX_TOKENS, SEED = 3e-4, 8, 8, 4, 0
VARIANTS = ("plain", "ours", "ours+save", "ours-async")


def prepare(root: Path, threads: int, hidden: int, layers: int) -> Path:
    """The copy-digit workspace and a warmed-up model both variants start from."""
    from osmosis_ai.train.demo import setup_workspace
    from osmosis_ai.train.plan import TrainRunOptions
    from osmosis_ai.train.runner import run_training
    from osmosis_ai.train.tiny_model import build_tiny_model

    setup_workspace(root)
    build_tiny_model(root / "models" / "tiny", hidden_size=hidden, num_layers=layers)
    options = TrainRunOptions(
        config_path=root / "configs/training/copy-digit.toml",
        cwd=root,
        name="warmup",
        max_steps=1,
        torch_threads=threads,
        handle_signals=False,
    )
    result = run_training(options)  # the config's 60-step warm-up (and one GRPO step)
    return result.run_dir / "warmup"


def write_config(
    root: Path,
    warm: Path,
    steps: int,
    *,
    name: str = "bench",
    rollout: str = "copy-digit",
    seed: int = SEED,
    max_staleness: int = 0,
    response_length: int = MAX_TOKENS,
    env: dict[str, str] | None = None,
) -> Path:
    """``configs/training/<name>.toml``: the given rollout from the warmed-up model, ``steps``
    steps of ``BATCH`` prompts x ``GROUP`` samples, no validations or checkpoints
    (``max_staleness`` 0 leaves the key out: the synchronous default)."""
    staleness = f"max_staleness = {max_staleness}\n" if max_staleness else ""
    extra = "".join(f"{key} = {json.dumps(value)}\n" for key, value in (env or {}).items())
    extra = f"\n[env]\n{extra}" if extra else ""
    config = root / f"configs/training/{name}.toml"
    config.write_text(
        f"""[experiment]
rollout = "{rollout}"
entrypoint = "main.py"
model_path = "local:{warm}"
dataset = "copy-digit"

[training]
lr = {LR}
total_epochs = {-(-steps * BATCH // 10)}
n_samples_per_prompt = {GROUP}
rollout_batch_size = {BATCH}
max_prompt_length = 64
max_response_length = {response_length}
seed = {seed}
{staleness}
[checkpoints]
eval_interval = 0
checkpoint_save_freq = 0
{extra}"""
    )
    return config


def run_plain(root: Path, warm: Path, steps: int, threads: int) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from osmosis_ai.train.engine import quiet
    from osmosis_ai.train.plan import data_order

    quiet()
    torch.set_num_threads(threads)
    rows = [json.loads(line) for line in (root / "data/copy-digit.jsonl").read_text().splitlines()]
    order = data_order(len(rows), -(-steps * BATCH // len(rows)), SEED)[: steps * BATCH]
    dataset = Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": rows[i]["user_prompt"]}],
                "answer": rows[i]["ground_truth"],
            }
            for i in order
        ]
    )

    def exact_match(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        return [
            float(c[0]["content"].strip() == a) for c, a in zip(completions, answer, strict=True)
        ]

    model = AutoModelForCausalLM.from_pretrained(warm, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(warm, local_files_only=True)
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="plain-", dir=root),
        max_steps=steps,
        per_device_train_batch_size=BATCH * GROUP,
        num_generations=GROUP,
        learning_rate=LR,
        lr_scheduler_type="constant",
        max_completion_length=MAX_TOKENS,
        shuffle_dataset=False,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=SEED,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[exact_match],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    return {"train_seconds": seconds, "rewards": rewards}


def run_ours(
    root: Path, config: Path, steps: int, threads: int, resume_every: int
) -> dict[str, Any]:
    from osmosis_ai.train.events import StageEvent, StepEvent, TrainEvent
    from osmosis_ai.train.plan import TrainRunOptions
    from osmosis_ai.train.runner import run_training

    marks: dict[str, float] = {}

    def on_event(event: TrainEvent) -> None:
        if isinstance(event, StageEvent) and event.message.startswith("GRPO"):
            marks["start"] = time.perf_counter()
        elif isinstance(event, StepEvent):
            marks["end"] = time.perf_counter()

    options = TrainRunOptions(
        config_path=config,
        cwd=root,
        max_steps=steps,
        torch_threads=threads,
        resume_every=resume_every,
        handle_signals=False,
    )
    result = run_training(options, on_event)
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    return {
        "train_seconds": marks["end"] - marks["start"],
        "rewards": list(result.rewards),
        # the rollout phase of a step (dispatch to the last outcome; the next step's rollouts
        # are dispatched while the trainer updates), how long the trainer waited for it, and
        # its decode batches
        "rollout_seconds": [r["rollout_seconds"] for r in records],
        "wait_seconds": [r["rollout_wait_seconds"] for r in records],
        "policy_batches": [r.get("policy_batches") for r in records],
    }


def measure(argv: list[str]) -> dict[str, Any]:
    """Run one variant in a child process; wall time and peak RSS of its process tree."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, __file__, *argv], stdout=subprocess.PIPE)
    root = psutil.Process(child.pid)
    peak = 0
    while child.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.05)
    out, _ = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"variant {argv[1]} failed with exit code {child.returncode}")
    data = json.loads(out.decode().strip().splitlines()[-1])
    data.update(wall_seconds=time.perf_counter() - started, peak_rss_mb=peak / 2**20)
    return data


def mean(values: list[float | None], part: slice) -> float:
    picked = [v for v in values[part] if v is not None]
    return sum(picked) / len(picked) if picked else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the variants")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, among {', '.join(VARIANTS)} (plain is always run: the baseline)",
    )
    parser.add_argument("--hidden", type=int, default=128, help="model width (tiny: 128)")
    parser.add_argument("--layers", type=int, default=2, help="model depth (tiny: 2)")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--warm", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants {','.join(unknown)}: pick among {', '.join(VARIANTS)}")
    args.variants = [v for v in VARIANTS if v == "plain" or v in chosen]
    if args.variant is not None:
        os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
        staleness = 1 if args.variant == "ours-async" else 0
        config = write_config(
            args.root, args.warm, args.steps, name=f"bench-k{staleness}", max_staleness=staleness
        )
        if args.variant == "plain":
            data = run_plain(args.root, args.warm, args.steps, args.threads)
        else:
            every = 1 if args.variant == "ours+save" else args.steps
            data = run_ours(args.root, config, args.steps, args.threads, every)
        print(json.dumps(data))
        return
    root = Path(tempfile.mkdtemp(prefix="osmosis-bench-train-"))
    try:
        report(root, args)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # the models and run dirs of every variant


def report(root: Path, args: argparse.Namespace) -> None:
    print(f"preparing {root} (tiny model + 60-step warm-up) ...", flush=True)
    warm = prepare(root, args.threads, args.hidden, args.layers)
    common = [
        "--root",
        str(root),
        "--warm",
        str(warm),
        "--steps",
        str(args.steps),
        "--threads",
        str(args.threads),
    ]
    rounds = [
        {v: measure(["--variant", v, *common]) for v in args.variants} for _ in range(args.repeat)
    ]
    print(
        f"\n{args.steps} GRPO steps, {BATCH} prompts x {GROUP} samples, {args.threads} thread(s), "
        f"model hidden {args.hidden} x {args.layers} layers, {args.repeat} round(s)"
    )
    header = ("round", "variant", "train() s", "s/step", "process s", "peak RSS MB", "reward")
    widths = (-5, -10, 10, 8, 10, 12, 22)
    print(
        " ".join(
            f"{h:<{-w}}" if w < 0 else f"{h:>{w}}" for h, w in zip(header, widths, strict=True)
        )
    )
    tenth = max(1, args.steps // 10)
    for number, results in enumerate(rounds, 1):
        for name, r in results.items():
            rewards = r["rewards"]
            first, last = mean(rewards, slice(0, tenth)), mean(rewards, slice(-tenth, None))
            print(
                f"{number:<5} {name:<10} {r['train_seconds']:>10.1f} "
                f"{r['train_seconds'] / args.steps:>8.3f} {r['wall_seconds']:>10.1f} "
                f"{r['peak_rss_mb']:>12.0f} {first:>11.2f} → {last:.2f}"
            )
        for name in args.variants[1:]:
            r = results[name]
            phase, wait = sorted(r["rollout_seconds"]), sorted(r["wait_seconds"])
            batches = [b for b in r["policy_batches"] if b is not None]
            print(
                f"      {name}: rollout phase median {phase[len(phase) // 2]:.3f} s/step, "
                f"trainer waited {wait[len(wait) // 2]:.3f} s/step for it, "
                f"{sum(batches) / max(len(batches), 1):.1f} decode batches/step"
            )
    for name in args.variants[1:]:
        ratios = [r[name]["train_seconds"] / r["plain"]["train_seconds"] for r in rounds]
        rss = [r[name]["peak_rss_mb"] / r["plain"]["peak_rss_mb"] for r in rounds]
        listed = ", ".join(f"{x:.2f}" for x in ratios)
        print(
            f"{name} / plain: training time {median(ratios):.2f}x median ({listed}), "
            f"peak RSS {median(rss):.2f}x (target time ≤ 1.2x)"
        )


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


if __name__ == "__main__":
    main()
