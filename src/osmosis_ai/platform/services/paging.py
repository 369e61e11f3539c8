"""The two pagination shapes of reference §6: offset pages for lists, cursor pages for logs.

Lists take ``limit`` (1 to 50) and ``offset`` (0 or more) and answer ``{<items>,
total_count, has_more, next_offset}``. Logs take ``limit`` (1 to 200), ``direction``
(``older``, the default: the newest page first; or ``newer``) and an opaque ``cursor``
from a previous page; entries are oldest-first within a page and ``next_cursor`` continues
in the same direction (``None`` at the end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from sqlalchemy import Select, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session

from osmosis_ai.platform.errors import InvalidRequestError

MAX_PAGE = 50
MAX_LOG_PAGE = 200
Direction = Literal["older", "newer"]
T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    items: list[T]
    total_count: int
    offset: int

    @property
    def has_more(self) -> bool:
        return self.offset + len(self.items) < self.total_count

    @property
    def next_offset(self) -> int | None:
        return self.offset + len(self.items) if self.has_more else None


def check_page(limit: int, offset: int, *, cap: int = MAX_PAGE) -> None:
    if not 1 <= limit <= cap:
        raise InvalidRequestError(f"limit must be from 1 to {cap}, got {limit}", field="limit")
    if offset < 0:
        raise InvalidRequestError(f"offset must be 0 or more, got {offset}", field="offset")


def offset_page(session: Session, query: Select[T], limit: int, offset: int) -> Page[T]:
    """One page of ``query`` (already ordered) and the count of all its rows."""
    check_page(limit, offset)
    total = session.scalar(select(func.count()).select_from(query.order_by(None).subquery()))
    items = list(session.scalars(query.limit(limit).offset(offset)))
    return Page(items, int(total or 0), offset)


@dataclass(frozen=True)
class CursorPage(Generic[T]):
    items: list[T]
    next_cursor: str | None


def cursor_page(
    session: Session,
    query: Select[T],
    id_column: InstrumentedAttribute[int],
    *,
    limit: int,
    direction: str,
    cursor: str | None,
) -> CursorPage[T]:
    """A page of log rows keyed by an increasing integer ``id_column``."""
    if not 1 <= limit <= MAX_LOG_PAGE:
        raise InvalidRequestError(
            f"limit must be from 1 to {MAX_LOG_PAGE}, got {limit}", field="limit"
        )
    if direction not in ("older", "newer"):
        raise InvalidRequestError(
            f"direction must be 'older' or 'newer', got {direction!r}", field="direction"
        )
    after: int | None = None
    if cursor is not None:
        try:
            after = int(cursor)
        except ValueError:
            raise InvalidRequestError(
                f"invalid cursor {cursor!r}: pass the next_cursor of a previous page",
                field="cursor",
            ) from None
    if direction == "older":
        if after is not None:
            query = query.where(id_column < after)
        rows: Sequence[Any] = list(
            session.scalars(query.order_by(id_column.desc()).limit(limit + 1))
        )
        more = len(rows) > limit
        page = list(reversed(rows[:limit]))
        edge = page[0] if page else None
    else:
        if after is not None:
            query = query.where(id_column > after)
        rows = list(session.scalars(query.order_by(id_column.asc()).limit(limit + 1)))
        more = len(rows) > limit
        page = list(rows[:limit])
        edge = page[-1] if page else None
    next_cursor = str(getattr(edge, id_column.key)) if more and edge is not None else None
    return CursorPage(page, next_cursor)
