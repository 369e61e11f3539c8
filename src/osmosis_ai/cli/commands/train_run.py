"""``osmosis train run``: train locally with GRPO through the rollout server (reference §6.5).

``--demo`` sets up the bundled copy-digit workspace, builds the tiny model and trains it.
Progress (stages, warm-up, steps with the live reward, validation) renders as a rich live
display, as ``→`` lines on stderr with ``--plain``, and not at all with ``--json``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis_ai.cli.arguments import positive_int, whole_number
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.platform.training_metrics import finite

if TYPE_CHECKING:
    from osmosis_ai.train.events import TrainEvent, TrainRunResult

DEFAULT_DEMO_DIR = "osmosis-demo"


_count = whole_number(0, rule="must be 0 (one per node) or more")  # of workers or servers


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", nargs="?", type=Path, help="configs/training/<name>.toml (omit with --demo)"
    )
    parser.add_argument("--name", metavar="RUN", help="run name (default: generated)")
    parser.add_argument(
        "--resume", action="store_true", help="continue a run (--name, else the latest)"
    )
    parser.add_argument(
        "-o", "--output", type=Path, metavar="DIR", help="runs folder (.osmosis/training/)"
    )
    parser.add_argument("--dataset-file", type=Path, metavar="PATH", help="use this dataset")
    parser.add_argument("--max-steps", type=positive_int, metavar="N", help="stop after N steps")
    parser.add_argument(
        "--micro-batch-size",
        type=positive_int,
        metavar="N",
        help="split each step's completions into chunks of N (less memory)",
    )
    parser.add_argument(
        "--resume-every",
        type=positive_int,
        default=1,
        metavar="N",
        help="save the resumable state every N steps (default 1: a kill loses one step)",
    )
    parser.add_argument(
        "--strict-token-chain",
        action="store_true",
        help="fail when an agent's model calls do not extend one another (default: train "
        "on each unbroken chain of calls as a row of its own)",
    )
    parser.add_argument("--eval-rows", type=positive_int, metavar="N", help="validation rows")
    parser.add_argument(
        "--eval-samples", type=positive_int, default=1, metavar="N", help="samples per row"
    )
    parser.add_argument("--threads", type=positive_int, metavar="N", help="torch CPU threads")
    parser.add_argument("--device", metavar="DEV", help="cpu, cuda or cuda:N (default: auto)")
    parser.add_argument("--rollout-port", type=positive_int, metavar="PORT")
    parser.add_argument(
        "--ray",
        nargs="?",
        const="local",
        metavar="ADDRESS",
        help="run the steps on a Ray cluster: auto, HOST:PORT, or nothing (the cluster this "
        "machine is in, else one started here); needs the 'distributed' extra",
    )
    parser.add_argument(
        "--trainer-workers",
        type=_count,
        metavar="N",
        help="(--ray) trainer workers, each on its share of every step (0: one per node)",
    )
    parser.add_argument(
        "--rollout-servers",
        type=_count,
        metavar="R",
        help="(--ray) rollout servers on the cluster (0: one per node)",
    )
    parser.add_argument("--verbose", action="store_true", help="show the rollout server log")
    parser.add_argument(
        "--demo",
        action="store_true",
        help="set up the copy-digit demo workspace, build the tiny model and train it",
    )
    parser.add_argument(
        "--demo-dir", type=Path, default=Path(DEFAULT_DEMO_DIR), metavar="DIR", help="(--demo)"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.train.errors import TrainingError
    from osmosis_ai.train.plan import TrainRunOptions

    options = TrainRunOptions(
        config_path=args.config or Path(),
        name=args.name,
        output=args.output,
        dataset_file=args.dataset_file,
        resume=args.resume,
        max_steps=args.max_steps,
        rollout_port=args.rollout_port,
        micro_batch_size=args.micro_batch_size,
        resume_every=args.resume_every,
        strict_token_chain=args.strict_token_chain,
        eval_rows=args.eval_rows,
        eval_samples=args.eval_samples,
        torch_threads=args.threads,
        device=args.device,
        ray_address=args.ray,
        trainer_workers=args.trainer_workers,
        rollout_servers=args.rollout_servers,
        verbose=args.verbose,
    )
    if not args.demo and args.config is None:
        raise CLIError(CLIErrorCode.VALIDATION, "Give a training config, or pass --demo.")
    renderer = _renderer(ctx)
    try:
        with renderer:
            if args.demo:
                from osmosis_ai.train.demo import run_demo

                demo = run_demo(args.demo_dir, options, renderer)
                result = demo.training
            else:
                from osmosis_ai.train.runner import run_training

                result = run_training(options, renderer)
    except TrainingError as exc:
        from osmosis_ai.errors import DeadlineError

        details: dict[str, object] = {"error_type": type(exc).__name__}
        if isinstance(exc, DeadlineError):  # a stall: its stage, deadline and setting
            details.update(stage=exc.stage, deadline_s=exc.deadline_s, setting=exc.setting)
        raise CLIError(CLIErrorCode.VALIDATION, str(exc), details) from exc
    return _result(result, args)


def _result(result: TrainRunResult, args: argparse.Namespace) -> Result:
    from osmosis_ai.train.chart import text_chart

    def fmt(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f}"

    steps = f"{result.steps_done}/{result.total_steps} steps"
    reward = f"training reward {fmt(result.reward_start)} → {fmt(result.reward_end)}"
    seconds = result.duration_ms / 1000
    validations = result.validations
    lines: list[str] = []
    if len(validations) >= 2:
        first, last = validations[0], validations[-1]
        lines.append(
            f"Validation reward {fmt(first.mean_reward)} (step {first.step}) → "
            f"{fmt(last.mean_reward)} (step {last.step}), {last.rollouts} rollouts each"
        )
    lines.extend(text_chart(result.rewards))
    if result.final_checkpoint is not None:
        lines.append(f"Final checkpoint (Hugging Face format): {result.final_checkpoint}")
    if result.plot_path is not None:
        lines.append(f"Reward plot: {result.plot_path}")
    lines.append(f"Metrics: {result.run_dir / 'metrics.jsonl'}")
    config = "--demo" if args.demo else str(args.config)
    exit_code = 0
    if result.status == "interrupted":
        status = "partial"
        exit_code = 130
        saved = "checkpoint saved" if result.steps_done else "nothing to save yet"
        message = f"Interrupted {result.run_name} after {steps}; {saved} ({reward})."
        lines.append(f"Resume: osmosis train run {config} --name {result.run_name} --resume")
    elif result.status == "failed":
        status = "failed"
        exit_code = 1
        saved = "checkpoint saved" if result.final_checkpoint is not None else "nothing saved"
        message = (
            f"Training {result.run_name} failed ({result.error}) after {steps}; {saved} "
            f"({reward}): {result.error_message}"
        )
    else:
        status = "success" if result.status == "success" else "partial"
        message = f"Trained {result.run_name}: {steps} in {seconds:.0f}s, {reward}."
    return OperationResult(
        operation="train.run",
        status=status,
        resource=result.to_resource(),
        message=message,
        next_steps=lines,
        exit_code=exit_code,
    )


class _Silent:
    def __call__(self, event: TrainEvent) -> None:
        return None

    def __enter__(self) -> _Silent:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Plain(_Silent):
    """``→`` lines on stderr: stages, warnings, validation, every 10th step."""

    def __call__(self, event: TrainEvent) -> None:
        from osmosis_ai.train.events import (
            LogEvent,
            StageEvent,
            StepEvent,
            ValidationEvent,
            WarningEvent,
        )

        line: str | None = None
        if isinstance(event, StageEvent):
            line = f"→ {event.message}"
        elif isinstance(event, WarningEvent):
            line = f"Warning: {event.message}"
        elif isinstance(event, LogEvent):
            line = event.line
        elif isinstance(event, ValidationEvent):
            line = f"→ {_validation_text(event)}"
        elif isinstance(event, StepEvent) and (event.step % 10 == 0 or event.step == event.total):
            line = f"→ step {event.step}/{event.total}: {_reward_text(event)}"
        if line is not None:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()


class _Rich(_Silent):
    """A live progress bar for warm-up and GRPO steps with the current reward."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = Console(file=sys.stderr, highlight=False)
        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.tasks: dict[str, Any] = {}
        self.rewards: list[float] = []

    def __enter__(self) -> _Rich:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def _task(self, name: str, total: int) -> Any:
        if name not in self.tasks:
            self.tasks[name] = self.progress.add_task(name, total=total, status="")
        return self.tasks[name]

    def __call__(self, event: TrainEvent) -> None:
        from rich.text import Text

        from osmosis_ai.train.events import (
            LogEvent,
            StageEvent,
            ValidationEvent,
            WarmupEvent,
            WarningEvent,
        )

        say: Callable[[Text], None] = self.progress.console.print
        if isinstance(event, StageEvent):
            say(Text(f"→ {event.message}", style="cyan"))
        elif isinstance(event, WarningEvent):
            say(Text(f"Warning: {event.message}", style="yellow"))
        elif isinstance(event, LogEvent):
            say(Text(event.line, style="dim"))
        elif isinstance(event, ValidationEvent):
            say(Text(f"✓ {_validation_text(event)}", style="green"))
        elif isinstance(event, WarmupEvent):
            loss = "" if event.loss is None else f"loss {event.loss:.3f}"
            task = self._task("warm-up (SFT)", event.total)
            self.progress.update(task, completed=event.step, status=loss)
        else:
            task = self._task("GRPO steps", event.total)
            self.progress.update(task, completed=event.step, status=_reward_text(event))


def _reward_text(event: Any) -> str:
    value = event.metrics.get("training_reward")
    failed = event.metrics.get("failed_rollouts") or 0
    text = "reward n/a" if value is None else f"reward {value:.3f}"
    stale = finite(event.metrics.get("staleness_mean"))
    if (finite(event.metrics.get("max_staleness")) or 0) > 0 and stale is not None:
        text += f", stale {stale:.2f}"  # asynchronous training: policy versions behind
    return text + (f", {failed} failed" if failed else "")


def _validation_text(event: Any) -> str:
    summary = event.summary
    reward = "n/a" if summary.mean_reward is None else f"{summary.mean_reward:.3f}"
    when = "before RL" if summary.step == 0 else f"at step {summary.step}"
    return f"validation {when}: reward {reward} over {summary.scored}/{summary.rollouts} rollouts"


def _renderer(ctx: Context) -> _Silent:
    if ctx.format == "json":
        return _Silent()
    if ctx.format == "plain":
        return _Plain()
    return _Rich()
