"""Dataset rows as a run sees them: normalised rows and ``--rows`` selection.

Row numbers are 0-based source offsets everywhere (messages, ``--rows``, ``source_row_index``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from osmosis_ai.errors import UsageError
from osmosis_ai.rundir.datasets import DatasetError

_RANGE = re.compile(r"([0-9]+)(?:\s*-\s*([0-9]+))?")


class RowSelectionError(UsageError):
    """A ``--rows`` spec or a row limit is malformed or out of range."""


@dataclass(frozen=True)
class DatasetRow:
    """One row ready for a rollout: the opening messages, the label and the metadata."""

    initial_messages: list[dict[str, str]]
    label: str | None
    metadata: dict[str, object] | None
    source_row_index: int | None = None


def parse_metadata(value: object) -> dict[str, object] | None:
    """A row's ``metadata`` cell as a dict: a native object or a JSON-object string.

    Absent, null and blank become ``None``; anything else that is not an object raises
    ``ValueError`` with the reason.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ValueError(f"must be a JSON object, got {json_type(value)}")
    return {str(key): item for key, item in value.items()}


def json_type(value: object) -> str:
    """The JSON name of a decoded value's type."""
    if value is None:
        return "null"
    for cls, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string")):
        if isinstance(value, cls):
            return name
    if isinstance(value, list | tuple):
        return "array"
    return "object" if isinstance(value, dict) else type(value).__name__


def normalize_row(row: Mapping[str, object], *, row_index: int | None = None) -> DatasetRow:
    """Turn a raw row into a :class:`DatasetRow`.

    ``initial_messages`` = the optional ``system_prompt`` then ``user_prompt``; ``label`` =
    ``ground_truth``, else ``label`` (non-strings become JSON text); ``metadata`` = a
    non-empty object or ``None``. A row needs a prompt or non-empty metadata.
    """
    where = f"row {row_index}" if row_index is not None else "row"
    messages: list[dict[str, str]] = []
    for column, role in (("system_prompt", "system"), ("user_prompt", "user")):
        value = row.get(column)
        if value is None or (isinstance(value, str) and not value.strip()):
            continue
        if not isinstance(value, str):
            raise DatasetError(
                f"{where}: {column!r} must be a string, got {json_type(value)}",
                row_index=row_index,
            )
        messages.append({"role": role, "content": value})
    try:
        metadata = parse_metadata(row.get("metadata")) or None
    except ValueError as exc:
        raise DatasetError(f"{where}: column 'metadata' {exc}", row_index=row_index) from None
    if not any(m["role"] == "user" for m in messages) and metadata is None:
        raise DatasetError(
            f"{where}: needs a 'user_prompt' or a non-empty 'metadata' object",
            row_index=row_index,
        )
    label = _label_text(row.get("ground_truth"))
    if label is None:
        label = _label_text(row.get("label"))
    return DatasetRow(messages, label, metadata, row_index)


def _label_text(value: object) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value if value.strip() else None
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def select_rows(
    total: int, rows: str | Sequence[int] | None = None, limit: int | None = None
) -> list[int]:
    """The source offsets a run uses: ``rows`` (a spec ``"3,7,10-20"`` or the offsets
    themselves), else the first ``limit`` rows, else all ``total``. Offsets come back
    deduplicated and sorted."""
    if total < 0:
        raise UsageError(f"total must be ≥ 0, got {total}")
    if isinstance(rows, str):
        return _parse_rows_spec(rows, total)
    if rows is not None:
        outside = [r for r in rows if isinstance(r, bool) or not 0 <= r < total]
        if outside:
            raise RowSelectionError(
                f"rows {outside[:5]} are out of range: the dataset has {total} rows"
            )
        return sorted(set(rows))
    if limit is not None:
        if isinstance(limit, bool) or limit < 1:
            raise RowSelectionError(f"limit must be a positive integer, got {limit!r}")
        return list(range(min(limit, total)))
    return list(range(total))


def _parse_rows_spec(spec: str, total: int) -> list[int]:
    chosen: set[int] = set()
    problems: list[str] = []
    if not spec.strip():
        problems.append("the spec is empty")
    for part in spec.split(",") if spec.strip() else ():
        text = part.strip()
        match = _RANGE.fullmatch(text)
        if not text:
            problems.append("empty entry (a doubled or trailing comma)")
        elif match is None:
            problems.append(f"{text!r} is not an offset (7) or a range (10-20)")
        else:
            low = int(match[1])
            high = int(match[2]) if match[2] is not None else low
            if low > high:
                problems.append(f"{text!r} runs backwards; write {high}-{low}")
            elif high >= total:
                span = f"offsets 0-{total - 1}" if total else "no rows"
                problems.append(f"{text!r} is out of range: the dataset has {total} rows ({span})")
            else:
                chosen.update(range(low, high + 1))
    if problems:
        raise RowSelectionError(
            f"Invalid --rows {spec!r}: " + "; ".join(problems) + " (use e.g. 3,7,10-20)"
        )
    return sorted(chosen)
