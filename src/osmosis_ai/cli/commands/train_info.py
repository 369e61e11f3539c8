"""``osmosis train info NAME [-o PATH]``: a training run, its progress, charts and metrics.

The metrics export (reference §6.5) is part of the JSON answer; it is also written to a file:
``-o FILE.json``, ``-o DIR`` (``DIR/<name>.json``), or, in rich mode without ``-o``,
``.osmosis/metrics/<name>.json`` in the workspace directory.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from osmosis_ai.cli import records, training_runs
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, DetailResult, Result
from osmosis_ai.cli.platform_session import open_session

METRICS_DIR = Path(".osmosis") / "metrics"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the training run's name (or id)")
    parser.add_argument(
        "-o", "--output", help="write the metrics export to this .json file, or into this directory"
    )
    records.add_wait_argument(parser, "training run")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        client = session.client
        if args.wait is not None:
            records.wait_until_ended(
                lambda: training_runs.detail(client, args.name)["run"].get("status"),
                what="training run",
                name=args.name,
                timeout_s=args.wait,
            )
        body = training_runs.detail(client, args.name)
        run: dict[str, Any] = body["run"]
        status = str(run.get("status"))
        export: dict[str, object] | None = None
        if status not in training_runs.NOT_STARTED:
            metrics = client.call("GET", f"{training_runs.base_path(str(run.get('id')))}/metrics")
            export = training_runs.metrics_export(run, metrics)
        checkpoints = (
            training_runs.checkpoints(client, str(run.get("id")))
            if status in training_runs.TERMINAL
            else None
        )
        root = session.workspace.root if session.workspace is not None else Path.cwd()
        context = session.result_context()
    written = None
    if export is not None and (args.output is not None or ctx.format == "rich"):
        written = _write(export, _target(args.output, root, str(run.get("name"))))
    # id, name and status also at the top, where `eval info --json` has them
    data: dict[str, object] = {
        "id": run.get("id"),
        "name": run.get("name"),
        "status": run.get("status"),
        "training_run": {
            **training_runs.training_run(run),
            "examples_processed_count": run.get("examples_processed_count"),
            "notes": run.get("notes"),
            "error": run.get("error"),
        },
        "config": body.get("config"),
        "entrypoint": body.get("entrypoint"),
        "branch": body.get("branch"),
        "commit_sha": body.get("commit_sha"),
        "env_config": body.get("env_config"),
        "resolved_secret_scopes": body.get("resolved_secret_scopes"),
        "checkpoints": checkpoints,
        "metrics": export,
        "metrics_path": None if written is None else str(written),
        **context,
    }
    # --wait: the exit code says whether the run finished (a failed or stopped one exits 1)
    failed = args.wait is not None and status != "finished"
    return DetailResult(
        title="Training run",
        data=data,
        fields=_fields(run, body, export, checkpoints, written),
        exit_code=int(failed),
    )


def _target(output: str | None, root: Path, name: str) -> Path:
    if output is None:
        return root / METRICS_DIR / f"{name}.json"
    path = Path(output).expanduser()
    if path.suffix.lower() == ".json" and not path.is_dir() and not output.endswith(("/", os.sep)):
        return path
    return path / f"{name}.json"


def _write(export: dict[str, object], path: Path) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(export, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    except OSError as exc:
        raise CLIError(
            CLIErrorCode.VALIDATION,
            f"Cannot write the metrics export to {path}: {exc.strerror or exc}",
            {"output_path": str(path)},
        ) from exc
    return path


def _fields(
    run: dict[str, Any],
    body: dict[str, Any],
    export: dict[str, Any] | None,
    checkpoints: list[dict[str, object]] | None,
    written: Path | None,
) -> list[tuple[str, object]]:
    step, total = run.get("current_step"), run.get("total_steps")
    overview = (export or {}).get("training_run") or {}
    fields: list[tuple[str, object]] = [
        ("Name", run.get("name")),
        ("Status", run.get("status")),
        ("Error", run.get("error")),
        ("Base model", run.get("model_name")),
        ("Dataset", run.get("dataset_name")),
        ("Rollout", run.get("rollout_name")),
        ("Progress", f"step {step or 0} / {total}" if total else None),
        ("Duration", training_runs.duration_text(overview.get("duration_ms"))),
        ("Examples processed", run.get("examples_processed_count")),
        ("Reward", run.get("reward")),
        ("Entrypoint", body.get("entrypoint")),
        ("Config", body.get("config")),
        ("Branch", body.get("branch")),
        ("Commit", body.get("commit_sha")),
        ("Secret scopes", body.get("resolved_secret_scopes")),
        ("Env", body.get("env_config")),
        ("Created", run.get("created_at")),
    ]
    for series in (export or {}).get("metrics") or []:
        values = [point.get("value") for point in series.get("data") or []]
        line = training_runs.sparkline(values)
        summary = ((export or {}).get("summary") or {}).get(series.get("key")) or {}
        if line:
            initial, latest = summary.get("initial"), summary.get("latest")
            fields.append((str(series.get("title")), f"{line} {initial:.4g} → {latest:.4g}"))
    if checkpoints is not None:
        fields.append(
            (
                "Checkpoints",
                [
                    f"{c.get('checkpoint_name')} (step {c.get('checkpoint_step')})"
                    for c in checkpoints
                ]
                or "none",
            )
        )
    if written is not None:
        fields.append(("Metrics export", str(written)))
    return fields
