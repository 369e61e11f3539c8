"""Dataset files (``.jsonl``, ``.csv``, ``.parquet``): validation, reading and hashing.

``validate_dataset`` is ``osmosis dataset validate``: it stops after 5 errors and names the
line, row (0-based offset) or column of each. Parquet needs pyarrow (the ``eval`` extra).
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import NoReturn

from osmosis_ai.errors import MissingExtraError, OsmosisError
from osmosis_ai.rundir.datasets import DATASET_SUFFIXES
from osmosis_ai.workspace.rows import DatasetError, json_type, parse_metadata

EXTENSIONS = tuple(suffix.removeprefix(".") for suffix in DATASET_SUFFIXES)
MAX_FILE_SIZE = 5 * 1024**3
MIN_ROWS = 4
MAX_ERRORS = 5
PARQUET_VALIDATION_SKIPPED = "PARQUET_VALIDATION_SKIPPED"
_INT64 = (-(2**63), 2**63 - 1)

Row = dict[str, object]


@dataclass(frozen=True)
class DatasetWarning:
    """A non-fatal finding, with a stable ``code`` for the CLI's warning envelope."""

    code: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


@dataclass(frozen=True)
class DatasetValidation:
    """The result of :func:`validate_dataset`; ``to_dict()`` is the CLI's JSON data."""

    file: Path
    extension: str
    file_size: int | None
    errors: tuple[str, ...]
    warnings: tuple[DatasetWarning, ...] = ()
    row_count: int | None = None  # None when validation stopped early or was skipped

    @property
    def valid(self) -> bool:
        return not self.errors

    @property
    def file_name(self) -> str:
        return self.file.name

    def to_dict(self) -> dict[str, object]:
        return {
            "valid": self.valid,
            "file": str(self.file),
            "file_name": self.file_name,
            "extension": self.extension,
            "file_size": self.file_size,
            "errors": list(self.errors),
            "warnings": [warning.to_dict() for warning in self.warnings],
        }


class _StopError(OsmosisError):
    """Raised by :class:`_Errors` once its limit is reached."""


class _Errors:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[str] = []

    def add(self, message: str) -> None:
        self.items.append(message)
        if len(self.items) >= self.limit:
            raise _StopError

    def fatal(self, message: str) -> NoReturn:
        """Record an error after which the file cannot be read further."""
        self.items.append(message)
        raise _StopError


def validate_dataset(path: Path) -> DatasetValidation:
    """Check a dataset file against every rule of the dataset format; never raises for bad data."""
    path = Path(path).expanduser().resolve()
    extension = path.suffix.lower().lstrip(".")

    def result(*errors: str, size: int | None = None) -> DatasetValidation:
        return DatasetValidation(path, extension, size, errors)

    if not path.exists():
        return result(f"file not found: {path}")
    if not path.is_file():
        return result(f"not a regular file: {path}")
    size = path.stat().st_size
    if extension not in EXTENSIONS:
        shown = f"'.{extension}'" if extension else "none"
        return result(f"unsupported extension {shown}: use .jsonl, .csv or .parquet", size=size)
    if size == 0:
        return result("file is empty", size=size)
    if size > MAX_FILE_SIZE:
        return result(f"file is {size} bytes; the limit is {MAX_FILE_SIZE} (5 GiB)", size=size)
    if extension == "parquet" and _parquet_module() is None:
        message = (
            'Parquet validation skipped: pyarrow is not installed (pip install "osmosis-ai[eval]")'
        )
        warning = DatasetWarning(PARQUET_VALIDATION_SKIPPED, message)
        return DatasetValidation(path, extension, size, (), (warning,))
    errors = _Errors(MAX_ERRORS)
    count: int | None = None
    try:
        count = _RowChecker(errors).run(_records(path, extension, errors))
    except _StopError:
        pass
    except OSError as exc:
        errors.items.append(f"cannot read the file ({exc.strerror or exc})")
    if count is not None and count < MIN_ROWS and len(errors.items) < MAX_ERRORS:
        errors.items.append(f"the dataset has {count} rows; at least {MIN_ROWS} are required")
    return DatasetValidation(path, extension, size, tuple(errors.items), row_count=count)


