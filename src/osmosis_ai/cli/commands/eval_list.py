"""``osmosis eval list [--limit N] [--all]``: the workspace's managed and imported eval runs."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.eval_platform import RUNS_PATH, eval_run, pass_rate_text
from osmosis_ai.cli.output import Column, Context, ListResult, Result
from osmosis_ai.cli.platform_session import add_list_arguments, list_options, open_session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    limit, fetch_all = list_options(args)
    with open_session(ctx) as session:
        page = session.client.fetch(RUNS_PATH, "eval_runs", limit=limit, fetch_all=fetch_all)
        items = [eval_run(item) for item in page.items]
        for item in items:
            item["pass_rate"] = pass_rate_text(item.get("results"))
        return ListResult(
            title="Eval runs",
            items=items,
            total_count=page.total_count,
            has_more=page.has_more,
            next_offset=page.next_offset,
            columns=[
                Column("name", "Name"),
                Column("status", "Status"),
                Column("model_name", "Model"),
                Column("dataset_name", "Dataset"),
                Column("rollout_name", "Rollout"),
                Column("pass_rate", "Pass rate"),
                Column("created_at", "Created"),
            ],
            extra=session.result_context(),
        )
