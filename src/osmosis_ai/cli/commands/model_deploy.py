"""``osmosis model deploy LORA_MODEL``: serve a LoRA model for inference (idempotent).

``model undeploy`` is the same call with the other action, so it runs through
:func:`change_deployment` here.
"""

from __future__ import annotations

import argparse
from typing import Literal

from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.platform.client import segment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="LORA_MODEL", help="the LoRA model's name")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return change_deployment(args, ctx, "deploy")


def change_deployment(
    args: argparse.Namespace, ctx: Context, action: Literal["deploy", "undeploy"]
) -> Result:
    """POST the model's ``deploy`` or ``undeploy`` route and report the model's new status."""
    with open_session(ctx) as session:
        answer = session.client.call(
            "POST", f"/api/cli/models/{segment(args.name)}/{action}", json={}
        )
    name = answer.get("model_name") or args.name
    return OperationResult(
        operation=f"model.{action}",
        status="success",
        resource={
            "id": answer.get("id"),
            "model_name": name,
            "status": answer.get("status"),
            **session.result_context(),
        },
        message=f"Model {action}ed: {name}",
        next_steps=[f"Check it with: osmosis model info {name}"],
        next_steps_structured=[{"action": "model_info", "name": name}],
    )