def read_rows(path: Path, *, limit: int | None = None) -> list[Row]:
    """Parse the rows of a dataset file (the first ``limit`` when given); raise
    :class:`DatasetError` at the first bad one.

    Parsing only: run :func:`validate_dataset` for the content rules.
    """
    path = Path(path).expanduser()
    extension = path.suffix.lower().lstrip(".")
    if extension not in EXTENSIONS:
        raise DatasetError(f"unsupported extension {path.suffix!r}: use .jsonl, .csv or .parquet")
    if not path.is_file():
        raise DatasetError("file not found", path=path)
    if extension == "parquet" and _parquet_module() is None:
        raise MissingExtraError("eval", "Reading Parquet datasets", "pyarrow")
    errors = _Errors(1)
    records = _records(path, extension, errors)
    try:
        rows = (row for _, row in records if row is not None)
        return list(rows if limit is None else itertools.islice(rows, limit))
    except _StopError:
        raise DatasetError(errors.items[0], path=path) from None
    finally:
        if isinstance(records, Generator):
            records.close()  # a limited read stops early: close the file now


def dataset_sha256(path: Path) -> str:
    """Hex SHA-256 of the file's bytes (pins the dataset in a run manifest)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _parquet_module() -> ModuleType | None:
    try:
        import pyarrow.parquet
    except ImportError:
        return None
    return pyarrow.parquet


# Readers yield (row offset, row) for every data record; ``None`` marks a record already
# reported as broken, so it still counts as a row.
_Records = Iterator[tuple[int, Row | None]]


def _records(path: Path, extension: str, errors: _Errors) -> _Records:
    if extension == "jsonl":
        return _jsonl_records(path, errors)
    if extension == "csv":
        return _csv_records(path, errors)
    return _parquet_records(path, errors)


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not valid JSON")


def _jsonl_records(path: Path, errors: _Errors) -> _Records:
    first_keys: list[str] | None = None
    index = 0
    with path.open("rb") as handle:
        for line_no, data in enumerate(handle, start=1):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.add(f"line {line_no}: not valid UTF-8 (byte {data[exc.start]:#04x})")
                yield index, None
                index += 1
                continue
            text = text.removeprefix("\ufeff") if line_no == 1 else text
            if not text.strip():
                continue
            row_index, index = index, index + 1
            try:
                value = json.loads(text, parse_constant=_reject_constant)
            except ValueError as exc:
                errors.add(f"line {line_no}: invalid JSON ({exc})")
                yield row_index, None
                continue
            if not isinstance(value, dict):
                errors.add(f"line {line_no}: expected a JSON object, got {json_type(value)}")
                yield row_index, None
                continue
            row: Row = value
            if first_keys is None:
                first_keys = list(row)
            elif set(row) != set(first_keys):
                missing = [k for k in first_keys if k not in row]
                extra = [k for k in row if k not in first_keys]
                diff = "; ".join(
                    f"{label} {', '.join(repr(k) for k in keys)}"
                    for label, keys in (("missing", missing), ("unexpected", extra))
                    if keys
                )
                errors.add(
                    f"row {row_index} (line {line_no}): keys differ from the first row: {diff}"
                )
                yield row_index, None
                continue
            yield row_index, row


def _csv_lines(path: Path, errors: _Errors) -> Iterator[str]:
    """The file's lines decoded one by one, so a bad byte is reported with its line."""
    with path.open("rb") as handle:
        for line_no, data in enumerate(handle, start=1):
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.add(f"line {line_no}: not valid UTF-8 (byte {data[exc.start]:#04x})")
                text = data.decode("utf-8", errors="replace")
            yield text.removeprefix("\ufeff") if line_no == 1 else text


def _csv_records(path: Path, errors: _Errors) -> _Records:
    reader = csv.reader(_csv_lines(path, errors))
    try:
        header = next(reader, None)
        while header == []:
            header = next(reader, None)
        if header is None:
            errors.fatal("missing header row: the file holds no CSV records")
        for position, name in enumerate(header):
            if not name.strip():
                errors.add(f"header: column {position + 1} has no name")
        duplicates = sorted({name for name in header if header.count(name) > 1})
        if duplicates:
            errors.add(f"header: duplicate columns {', '.join(map(repr, duplicates))}")
        index = 0
        for values in reader:
            if not values:
                continue
            row_index, index = index, index + 1
            if len(values) != len(header):
                errors.add(
                    f"row {row_index} (line {reader.line_num}): has {len(values)} columns, "
                    f"the header has {len(header)}"
                )
                yield row_index, None
                continue
            yield row_index, dict(zip(header, values, strict=True))
    except csv.Error as exc:
        errors.fatal(f"line {reader.line_num}: malformed CSV ({exc})")


