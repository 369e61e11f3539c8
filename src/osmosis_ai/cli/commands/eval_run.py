"""``osmosis eval run CONFIG``: evaluate a rollout locally (reference §5), offline.

Parses the flags into :class:`~osmosis_ai.eval.plan.EvalRunOptions`, calls
:func:`~osmosis_ai.eval.runner.run_eval`, shows its events as they come (rich, plain or
nothing in JSON mode) and returns the ``eval.run`` operation result.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID

    from osmosis_ai.cli.platform_session import Session
    from osmosis_ai.eval.plan import Confirmation, EvalPlan
    from osmosis_ai.eval.progress import EvalEvent, EvalRunResult, ItemFinishedEvent, Tally


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", type=Path, help="configs/eval/<name>.toml")
    parser.add_argument("--name", help="run name; an earlier run's name resumes it")
    parser.add_argument(
        "-o", "--output", type=Path, help="output root (default: <workspace>/.osmosis/evals/)"
    )
    parser.add_argument(
        "--dataset-file", type=Path, help="dataset file (default: data/<dataset>.jsonl|csv|parquet)"
    )
    parser.add_argument(
        "--secrets-file", help="dotenv file with the [secrets] values ('-' reads stdin)"
    )
    parser.add_argument("--rows", help="source rows to run, e.g. 3,7,10-20 (0-based)")
    parser.add_argument("--fresh", action="store_true", help="archive the run and start over")
    parser.add_argument(
        "--retry-failed", action="store_true", help="also re-run failed and skipped items"
    )
    parser.add_argument(
        "--max-in-flight",
        type=int,
        help="rollouts at once (default: evaluation.batch_size, else the server's capacity)",
    )
    parser.add_argument("-y", "--yes", action="store_true", help="skip the cost confirmation")
    parser.add_argument("--upload", action="store_true", help="upload the results to a platform")
    parser.add_argument("--rollout-port", type=int, help="port for the rollout server (advanced)")
    parser.add_argument(
        "--ray",
        nargs="?",
        const="auto",
        metavar="ADDRESS",
        help="run the rollout servers on a Ray cluster: auto (default), HOST:PORT, or local "
        "(the distributed extra)",
    )
    parser.add_argument(
        "--rollout-servers",
        type=int,
        metavar="R",
        help="rollout servers of the Ray fleet, spread over its nodes (default 2; needs --ray)",
    )
    parser.add_argument("--verbose", action="store_true", help="stream logs.txt (advanced)")
    parser.add_argument(
        "--generation",
        choices=("auto", "polling", "callback"),
        default="auto",
        help="rollout protocol generation (default: what the server speaks)",
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    session = None
    if args.upload:  # the login and workspace are checked before anything runs
        from osmosis_ai.cli.platform_session import open_session

        session = open_session(ctx)
    config: Path = args.config
    if not config.is_file():
        raise CLIError(
            CLIErrorCode.NOT_FOUND,
            f"Config file not found: {config} (eval configs live in configs/eval/<name>.toml)",
            {"config": str(config)},
        )
    from osmosis_ai.cli.env import read_secrets_file
    from osmosis_ai.eval.plan import EvalRunOptions
    from osmosis_ai.eval.runner import run_eval

    view = EventView(ctx)
    options = EvalRunOptions(
        config_path=config,
        name=args.name,
        output_dir=args.output,
        dataset_file=args.dataset_file,
        rows=args.rows,
        fresh=args.fresh,
        retry_failed=args.retry_failed,
        max_in_flight=args.max_in_flight,
        rollout_port=args.rollout_port,
        ray=args.ray,
        rollout_servers=args.rollout_servers,
        generation=args.generation,
        verbose=args.verbose,
        secrets_file_values=read_secrets_file(args.secrets_file),
        prompt_secret=_prompt_secret if ctx.interactive else None,
        confirm=lambda c: _confirm(c, args.yes),
        handle_signals=True,
    )
    try:
        result = run_eval(options, view)
    except Exception as exc:
        raise _cli_error(exc) from exc
    finally:
        view.close()
    view.show_results(result)
    operation = _operation(result, config)
    if session is not None:
        with session:
            _upload(session, result, operation, ctx)
    return operation


def _upload(
    session: Session, result: EvalRunResult, operation: OperationResult, ctx: Context
) -> None:
    """``--upload``: import the finished run into the platform (an incomplete one stays local)."""
    from osmosis_ai.cli.eval_platform import upload_result_resource
    from osmosis_ai.platform.client.eval_runs import upload_local_run

    if not result.complete:
        ctx.warn(
            "UPLOAD_SKIPPED",
            f"The run {result.plan.run_name} is incomplete, so it was not uploaded; resume it, "
            f"then run osmosis eval upload {result.run_dir}",
        )
        return
    uploaded = upload_local_run(session.client, result.run_dir)
    plan, answer = uploaded.plan, uploaded.answer
    assert operation.resource is not None
    operation.resource["upload"] = upload_result_resource(answer, plan)
    operation.next_steps.append(f"Platform: osmosis eval info {answer.get('eval_run_name')}")


def _operation(result: EvalRunResult, config: Path) -> OperationResult:
    run_name, metrics = result.plan.run_name, result.metrics
    again = f"osmosis eval run {config} --name {run_name}"
    steps: list[str] = []
    structured: list[dict[str, object]] = []
    if result.complete:
        message = (
            f"Evaluation {run_name} finished: {result.succeeded} ok, {result.failed} failed, "
            f"{result.skipped} skipped of {result.total_work_items}; pass rate "
            f"{metrics.pass_rate:.1%}."
        )
    elif result.cancelled:
        message = "Interrupted. Re-run the same command to resume the pending work items."
    else:
        why = f" dispatch halted ({result.halted.splitlines()[0]});" if result.halted else ""
        message = (
            f"Evaluation {run_name} is incomplete:{why} {result.pending} of "
            f"{result.total_work_items} work items are still pending."
        )
    if not result.complete:
        steps.append(f"Resume: {again}")
        structured.append({"action": "resume", "name": run_name})
    if result.failed or result.skipped:
        steps.append(f"Re-run failed items: {again} --retry-failed")
        structured.append({"action": "retry_failed", "name": run_name})
    steps.append(f"Results: {result.run_dir}")
    exit_code = 0 if result.complete else 130 if result.cancelled else 1
    return OperationResult(
        operation="eval.run",
        status=result.status,
        resource=dict(result.to_resource()),
        message=message,
        next_steps=steps,
        next_steps_structured=structured,
        exit_code=exit_code,
    )


def _confirm(confirmation: Confirmation, yes: bool) -> None:
    from osmosis_ai.cli.confirm import confirm

    confirm(
        confirmation.prompt,
        yes=yes,
        summary=confirmation.summary,
        notes=["Every rollout calls the model; providers may bill for it."],
    )


def _prompt_secret(name: str) -> str | None:
    from rich.prompt import Prompt

    try:
        return Prompt.ask(f"Value for secret {name} (hidden)", password=True) or None
    except EOFError:
        return None


def _cli_error(exc: Exception) -> Exception:
    """The CLI error for the failures a run can end with; others map the usual way."""
    from osmosis_ai.controller.errors import UpstreamConnectionError, UpstreamError
    from osmosis_ai.controller.rollout_process import RolloutServerError
    from osmosis_ai.controller.service import ControllerServiceError
    from osmosis_ai.eval.plan import MissingSecretsError
    from osmosis_ai.eval.rundir import ResumeMismatchError, RunLockedError

    if isinstance(exc, MissingSecretsError):
        details: dict[str, object] = {"missing": list(exc.missing), "flags": ["--secrets-file"]}
        return CLIError(CLIErrorCode.INTERACTIVE_REQUIRED, str(exc), details)
    if isinstance(exc, UpstreamError):
        details = {
            "url": exc.url,
            "status_code": exc.status_code,
            "provider_message": exc.provider_message,
            "exception_type": type(exc).__name__,
        }
        code = CLIErrorCode.NETWORK if isinstance(exc, UpstreamConnectionError) else None
        message = f"The model check failed, so no rollout was started: {exc}"
        return CLIError(code or CLIErrorCode.VALIDATION, message, details)
    if isinstance(exc, RolloutServerError | ControllerServiceError):
        details = {"exception_type": type(exc).__name__}
        return CLIError(CLIErrorCode.VALIDATION, f"Rollout server: {exc}", details)
    if isinstance(exc, RunLockedError):
        details = {"run_name": exc.run_name, "lock": str(exc.lock_path), "pid": exc.holder_pid}
        return CLIError(CLIErrorCode.CONFLICT, str(exc), details)
    if isinstance(exc, ResumeMismatchError):
        details = {"run_dir": str(exc.run_dir), "changed_keys": list(exc.changed_keys)}
        return CLIError(CLIErrorCode.CONFLICT, str(exc), details)
    return exc


class EventView:
    """Shows the runner's events: rich (plan table, stage lines, a live bar on a TTY or one
    line per item), plain (stage lines on stderr) or nothing but warnings (JSON)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.rich = ctx.format == "rich"
        self.console: Console | None = None
        self.progress: Progress | None = None
        self.task: TaskID | None = None
        if self.rich:
            from rich.console import Console

            self.console = Console(file=sys.stdout, highlight=False)

    def __call__(self, event: EvalEvent) -> None:
        from osmosis_ai.eval import progress as ev

        if isinstance(event, ev.WarningEvent):
            self.ctx.warn(event.code, event.message)
        elif self.ctx.format == "json":
            return
        elif isinstance(event, ev.PlanEvent):
            self._plan(event.plan)
        elif isinstance(event, ev.MilestoneEvent):
            self._line(f"→ {event.message}", "cyan")
        elif isinstance(event, ev.LogEvent):
            self._line(event.line, "dim")
        elif isinstance(event, ev.DispatchStartedEvent) and self.console is not None:
            if self.console.is_terminal:
                self._start_bar(event.tally)
        elif isinstance(event, ev.ItemFinishedEvent) and self.rich:
            self._item(event)

    def _line(self, text: str, style: str) -> None:
        if self.console is None:
            sys.stderr.write(text + "\n")
            return
        from rich.text import Text

        target = self.progress.console if self.progress is not None else self.console
        target.print(Text(text, style=style), soft_wrap=True)

    def _plan(self, plan: EvalPlan) -> None:
        experiment = plan.config.experiment
        rows: list[tuple[str, object]] = [
            ("Rollout", plan.rollout_name),
            ("Entrypoint", plan.entrypoint),
            ("Model", plan.model_path),
            ("Dataset", f"{plan.dataset_name} ({plan.dataset_source})"),
            ("Rows", f"{len(plan.rows)} of {plan.total_rows}"),
            ("Runs Per Row", plan.n),
            ("Work Items", len(plan.items)),
            ("Output", plan.run_dir),
        ]
        pinned = experiment.branch or experiment.commit_sha
        if pinned:
            rows.insert(4, ("Branch/Commit", f"{pinned} (not used: local working tree)"))
        if plan.max_in_flight is not None:
            rows.append(("Max In Flight", plan.max_in_flight))
        if self.console is None:
            for label, value in rows:
                sys.stderr.write(f"{label}: {value}\n")
            return
        from rich.table import Table

        table = Table(title="Local Evaluation", show_header=False, title_justify="left")
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        for label, value in rows:
            table.add_row(label, str(value))
        self.console.print(table)

    def _start_bar(self, tally: Tally) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.progress = Progress(
            TextColumn("rollouts"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task(
            "rollouts", total=tally.total, completed=tally.done, stats=_stats(tally)
        )
        self.progress.start()

    def _item(self, event: ItemFinishedEvent) -> None:
        if self.progress is not None and self.task is not None:
            tally = event.tally
            self.progress.update(self.task, completed=tally.done, stats=_stats(tally))
            return
        record = event.record
        where = f"row {record.row_index} (source {record.source_row_index}) run {record.run_index}"
        if record.status == "failed":
            text = f"{where}: failed error_type={record.error_type} -> {event.rollout_dir}/"
        else:
            reward = "-" if record.reward is None else f"{record.reward:g}"
            text = f"{where}: {record.status} reward={reward}"
        self._line(f"{text}  [{event.tally.done}/{event.tally.total}]", "")

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None

    def show_results(self, result: EvalRunResult) -> None:
        """The "Failed rows" list and the "Results" table (rich only)."""
        if self.console is None:
            return
        from rich.table import Table
        from rich.text import Text

        out, metrics = self.console, result.metrics
        if result.failed_rows:
            out.print(Text("Failed rows", style="bold red"))
            for row in result.failed_rows:
                out.print(
                    f"  row {row.row_index} (source {row.source_row_index}) run {row.run_index}: "
                    f"error_type={row.error_type} -> {row.rollout_dir}/",
                    soft_wrap=True,
                    highlight=False,
                )
        title = "Results" if result.complete else "Results (incomplete)"
        table = Table(title=title, show_header=False, title_justify="left")
        table.add_column(style="bold cyan", no_wrap=True)
        table.add_column()
        complete = result.total_work_items - result.pending
        table.add_row("Run", result.plan.run_name)
        table.add_row(
            "Work Items",
            f"{complete}/{result.total_work_items} complete · {result.succeeded} ok · "
            f"{result.failed} failed · {result.skipped} skipped",
        )
        table.add_row(
            "Pass Rate",
            f"{metrics.pass_rate:.1%} ({metrics.passed}/{metrics.completed_samples}, "
            f"threshold {metrics.pass_threshold:g})",
        )
        stats = metrics.reward_stats
        if stats is not None:
            table.add_row(
                "Reward",
                f"mean {stats.mean:.3g} · median {stats.median:.3g} · "
                f"min {stats.min:.3g} · max {stats.max:.3g}",
            )
        if metrics.pass_at_k:
            points = " · ".join(f"pass@{p.k} {p.value:.3f}" for p in metrics.pass_at_k)
            table.add_row("pass@k", points)
        table.add_row("Tokens Used", f"{metrics.tokens_used:,}")
        table.add_row("Duration", f"{result.duration_ms / 1000:.1f}s")
        table.add_row("Output", str(result.run_dir))
        out.print(table)


def _stats(tally: Tally) -> str:
    rate = tally.pass_rate
    shown = "-" if rate is None else f"{rate:.0%}"
    return f"pass {shown} · failed {tally.failed}"
