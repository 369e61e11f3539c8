"""``osmosis platform model add NAME --path DIR``: register a local Hugging Face model."""

from __future__ import annotations

import argparse
from pathlib import Path

from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_admin import add_store_options, platform_errors, settings_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME", help="the model's name in configs, e.g. Qwen/Qwen3-0.6B"
    )
    parser.add_argument(
        "--path", required=True, type=Path, metavar="DIR", help="the model directory (config.json)"
    )
    add_store_options(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.platform import admin

    with platform_errors():
        model = admin.add_model(settings_from(args), args.name, args.path)
    return OperationResult(
        operation="platform.model.add",
        status="success",
        resource=model,
        message=f"Registered base model {model['model_name']} from {model['path']}.",
    )
