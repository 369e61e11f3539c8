"""``osmosis model list [--type all|base|lora]``: base models and trained LoRA models.

``all`` is a sectioned result (``base_models``, ``lora_models``), each section paginated
on its own; ``base`` or ``lora`` is one plain list.
"""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Column, Context, ListResult, Result, SectionedListResult
from osmosis_ai.cli.platform_list import page_result
from osmosis_ai.cli.platform_session import (
    Session,
    add_list_arguments,
    list_options,
    open_session,
)

BASE_COLUMNS = [
    Column("model_name", "Name"),
    Column("base_model", "Base model"),
    Column("created_at", "Created"),
    Column("creator_name", "Created by"),
]
LORA_COLUMNS = [
    Column("model_name", "Name"),
    Column("base_model", "Base model"),
    Column("training_run_name", "Training run"),
    Column("checkpoint_step", "Step"),
    Column("reward", "Reward"),
    Column("created_at", "Created"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)
    parser.add_argument(
        "--type", choices=("all", "base", "lora"), default="all", help="default: all"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    limit, fetch_all = list_options(args)
    with open_session(ctx) as session:
        base = _base(session, limit, fetch_all) if args.type in ("all", "base") else None
        lora, quota = (
            _lora(session, limit, fetch_all) if args.type in ("all", "lora") else (None, {})
        )
    context = session.result_context()
    if base is not None and lora is None:
        base.extra = context
        return base
    if lora is not None and base is None:
        lora.extra = {**context, **quota}
        return lora
    assert base is not None and lora is not None
    return SectionedListResult(
        sections={"base_models": base, "lora_models": lora},
        extra={**context, **quota},
    )


def _base(session: Session, limit: int, fetch_all: bool) -> ListResult:
    page = session.client.fetch("/api/cli/models/base", "models", limit=limit, fetch_all=fetch_all)
    return page_result(page, title="Base models", record=records.base_model, columns=BASE_COLUMNS)


def _lora(session: Session, limit: int, fetch_all: bool) -> tuple[ListResult, dict[str, object]]:
    page = session.client.fetch("/api/cli/models/lora", "models", limit=limit, fetch_all=fetch_all)
    quota: dict[str, object] = {}
    columns = list(LORA_COLUMNS)
    if any(item.get("checkpoint_type") for item in page.items):  # a full checkpoint is no LoRA
        columns.insert(1, Column("checkpoint_type", "Type"))
    if "active_deployments" in page.body:  # omitted when inference is unavailable
        quota = {
            "active_deployments": page.body.get("active_deployments", 0),
            "max_active_deployments": page.body.get("max_active_deployments", 0),
        }
        columns.append(Column("deployment_status", "Deployment"))
    result = page_result(page, title="Trained models", record=records.lora_model, columns=columns)
    return result, quota
