"""``osmosis eval stop NAME [-y]``: stop a pending or running eval run."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.eval_platform import run_path
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the eval run's name (or id)")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        confirm(
            f"Stop the eval run {args.name}? Items not finished yet will not run.",
            yes=args.yes,
            summary={"Run": args.name},
        )
        stopped = session.client.call("POST", run_path(args.name, "stop"), json={})
        return OperationResult(
            operation="eval.stop",
            status="success",
            resource={
                "id": stopped.get("id"),
                "name": stopped.get("name"),
                "status": stopped.get("status"),
                **session.result_context(),
            },
            message=f"Eval run {stopped.get('name') or args.name} stopped.",
        )
