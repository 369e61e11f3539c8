"""``osmosis eval info NAME [-o ROOT]``: an eval run, its results and metrics.

Rich output also writes the run's ``metrics.json`` (under ``ROOT``, by default
``.osmosis/evals/<name>/``), the file a local run keeps; ``-o`` writes it in every mode.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from osmosis_ai.cli import records
from osmosis_ai.cli.eval_platform import (
    default_root,
    eval_run,
    pass_rate_text,
    run_path,
    write_json,
)
from osmosis_ai.cli.output import Context, DetailResult, Result
from osmosis_ai.cli.platform_session import open_session

NO_METRICS_YET = ("pending", "queued")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the eval run's name (or id)")
    parser.add_argument("-o", "--output", metavar="ROOT", help="folder to write metrics.json into")
    records.add_wait_argument(parser, "eval run")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        client = session.client
        if args.wait is not None:
            records.wait_until_ended(
                lambda: eval_run(client.call("GET", run_path(args.name))).get("status"),
                what="eval run",
                name=args.name,
                timeout_s=args.wait,
            )
        record = client.call("GET", run_path(args.name))
        data = eval_run(record)
        for key in ("entrypoint", "branch", "commit_sha", "env_config", "config"):
            data[key] = record.get(key)
        data["resolved_secret_scopes"] = record.get("resolved_secret_scopes")
        metrics = None
        if data.get("status") not in NO_METRICS_YET:
            metrics = client.call("GET", run_path(str(data.get("id") or args.name), "metrics"))
        data["metrics"] = metrics
        written: Path | None = None
        if metrics is not None and (args.output or ctx.format == "rich"):
            root = (
                Path(args.output).expanduser()
                if args.output
                else default_root(session, str(data.get("name") or args.name))
            )
            written = root / "metrics.json"
            write_json(
                written, {"eval_run": metrics.get("eval_run"), "summary": metrics.get("summary")}
            )
        data["metrics_path"] = str(written) if written is not None else None
        data.update(session.result_context())
    overview = metrics.get("overview") if isinstance(metrics, dict) else None
    fields: list[tuple[str, object]] = [
        ("Name", data.get("name")),
        ("Status", data.get("status")),
        ("Model", data.get("model_name")),
        ("Dataset", data.get("dataset_name")),
        ("Rollout", f"{data.get('rollout_name')} ({data.get('entrypoint')})"),
        ("Commit", data.get("commit_sha")),
        ("Created", data.get("created_at")),
        ("Completed", data.get("completed_at")),
        ("Rows", _rows_text(data.get("results"), data.get("config"))),
        ("Pass rate", pass_rate_text(overview or data.get("results"))),
    ]
    if isinstance(overview, dict):
        fields.append(
            (
                "Samples",
                f"{overview.get('total_samples')} ({overview.get('failed')} failed, "
                f"{overview.get('skipped')} skipped)",
            )
        )
        fields.append(("Tokens used", overview.get("tokens_used")))
    if written is not None:
        fields.append(("Metrics", str(written)))
    # --wait: the exit code says whether the run finished (a failed or stopped one exits 1)
    failed = args.wait is not None and data.get("status") != "finished"
    return DetailResult(title="Eval run", data=data, fields=fields, exit_code=int(failed))


def _rows_text(results: object, config: object) -> str | None:
    """``20 of 20 dataset rows × 1`` once the run picked its rows."""
    if not isinstance(results, dict):
        return None
    rows, total = results.get("rows"), results.get("dataset_rows")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if not isinstance(rows, int):
        return None
    n = config.get("n") if isinstance(config, dict) else None  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    of = f" of {total} dataset rows" if isinstance(total, int) else " rows"
    return f"{rows}{of} × {n if isinstance(n, int) else 1}"
