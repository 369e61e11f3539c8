"""``osmosis train list [--limit N] [--all]``: the workspace's training runs on the platform."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import training_runs
from osmosis_ai.cli.output import Column, Context, ListResult, Result
from osmosis_ai.cli.platform_session import add_list_arguments, list_options, open_session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    limit, fetch_all = list_options(args)
    with open_session(ctx) as session:
        page = session.client.fetch(
            "/api/cli/training-runs", "training_runs", limit=limit, fetch_all=fetch_all
        )
        return ListResult(
            title="Training runs",
            items=[training_runs.training_run(item) for item in page.items],
            total_count=page.total_count,
            has_more=page.has_more,
            next_offset=page.next_offset,
            columns=[
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
            ],
            extra=session.result_context(),
        )
