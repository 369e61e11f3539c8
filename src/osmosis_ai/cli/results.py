"""What commands return: the result types, and how their values read as text.

Shared by :mod:`osmosis_ai.cli.output` (which picks the format and prints) and
:mod:`osmosis_ai.cli.console` (rich rendering); imports neither.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import date, datetime
from enum import Enum
from pathlib import PurePath

__all__ = [
    "Column",
    "DetailResult",
    "ListResult",
    "MessageResult",
    "OperationResult",
    "Result",
    "SectionedListResult",
    "detail_fields",
    "encode",
    "label_of",
    "list_columns",
    "plain_value",
]


# --- result types ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class Result:
    """Base of every result; a non-zero ``exit_code`` ends the process with it after rendering."""

    exit_code: int = 0


@dataclass(frozen=True)
class Column:
    """A column of a list: the item key it shows and its header."""

    key: str
    label: str


@dataclass(kw_only=True)
class ListResult(Result):
    """A page of items. ``columns`` picks what rich and plain show (default: every key)."""

    items: list[dict[str, object]]
    total_count: int | None = None  # None: len(items)
    has_more: bool = False
    next_offset: int | None = None
    title: str = ""
    columns: list[Column] = field(default_factory=list[Column])
    extra: dict[str, object] = field(default_factory=dict[str, object])


@dataclass(kw_only=True)
class SectionedListResult(Result):
    """Independently paginated lists under one envelope, one key per section."""

    sections: dict[str, ListResult]
    title: str = ""
    extra: dict[str, object] = field(default_factory=dict[str, object])  # top-level keys


@dataclass(kw_only=True)
class DetailResult(Result):
    """One resource. ``fields`` are the (label, value) rows humans see (default: ``data``)."""

    data: dict[str, object]
    title: str = ""
    fields: list[tuple[str, object]] | None = None


@dataclass(kw_only=True)
class OperationResult(Result):
    """The outcome of a mutation: ``operation`` (``doctor``, ``dataset.upload``) and ``status``."""

    operation: str
    status: str
    resource: dict[str, object] | None = None
    message: str | None = None
    next_steps: list[str] = field(default_factory=list[str])  # shown to humans only
    next_steps_structured: list[dict[str, object]] = field(default_factory=list[dict[str, object]])
    extra: dict[str, object] = field(default_factory=dict[str, object])


@dataclass(kw_only=True)
class MessageResult(Result):
    """A free-form message."""

    message: str
    extra: dict[str, object] = field(default_factory=dict[str, object])


# --- values as text -------------------------------------------------------------------------


def list_columns(result: ListResult) -> list[Column]:
    if result.columns:
        return result.columns
    keys: dict[str, None] = {}
    for item in result.items:
        keys.update(dict.fromkeys(item))
    return [Column(key, label_of(key)) for key in keys]


def detail_fields(result: DetailResult) -> list[tuple[str, object]]:
    if result.fields is not None:
        return result.fields
    return [(label_of(key), value) for key, value in result.data.items()]


def label_of(key: str) -> str:
    return key.replace("_", " ").capitalize()


def plain_value(value: object) -> str:
    """One line of text for a value: scalars as text, lists joined, objects as JSON."""
    if value is None:
        text = ""
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list | tuple) and all(
        not isinstance(item, dict | list | tuple)
        for item in value  # pyright: ignore[reportUnknownVariableType]
    ):
        text = ", ".join(plain_value(item) for item in value)  # pyright: ignore[reportUnknownVariableType]
    elif isinstance(value, dict | list | tuple):
        try:
            text = encode(value)
        except (TypeError, ValueError):
            text = str(value)  # pyright: ignore[reportUnknownArgumentType]
    else:
        text = str(value)
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


def encode(value: object) -> str:
    """Strict JSON (no NaN/Infinity); paths, dates and enums become strings."""
    return json.dumps(value, allow_nan=False, ensure_ascii=False, default=_json_default)


def _json_default(value: object) -> object:
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, set | frozenset | tuple):
        return list(value)  # pyright: ignore[reportUnknownArgumentType]
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