def _parquet_records(path: Path, errors: _Errors) -> _Records:
    parquet = _parquet_module()
    if parquet is None:  # callers check first; kept for the type checker
        raise MissingExtraError("eval", "Reading Parquet datasets", "pyarrow")
    try:
        source = parquet.ParquetFile(path)
        names: list[str] = list(source.schema_arrow.names)
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            errors.fatal(f"schema: duplicate columns {', '.join(map(repr, duplicates))}")
        index = 0
        for batch in source.iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                yield index, row
                index += 1
    except (OSError, ValueError, TypeError, NotImplementedError) as exc:  # pyarrow's Arrow*Error
        errors.fatal(f"not a readable Parquet file ({exc})")


class _RowChecker:
    """The content rules shared by all formats: prompt mode or metadata mode."""

    def __init__(self, errors: _Errors) -> None:
        self.errors = errors
        self.metadata_mode: bool | None = None
        self.label_column: str | None = None
        self.check_prompt = True
        self.key_types: dict[str, tuple[str, int]] = {}  # metadata key -> (type, first row)

    def run(self, records: _Records) -> int:
        count = 0
        for row_index, row in records:
            count += 1
            if row is None:
                continue
            if self.metadata_mode is None:
                self._choose_mode(row)
            if self.metadata_mode:
                self._check_metadata(row_index, row.get("metadata"))
            else:
                self._check_prompt_row(row_index, row)
        return count

    def _choose_mode(self, row: Row) -> None:
        self.metadata_mode = "metadata" in row
        if self.metadata_mode:
            return
        self.label_column = next((c for c in ("ground_truth", "label") if c in row), None)
        missing = [] if "user_prompt" in row else ["'user_prompt'"]
        if self.label_column is None:
            missing.append("'ground_truth' (or 'label')")
        if missing:
            self.check_prompt = False
            self.errors.add(
                f"missing column {' and '.join(missing)}: prompt datasets need user_prompt and "
                "ground_truth; or add a 'metadata' column"
            )

    def _check_prompt_row(self, row_index: int, row: Row) -> None:
        if not self.check_prompt or self.label_column is None:
            return
        if _blank(row.get("user_prompt")):
            self.errors.add(f"row {row_index}: missing 'user_prompt'")
        if _blank(row.get("ground_truth")) and _blank(row.get("label")):
            self.errors.add(f"row {row_index}: missing {self.label_column!r}")
        if not isinstance(row.get("user_prompt"), str | None):
            got = json_type(row.get("user_prompt"))
            self.errors.add(f"row {row_index}: 'user_prompt' must be a string, got {got}")
        if not isinstance(row.get("system_prompt"), str | None):
            got = json_type(row.get("system_prompt"))
            self.errors.add(f"row {row_index}: 'system_prompt' must be a string, got {got}")

    def _check_metadata(self, row_index: int, value: object) -> None:
        where = f"column 'metadata' row {row_index}"
        try:
            metadata = parse_metadata(value)
        except ValueError as exc:
            self.errors.add(f"{where}: {exc}")
            return
        if not metadata:
            empty = "is null or blank" if metadata is None else "is an empty object {}"
            self.errors.add(f"{where}: {empty}; every row needs a non-empty JSON object")
            return
        problem = _nested_problem(metadata, "")
        if problem:
            self.errors.add(f"{where}: {problem}")
        for key, item in metadata.items():
            kind = _type_class(item)
            if kind is None:
                continue
            seen = self.key_types.setdefault(key, (kind, row_index))
            if seen[0] != kind:
                self.errors.add(
                    f"{where}: {key!r} is {kind} here but {seen[0]} in row {seen[1]}; "
                    "a key must hold one type in every row"
                )


def _blank(value: object) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def _type_class(value: object) -> str | None:
    """The type a metadata value counts as for the consistency rule (nulls match anything)."""
    kind = json_type(value)
    if kind == "null":
        return None
    if kind in ("integer", "number"):
        return "a number"
    return "an object" if kind == "object" else f"a {kind}"


def _nested_problem(value: object, where: str) -> str | None:
    """The first empty nested object or out-of-range integer inside ``value``, described."""
    if isinstance(value, dict):
        if where and not value:
            return f"{where!r} is an empty object"
        for key, item in value.items():
            found = _nested_problem(item, f"{where}.{key}" if where else str(key))
            if found:
                return found
    elif isinstance(value, list | tuple):
        for position, item in enumerate(value):
            found = _nested_problem(item, f"{where}[{position}]")
            if found:
                return found
    elif (
        isinstance(value, int)
        and not isinstance(value, bool)
        and not _INT64[0] <= value <= _INT64[1]
    ):
        return f"{where!r} = {value} is outside the signed 64-bit integer range"
    return None
