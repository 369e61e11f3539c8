"""``osmosis eval list [--limit N] [--all]``: the workspace's managed and imported eval runs."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from osmosis_ai.cli.eval_platform import RUNS_PATH, eval_run, pass_rate_text
from osmosis_ai.cli.output import Column, Context, Result
from osmosis_ai.cli.platform_list import list_resource
from osmosis_ai.cli.platform_session import add_list_arguments

COLUMNS = [
    Column("name", "Name"),
    Column("status", "Status"),
    Column("model_name", "Model"),
    Column("dataset_name", "Dataset"),
    Column("rollout_name", "Rollout"),
    Column("pass_rate", "Pass rate"),
    Column("created_at", "Created"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return list_resource(
        args, ctx, RUNS_PATH, "eval_runs", title="Eval runs", record=_listed, columns=COLUMNS
    )


def _listed(record: Mapping[str, Any]) -> dict[str, object]:
    item = eval_run(record)
    item["pass_rate"] = pass_rate_text(item.get("results"))
    return item
