"""What every ``osmosis <resource> list`` does: one page (``--limit``) or every page
(``--all``) of a platform resource, each item shown through its record, as a ``ListResult``."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from osmosis_ai.cli.output import Column, Context, ListResult
from osmosis_ai.cli.platform_session import list_options, open_session

if TYPE_CHECKING:
    from osmosis_ai.platform.client import Page

Record = Callable[[Mapping[str, Any]], dict[str, object]]


def page_result(page: Page, *, title: str, record: Record, columns: list[Column]) -> ListResult:
    """``page`` as a list result: its items through ``record``, its counts as they came."""
    return ListResult(
        title=title,
        items=[record(item) for item in page.items],
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
        columns=columns,
    )


def list_resource(
    args: argparse.Namespace,
    ctx: Context,
    path: str,
    items_key: str,
    *,
    title: str,
    record: Record,
    columns: list[Column],
    params: Mapping[str, str | int] | None = None,
    extra: Callable[[Page], dict[str, object]] | None = None,
) -> ListResult:
    """The list at ``path`` (its items under ``items_key``) for the command line ``args``;
    the result carries the session's context, then what ``extra`` takes from the page."""
    limit, fetch_all = list_options(args)
    with open_session(ctx) as session:
        page = session.client.fetch(
            path, items_key, limit=limit, fetch_all=fetch_all, params=params
        )
    result = page_result(page, title=title, record=record, columns=columns)
    result.extra = {**session.result_context(), **(extra(page) if extra is not None else {})}
    return result
