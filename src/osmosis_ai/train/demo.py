"""The embedded default, end to end: copy the bundled ``copy-digit`` template into a
workspace, build the tiny model, then train it through the full path (rollout server,
protocol, policy proxy, grader, TRL) with a warm-up and validation before and after.

``python -m osmosis_ai.train.demo [DIR] [--lora]`` (or ``osmosis train run --demo``);
``--lora`` trains a LoRA adapter in GRPO, from the template's config with ``[lora] enabled``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from osmosis_ai.errors import UsageError
from osmosis_ai.train.events import EventSink, StageEvent, TrainRunResult
from osmosis_ai.train.plan import TrainRunOptions

TEMPLATE = "copy-digit"
MODEL_DIR = "models/tiny"
DEMO_EVAL_SAMPLES = 4
DEMO_THREADS = 1  # the tiny model's matmuls are too small to gain from a second thread


@dataclass(frozen=True)
class DemoResult:
    workspace: Path
    installed: tuple[str, ...]
    training: TrainRunResult


def setup_workspace(directory: Path, name: str = TEMPLATE) -> list[str]:
    """Make ``directory`` a workspace (its own scaffold, so no parent workspace is used)
    holding template ``name``; returns the files written. Files that exist with other
    content are never replaced."""
    from osmosis_ai.workspace.layout import fix_scaffold
    from osmosis_ai.workspace.templates import FileConflictError, apply_template

    directory.mkdir(parents=True, exist_ok=True)
    fix_scaffold(directory)
    try:
        applied = apply_template(name, directory)
    except FileConflictError as exc:
        raise UsageError(
            f"{directory} already holds other versions of the {name} files "
            f"({', '.join(exc.paths[:3])}): pick an empty directory for the demo"
        ) from exc
    return list(applied.files_written)


def lora_config(workspace: Path) -> Path:
    """The template's training config with ``[lora] enabled = true``, written beside it
    (left alone when it exists: it may be the user's own by now)."""
    source = workspace / "configs" / "training" / f"{TEMPLATE}.toml"
    target = source.with_name(f"{TEMPLATE}-lora.toml")
    if not target.exists():
        text = source.read_text()
        if "\nenabled = false\n" not in text:
            raise UsageError(f"{source} has no '[lora] enabled = false' line to turn on")
        target.write_text(text.replace("\nenabled = false\n", "\nenabled = true\n"))
    return target


def run_demo(
    directory: Path,
    options: TrainRunOptions | None = None,
    on_event: EventSink | None = None,
    *,
    lora: bool = False,
) -> DemoResult:
    """Set up ``directory`` (created if missing) and train the copy-digit demo in it (a LoRA
    adapter when ``lora``). ``options`` may tune the run (steps, threads, ...); its config and
    cwd are replaced."""
    from osmosis_ai.train import engine
    from osmosis_ai.train.runner import run_training
    from osmosis_ai.train.tiny_model import build_tiny_model

    engine.require_train_extra(lora=lora)
    engine.quiet()
    emit: EventSink = on_event or (lambda _event: None)
    workspace = directory.expanduser().resolve()
    installed = setup_workspace(workspace)
    emit(StageEvent(f"workspace {workspace}: {len(installed)} template files written"))
    model = workspace / MODEL_DIR
    if not (model / "config.json").is_file():
        emit(StageEvent(f"building the tiny model in {model}"))
        build_tiny_model(model)
    base = options or TrainRunOptions(config_path=Path())
    tuned = dataclasses.replace(
        base,
        config_path=lora_config(workspace)
        if lora
        else workspace / "configs" / "training" / f"{TEMPLATE}.toml",
        cwd=workspace,
        eval_samples=max(base.eval_samples, DEMO_EVAL_SAMPLES),
        torch_threads=base.torch_threads or DEMO_THREADS,
    )
    return DemoResult(workspace, tuple(installed), run_training(tuned, emit))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo and print its progress and reward curve."""
    from osmosis_ai.train.chart import text_chart
    from osmosis_ai.train.events import StepEvent, TrainEvent, ValidationEvent, WarmupEvent

    parser = argparse.ArgumentParser(prog="python -m osmosis_ai.train.demo", description=__doc__)
    parser.add_argument("directory", nargs="?", type=Path, default=Path("osmosis-demo"))
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter in GRPO")
    args = parser.parse_args(argv)

    def show(event: TrainEvent) -> None:
        if isinstance(event, StepEvent):
            if event.step % 10 == 0 or event.step == event.total:
                reward = event.metrics.get("training_reward")
                print(f"step {event.step}/{event.total}  reward {reward:.3f}", flush=True)
        elif isinstance(event, WarmupEvent):
            if event.step == event.total:
                print(f"warm-up done ({event.total} steps)", flush=True)
        elif isinstance(event, ValidationEvent):
            s = event.summary
            print(f"validation at step {s.step}: reward {s.mean_reward}", flush=True)
        else:
            print(f"{type(event).__name__.removesuffix('Event').lower()}: {event}", flush=True)

    options = TrainRunOptions(config_path=Path(), max_steps=args.max_steps)
    result = run_demo(args.directory, options, show, lora=args.lora).training
    print("\n".join(text_chart(result.rewards)))
    print(
        f"{result.status}: {result.steps_done} steps in {result.duration_ms / 1000:.0f}s, "
        f"training reward {result.reward_start} → {result.reward_end}; run {result.run_dir}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
