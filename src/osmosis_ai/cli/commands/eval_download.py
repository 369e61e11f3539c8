"""``osmosis eval download NAME [--type T] [--rows R] [-o ROOT] [--overwrite] [-y]``: an eval
run's files in the layout of a local run dir (``metrics.json``, ``summary.jsonl``,
``trajectories/``, ``artifacts/``, ``logs.txt``), by default under ``.osmosis/evals/<name>/``."""

from __future__ import annotations

import argparse
from pathlib import Path

from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.eval_platform import default_root
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.platform.client.eval_runs import download_run, plan_download


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the eval run's name (or id)")
    parser.add_argument(
        "--type",
        default="metrics,trajectories",
        help="metrics, trajectories, artifacts, logs, comma-separated, or all "
        "(default: metrics,trajectories)",
    )
    parser.add_argument("--rows", help="only these rows, e.g. 3,7,10-20")
    parser.add_argument("-o", "--output", metavar="ROOT", help="folder to download into")
    parser.add_argument("--overwrite", action="store_true", help="replace files already there")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        root = Path(args.output).expanduser() if args.output else default_root(session, args.name)
        plan = plan_download(
            session.client,
            args.name,
            types=args.type,
            rows=args.rows,
            root=root,
            overwrite=args.overwrite,
        )
        if plan.existing:
            confirm(
                f"Replace {len(plan.existing)} existing files under {root}?",
                yes=args.yes,
                summary={"Run": args.name, "Output": str(root)},
            )
        done = download_run(session.client, plan)
        return OperationResult(
            operation="eval.download",
            status="success",
            resource={
                "name": args.name,
                "output_path": str(done.root),
                "files": done.files,
                "bytes": done.bytes,
                "types": args.type,
                **session.result_context(),
            },
            message=f"Downloaded {done.files} files of {args.name} into {done.root}",
        )
