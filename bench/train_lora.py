"""LoRA vs full fine-tuning on the copy-digit template, side by side on this machine.

Each variant is the user's path: the template applied to an empty folder, the tiny model it
names, ``osmosis train run configs/training/copy-digit.toml`` (LoRA: ``[lora] enabled =
true`` as the only change), each in its own process. Printed per variant: the mean training
reward of the first and last 10% of steps, the validations, wall and CPU time, the load
average around it (the machine's cores are shared), and the final checkpoint served as
``local:<dir>`` the way ``osmosis eval run`` serves it: greedy answers to the ten prompts and
``osmosis eval run``'s mean reward on it. Then LoRA's wall time over full fine-tuning's.

``--bound`` also measures why an adapter alone cannot learn on this model: the highest
probability of a digit any final hidden state reaches when the output layer (the tied
embeddings) and the final norm are frozen, for the random model and for the run's warm-up.

``--order full,lora,lora,full`` runs each variant twice, interleaved, and compares means (the
load others put on a shared machine drifts). ``python bench/train_lora.py [--steps N]
[--threads T] [--order full,lora] [--bound]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

OSMOSIS = str(Path(sys.executable).with_name("osmosis"))
CONFIG = "configs/training/copy-digit.toml"


def workspace(root: Path, lora: bool) -> Path:
    """The template in ``root`` (through the CLI, as a user applies it) and its tiny model."""
    root.mkdir(parents=True)
    run([OSMOSIS, "template", "apply", "copy-digit"], root)
    run([sys.executable, "-m", "osmosis_ai.train.tiny_model", "models/tiny"], root)
    if lora:
        config = root / CONFIG
        text = config.read_text()
        assert "\nenabled = false\n" in text, "the template's [lora] section changed"
        config.write_text(text.replace("\nenabled = false\n", "\nenabled = true\n"))
    return root


def run(argv: list[str], cwd: Path) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done.stdout


def train(root: Path, steps: int | None, threads: int | None) -> dict[str, Any]:
    argv = [OSMOSIS, "--json", "train", "run", CONFIG, "--name", "bench"]
    if steps:
        argv += ["--max-steps", str(steps)]
    if threads:
        argv += ["--threads", str(threads)]
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    out = run(argv, root)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    envelope = json.loads(out)
    run_dir = root / ".osmosis" / "training" / "bench"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    rewards = [float(r["training_reward"]) for r in records]
    tenth = max(1, len(rewards) // 10)
    checkpoints = sorted((run_dir / "checkpoints").iterdir())
    return {
        "status": envelope["status"],
        "steps": len(rewards),
        "first": sum(rewards[:tenth]) / tenth,
        "last": sum(rewards[-tenth:]) / tenth,
        "validation": [(v["step"], v["mean_reward"]) for v in envelope["resource"]["validation"]],
        "wall_s": wall,
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
        "load": (load, os.getloadavg()[0]),
        "entropy_first": float(records[0]["entropy"]),
        "grad_norm_zero": sum(float(r.get("grad_norm") or 0.0) == 0.0 for r in records),
        "checkpoint": checkpoints[-1],
        "checkpoint_kind": "adapter"
        if (checkpoints[-1] / "adapter_config.json").is_file()
        else "model",
        "run_dir": run_dir,
    }


def served_answers(checkpoint: Path) -> tuple[float, dict[str, str]]:
    """Greedy answers of ``local:<checkpoint>`` (the upstream ``osmosis eval run`` builds)."""
    from osmosis_ai.controller.upstreams import upstream_from_model_path

    upstream: Any = upstream_from_model_path(f"local:{checkpoint}", {})
    answers = {}
    for digit in "0123456789":
        body = {
            "messages": [{"role": "user", "content": f"Copy: {digit}"}],
            "max_tokens": 4,
            "temperature": 0.0,
        }
        answers[digit] = upstream.policy.chat(body)["choices"][0]["message"]["content"]
    right = sum(answer.strip() == digit for digit, answer in answers.items())
    return right / 10, answers


def eval_reward(root: Path, checkpoint: Path) -> float:
    """``osmosis eval run`` of the template's eval config on ``local:<checkpoint>``: the mean
    reward of its 40 sampled rollouts."""
    source = (root / "configs/eval/copy-digit.toml").read_text()
    config = root / "configs/eval/bench.toml"
    config.write_text(
        re.sub(r"(?m)^model_path = .*$", f'model_path = "local:{checkpoint}"', source)
    )
    argv = [OSMOSIS, "--json", "eval", "run", "configs/eval/bench.toml", "--yes"]
    envelope = json.loads(run(argv, root))
    return float(envelope["resource"]["metrics"]["reward_stats"]["mean"])


def ceiling(model_dir: Path, steps: int = 600) -> float:
    """Mean over the ten digits of the highest p(digit) a free final hidden state reaches
    through the frozen final norm and output layer."""
    import torch
    import transformers

    model: Any = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    weights = model.get_output_embeddings().weight.detach()
    norm = model.model.norm.weight.detach()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    best = []
    torch.manual_seed(0)
    for digit in "0123456789":
        target = tokenizer(digit, add_special_tokens=False)["input_ids"][0]
        free = torch.randn(weights.shape[1], requires_grad=True)
        optimizer = torch.optim.Adam([free], lr=0.05)
        loss = torch.tensor(float("inf"))
        for _ in range(steps):
            hidden = norm * free / free.pow(2).mean().sqrt()  # RMSNorm's output
            loss = -torch.log_softmax(weights @ hidden, -1)[target]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        best.append(float(torch.exp(-loss.detach())))
    return sum(best) / len(best)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: all 200)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per run")
    parser.add_argument("--order", default="full,lora", help="variants to run, in this order")
    parser.add_argument("--bound", action="store_true", help="also measure the logit bound")
    parser.add_argument("--keep", action="store_true", help="keep the workspaces")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="osmosis-bench-lora-"))
    results: dict[str, list[dict[str, Any]]] = {}
    print(f"cores {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}; work in {scratch}")
    for number, variant in enumerate(args.order.split(",")):
        root = workspace(scratch / f"{number}-{variant}", variant == "lora")
        result = train(root, args.steps, args.threads)
        result["greedy"], result["answers"] = served_answers(result["checkpoint"])
        result["eval"] = eval_reward(root, result["checkpoint"])
        if args.bound:
            result["bound_random"] = ceiling(root / "models/tiny")
            result["bound_warm"] = ceiling(result["run_dir"] / "warmup")
        results.setdefault(variant, []).append(result)
        show(variant, result)
    if "full" in results and "lora" in results:
        full, lora = results["full"], results["lora"]
        wall = (
            sum(r["wall_s"] for r in lora)
            / len(lora)
            / (sum(r["wall_s"] for r in full) / len(full))
        )
        cpu = (
            sum(r["cpu_s"] for r in lora) / len(lora) / (sum(r["cpu_s"] for r in full) / len(full))
        )
        print(
            f"\nlora / full over {len(lora)} + {len(full)} runs: wall {wall:.2f}x, CPU {cpu:.2f}x "
            "(target: wall <= 1.5x)"
        )
    if not args.keep:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def show(variant: str, r: dict[str, Any]) -> None:
    validation = ", ".join(f"{step}: {reward:.2f}" for step, reward in r["validation"])
    print(
        f"\n{variant}: {r['status']}, {r['steps']} steps, training reward first 10% "
        f"{r['first']:.3f} -> last 10% {r['last']:.3f}\n"
        f"  validation (step: reward) {validation}\n"
        f"  wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, load average "
        f"{r['load'][0]:.1f} -> {r['load'][1]:.1f}\n"
        f"  entropy at step 1 {r['entropy_first']:.2f} (uniform: 5.58), steps with grad_norm "
        f"0: {r['grad_norm_zero']}\n"
        f"  final checkpoint ({r['checkpoint_kind']}) as local:<dir>: greedy {r['greedy']:.0%} "
        f"right, osmosis eval run mean reward {r['eval']:.3f}; answers {r['answers']}"
    )
    if "bound_random" in r:
        print(
            f"  highest p(digit) with the output layer and final norm frozen: random model "
            f"{r['bound_random']:.3f}, after the warm-up {r['bound_warm']:.3f}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
