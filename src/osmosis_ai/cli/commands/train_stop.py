"""``osmosis train stop NAME [-y]``: stop a pending, queued or running training run.

The run keeps its last checkpoint: the worker finishes the step in flight, saves, and ends.
"""

from __future__ import annotations

import argparse

from osmosis_ai.cli import training_runs
from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the training run's name (or id)")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        client = session.client
        run = training_runs.detail(client, args.name)["run"]
        confirm(
            f"Stop training run {run.get('name')}?",
            yes=args.yes,
            summary={
                "name": run.get("name"),
                "status": run.get("status"),
                "step": run.get("current_step"),
                "total_steps": run.get("total_steps"),
            },
            notes=["The step in flight finishes and its checkpoint is kept."],
        )
        body = client.call("POST", f"{training_runs.base_path(str(run.get('id')))}/stop", json={})
        resource = {
            "id": body.get("id"),
            "name": body.get("name"),
            "status": body.get("status"),
            **session.result_context(),
        }
        return OperationResult(
            operation="train.stop",
            status="success",
            resource=resource,
            message=f"Training run {body.get('name')} is {body.get('status')}.",
        )
