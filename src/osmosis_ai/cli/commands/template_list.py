"""``osmosis template list``: the templates bundled with osmosis-ai, offline."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.output import Column, Context, ListResult, Result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options."""


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.workspace.templates import list_templates

    items = [info.to_dict() for info in list_templates()]
    return ListResult(
        items=items,
        title="Templates (osmosis template apply NAME)",
        columns=[
            Column("name", "Name"),
            Column("description", "Description"),
            Column("training_ready", "Training"),
        ],
    )
