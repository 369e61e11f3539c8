"""``osmosis model undeploy LORA_MODEL``: stop serving a LoRA model (idempotent)."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.commands.model_deploy import add_arguments, change_deployment
from osmosis_ai.cli.output import Context, Result

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return change_deployment(args, ctx, "undeploy")
