"""``osmosis train list [--limit N] [--all]``: the workspace's training runs on the platform."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import training_runs
from osmosis_ai.cli.output import Column, Context, Result
from osmosis_ai.cli.platform_list import list_resource
from osmosis_ai.cli.platform_session import add_list_arguments

COLUMNS = [
    Column("name", "Name"),
    Column("status", "Status"),
    Column("model_name", "Base model"),
    Column("dataset_name", "Dataset"),
    Column("rollout_name", "Rollout"),
    Column("current_step", "Step"),
    Column("total_steps", "Of"),
    Column("reward", "Reward"),
    Column("created_at", "Created"),
    Column("creator_name", "Created by"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return list_resource(
        args,
        ctx,
        "/api/cli/training-runs",
        "training_runs",
        title="Training runs",
        record=training_runs.training_run,
        columns=COLUMNS,
    )
