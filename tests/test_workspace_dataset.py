"""Dataset files (jsonl, csv, parquet): validation rules, reading, row normalisation, --rows."""

from __future__ import annotations

import csv
import hashlib
import json
import sys

import pytest

from osmosis_ai.errors import ConfigError, MissingExtraError, UsageError
from osmosis_ai.workspace import (
    PARQUET_VALIDATION_SKIPPED,
    DatasetError,
    DatasetRow,
    RowSelectionError,
    dataset_sha256,
    normalize_row,
    read_rows,
    select_rows,
    validate_dataset,
)

PROMPT_ROWS = [
    {"system_prompt": "Be brief.", "user_prompt": f"{i} * 2 = ?", "ground_truth": str(2 * i)}
    for i in range(4)
]
META_ROWS = [{"metadata": {"task": f"t{i}", "level": i, "tags": ["a"]}} for i in range(4)]


def write_jsonl(path, rows, *, blank_lines=False):
    lines = [json.dumps(row) for row in rows]
    sep = "\n\n  \n" if blank_lines else "\n"
    path.write_text(sep.join(lines) + "\n", encoding="utf-8")
    return path


def write_csv(path, header, rows):
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def prompt_csv_rows():
    return [[r["system_prompt"], r["user_prompt"], r["ground_truth"]] for r in PROMPT_ROWS]


CSV_HEADER = ["system_prompt", "user_prompt", "ground_truth"]


# --- general rules ----------------------------------------------------------------------


def test_valid_jsonl_result_shape(tmp_path):
    path = write_jsonl(tmp_path / "math.jsonl", PROMPT_ROWS)
    result = validate_dataset(path)
    assert result.valid and result.row_count == 4
    assert result.to_dict() == {
        "valid": True,
        "file": str(path.resolve()),
        "file_name": "math.jsonl",
        "extension": "jsonl",
        "file_size": path.stat().st_size,
        "errors": [],
        "warnings": [],
    }


def test_missing_file_directory_extension_and_empty(tmp_path):
    assert validate_dataset(tmp_path / "nope.jsonl").errors[0].startswith("file not found")
    (tmp_path / "dir.jsonl").mkdir()
    assert "not a regular file" in validate_dataset(tmp_path / "dir.jsonl").errors[0]
    txt = tmp_path / "data.txt"
    txt.write_text("x")
    result = validate_dataset(txt)
    assert not result.valid and result.extension == "txt" and result.file_size == 1
    assert result.errors == ("unsupported extension '.txt': use .jsonl, .csv or .parquet",)
    (tmp_path / "empty.csv").write_bytes(b"")
    assert validate_dataset(tmp_path / "empty.csv").errors == ("file is empty",)


def test_uppercase_extension_is_accepted(tmp_path):
    assert validate_dataset(write_jsonl(tmp_path / "d.JSONL", PROMPT_ROWS)).valid


def test_files_over_5_gib_are_rejected(tmp_path):
    path = tmp_path / "huge.jsonl"
    with path.open("wb") as handle:
        handle.truncate(5 * 1024**3 + 1)  # sparse: costs no disk
    (error,) = validate_dataset(path).errors
    assert "limit" in error and "5 GiB" in error


def test_at_least_four_rows(tmp_path):
    result = validate_dataset(write_jsonl(tmp_path / "d.jsonl", PROMPT_ROWS[:3]))
    assert result.errors == ("the dataset has 3 rows; at least 4 are required",)


def test_validation_stops_after_five_errors(tmp_path):
    rows = [{"user_prompt": "", "ground_truth": "x"} for _ in range(20)]
    result = validate_dataset(write_jsonl(tmp_path / "d.jsonl", rows))
    assert list(result.errors) == [f"row {i}: missing 'user_prompt'" for i in range(5)]
    assert result.row_count is None


# --- prompt mode ------------------------------------------------------------------------


def test_prompt_mode_requires_user_prompt_and_ground_truth_columns(tmp_path):
    rows = [{"prompt": "x", "answer": "y"} for _ in range(4)]
    (error,) = validate_dataset(write_jsonl(tmp_path / "d.jsonl", rows)).errors
    assert "missing column 'user_prompt' and 'ground_truth' (or 'label')" in error


def test_label_is_an_alias_and_system_prompt_is_optional(tmp_path):
    rows = [{"user_prompt": "q", "label": "a", "extra": 1} for _ in range(4)]
    assert validate_dataset(write_jsonl(tmp_path / "d.jsonl", rows)).valid


def test_row_specific_prompt_errors(tmp_path):
    rows = [dict(r) for r in PROMPT_ROWS] + [dict(PROMPT_ROWS[0]) for _ in range(4)]
    rows[2]["ground_truth"] = None
    rows[5]["user_prompt"] = 7
    rows[6]["system_prompt"] = ["x"]
    rows[7]["ground_truth"] = "   "
    assert validate_dataset(write_jsonl(tmp_path / "d.jsonl", rows)).errors == (
        "row 2: missing 'ground_truth'",
        "row 5: 'user_prompt' must be a string, got integer",
        "row 6: 'system_prompt' must be a string, got array",
        "row 7: missing 'ground_truth'",
    )


def test_non_string_ground_truth_is_fine(tmp_path):
    rows = [{"user_prompt": "q", "ground_truth": 42} for _ in range(4)]
    assert validate_dataset(write_jsonl(tmp_path / "d.jsonl", rows)).valid


# --- JSONL ------------------------------------------------------------------------------


def test_jsonl_blank_lines_are_ignored(tmp_path):
    result = validate_dataset(write_jsonl(tmp_path / "d.jsonl", PROMPT_ROWS, blank_lines=True))
    assert result.valid and result.row_count == 4


def test_jsonl_torn_line_and_non_object(tmp_path):
    lines = [json.dumps(r) for r in PROMPT_ROWS] + ['{"user_prompt": "q", "ground', "[1, 2]"]
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(lines) + "\n")
    errors = validate_dataset(path).errors
    assert len(errors) == 2
    assert errors[0].startswith("line 5: invalid JSON (")
    assert errors[1] == "line 6: expected a JSON object, got array"


def test_jsonl_rejects_nan(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in PROMPT_ROWS) + '\n{"user_prompt": NaN}\n')
    (error,) = validate_dataset(path).errors
    assert error.startswith("line 5: invalid JSON") and "NaN" in error


def test_jsonl_rows_must_share_the_first_rows_keys(tmp_path):
    rows = [dict(r) for r in PROMPT_ROWS]
    del rows[2]["ground_truth"]
    rows[3]["bonus"] = 1
    path = write_jsonl(tmp_path / "d.jsonl", rows, blank_lines=True)
    assert validate_dataset(path).errors == (
        "row 2 (line 7): keys differ from the first row: missing 'ground_truth'",
        "row 3 (line 10): keys differ from the first row: unexpected 'bonus'",
    )


def test_jsonl_bad_utf8_and_bom(tmp_path):
    path = tmp_path / "d.jsonl"
    body = "\n".join(json.dumps(r, ensure_ascii=False) for r in PROMPT_ROWS).encode()
    path.write_bytes(b"\xef\xbb\xbf" + body + b'\n{"user_prompt": "\xff"}\n')
    assert validate_dataset(path).errors == ("line 5: not valid UTF-8 (byte 0xff)",)


# --- CSV --------------------------------------------------------------------------------


def test_valid_csv_with_bom_quotes_and_newlines(tmp_path):
    rows = prompt_csv_rows()
    rows[1][1] = 'multi\nline, "quoted"'
    path = write_csv(tmp_path / "d.csv", CSV_HEADER, rows)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    result = validate_dataset(path)
    assert result.valid and result.row_count == 4
    assert read_rows(path)[1]["user_prompt"] == 'multi\nline, "quoted"'


def test_csv_wrong_column_count(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("user_prompt,ground_truth\nq,a\nq,a,extra\nq\nq,a\nq,a\n")
    assert validate_dataset(path).errors == (
        "row 1 (line 3): has 3 columns, the header has 2",
        "row 2 (line 4): has 1 columns, the header has 2",
    )


def test_csv_empty_cell_is_a_missing_value(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("user_prompt,ground_truth\nq,a\nq,\nq,a\nq,a\n")
    assert validate_dataset(path).errors == ("row 1: missing 'ground_truth'",)


def test_csv_needs_a_header(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("\n\n")
    assert validate_dataset(path).errors == ("missing header row: the file holds no CSV records",)


def test_csv_header_problems(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("user_prompt,,ground_truth,user_prompt\n" + "q,x,a,q\n" * 4)
    assert validate_dataset(path).errors == (
        "header: column 2 has no name",
        "header: duplicate columns 'user_prompt'",
    )


def test_csv_non_utf8_bytes(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes(b"user_prompt,ground_truth\nq,a\nq\xe9,a\nq,a\nq,a\n")
    assert validate_dataset(path).errors == ("line 3: not valid UTF-8 (byte 0xe9)",)


def test_csv_blank_lines_are_skipped(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("user_prompt,ground_truth\n\nq,a\n\nq,a\nq,a\nq,a\n\n")
    assert validate_dataset(path).row_count == 4


# --- metadata mode ----------------------------------------------------------------------


def test_metadata_mode_jsonl_and_csv(tmp_path):
    assert validate_dataset(write_jsonl(tmp_path / "m.jsonl", META_ROWS)).valid
    rows = [[json.dumps(r["metadata"])] for r in META_ROWS]
    assert validate_dataset(write_csv(tmp_path / "m.csv", ["metadata"], rows)).valid
    as_strings = [{"metadata": json.dumps(r["metadata"])} for r in META_ROWS]
    assert validate_dataset(write_jsonl(tmp_path / "s.jsonl", as_strings)).valid


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        (None, "is null or blank"),
        ("  ", "is null or blank"),
        ({}, "is an empty object {}"),
        ("{}", "is an empty object {}"),
        ("[1]", "must be a JSON object, got array"),
        (3, "must be a JSON object, got integer"),
        ("{not json", "not valid JSON"),
        ({"a": {"b": {}}}, "'a.b' is an empty object"),
        ({"a": [{"b": {}}]}, "'a[0].b' is an empty object"),
        ({"big": 2**63}, "'big' = 9223372036854775808 is outside the signed 64-bit"),
        ({"small": -(2**63)}, None),
    ],
)
def test_metadata_cell_rules(tmp_path, value, fragment):
    rows = [dict(r) for r in META_ROWS]
    rows[2] = {"metadata": value}
    errors = validate_dataset(write_jsonl(tmp_path / "m.jsonl", rows)).errors
    if fragment is None:
        assert errors == ()
    else:
        (error,) = errors
        assert error.startswith("column 'metadata' row 2: ")
        assert fragment in error


def test_metadata_value_types_must_be_consistent(tmp_path):
    rows = [dict(r) for r in META_ROWS]
    rows[3] = {"metadata": {"task": 5, "level": 1.5, "tags": None}}  # number ~ integer, null ok
    (error,) = validate_dataset(write_jsonl(tmp_path / "m.jsonl", rows)).errors
    assert error == (
        "column 'metadata' row 3: 'task' is a number here but a string in row 0; "
        "a key must hold one type in every row"
    )


def test_prompt_columns_are_optional_in_metadata_mode(tmp_path):
    rows = [{"metadata": r["metadata"], "user_prompt": None} for r in META_ROWS]
    assert validate_dataset(write_jsonl(tmp_path / "m.jsonl", rows)).valid


# --- parquet ----------------------------------------------------------------------------


def test_parquet_skipped_with_a_warning_without_pyarrow(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1 not really")
    result = validate_dataset(path)
    assert result.valid
    (warning,) = result.to_dict()["warnings"]
    assert warning["code"] == PARQUET_VALIDATION_SKIPPED
    assert 'pip install "osmosis-ai[eval]"' in warning["message"]
    with pytest.raises(MissingExtraError, match=r"osmosis-ai\[eval\]"):
        read_rows(path)


@pytest.fixture
def pq():
    pytest.importorskip("pyarrow", reason="pyarrow not installed (extra eval)")
    import pyarrow.parquet

    return pyarrow.parquet


def write_parquet(pq, path, rows):
    import pyarrow

    pq.write_table(pyarrow.Table.from_pylist(rows), path)
    return path


def test_parquet_prompt_mode(pq, tmp_path):
    path = write_parquet(pq, tmp_path / "d.parquet", PROMPT_ROWS)
    result = validate_dataset(path)
    assert result.valid and result.row_count == 4 and result.extension == "parquet"
    assert read_rows(path) == PROMPT_ROWS


def test_parquet_metadata_struct_and_string(pq, tmp_path):
    assert validate_dataset(write_parquet(pq, tmp_path / "s.parquet", META_ROWS)).valid
    rows = [{"metadata": json.dumps(r["metadata"])} for r in META_ROWS]
    assert validate_dataset(write_parquet(pq, tmp_path / "j.parquet", rows)).valid
    rows[1] = {"metadata": "{}"}
    (error,) = validate_dataset(write_parquet(pq, tmp_path / "e.parquet", rows)).errors
    assert error.startswith("column 'metadata' row 1: is an empty object")


def test_parquet_row_errors(pq, tmp_path):
    rows = [dict(r) for r in PROMPT_ROWS]
    rows[1]["ground_truth"] = None
    path = write_parquet(pq, tmp_path / "d.parquet", rows)
    assert validate_dataset(path).errors == ("row 1: missing 'ground_truth'",)


def test_corrupt_parquet(pq, tmp_path):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"this is not parquet at all")
    (error,) = validate_dataset(path).errors
    assert error.startswith("not a readable Parquet file")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        read_rows(path)


# --- read_rows, sha ---------------------------------------------------------------------


def test_read_rows_jsonl_and_csv(tmp_path):
    assert (
        read_rows(write_jsonl(tmp_path / "d.jsonl", PROMPT_ROWS, blank_lines=True)) == PROMPT_ROWS
    )
    path = write_csv(tmp_path / "d.csv", CSV_HEADER, prompt_csv_rows())
    assert read_rows(path) == PROMPT_ROWS


def test_read_rows_limit_reads_only_the_first_rows(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in PROMPT_ROWS) + '\n{"broken": \n')
    assert read_rows(path, limit=2) == PROMPT_ROWS[:2]  # the bad last line is never reached
    with pytest.raises(DatasetError, match="line 5"):
        read_rows(path)


def test_read_rows_raises_at_the_first_bad_record(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"a": 1}\n{"a": \n{"a": 3}\n')
    with pytest.raises(DatasetError) as info:
        read_rows(path)
    assert isinstance(info.value, ConfigError)
    assert "line 2: invalid JSON" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(DatasetError, match="not found"):
        read_rows(tmp_path / "missing.csv")
    with pytest.raises(DatasetError, match="unsupported extension"):
        read_rows(tmp_path / "x.txt")


def test_dataset_sha256(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", PROMPT_ROWS)
    assert dataset_sha256(path) == hashlib.sha256(path.read_bytes()).hexdigest()


# --- normalize_row ----------------------------------------------------------------------


def test_normalize_prompt_row():
    row = normalize_row(PROMPT_ROWS[1], row_index=1)
    assert row == DatasetRow(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 * 2 = ?"}],
        "2",
        None,
        1,
    )


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        ({"user_prompt": "q", "ground_truth": "a", "label": "b"}, "a"),
        ({"user_prompt": "q", "ground_truth": "", "label": "b"}, "b"),
        ({"user_prompt": "q", "label": "b"}, "b"),
        ({"user_prompt": "q", "ground_truth": 42}, "42"),
        ({"user_prompt": "q", "ground_truth": {"x": [1]}}, '{"x": [1]}'),
        ({"user_prompt": "q"}, None),
    ],
)
def test_normalize_label(raw, label):
    row = normalize_row(raw)
    assert row.label == label
    assert row.initial_messages == [{"role": "user", "content": "q"}]


def test_normalize_metadata_rows():
    row = normalize_row({"metadata": '{"task": "t1"}', "system_prompt": ""})
    assert row == DatasetRow([], None, {"task": "t1"}, None)
    assert normalize_row({"metadata": {"a": 1}, "user_prompt": "q"}).metadata == {"a": 1}
    assert normalize_row({"metadata": "{}", "user_prompt": "q"}).metadata is None


@pytest.mark.parametrize(
    ("raw", "fragment"),
    [
        ({"system_prompt": "s"}, "row 9: needs a 'user_prompt' or a non-empty 'metadata' object"),
        ({"user_prompt": " ", "metadata": {}}, "row 9: needs a 'user_prompt'"),
        ({"user_prompt": 3}, "row 9: 'user_prompt' must be a string, got integer"),
        ({"metadata": "[1]"}, "row 9: column 'metadata' must be a JSON object, got array"),
        ({"metadata": "{bad"}, "row 9: column 'metadata' not valid JSON"),
    ],
)
def test_normalize_errors_name_the_row(raw, fragment):
    with pytest.raises(DatasetError) as info:
        normalize_row(raw, row_index=9)
    assert fragment in str(info.value)
    assert info.value.row_index == 9


# --- select_rows ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("3", [3]),
        ("3,7,10-12", [3, 7, 10, 11, 12]),
        (" 12 , 3-5,4, 3 ", [3, 4, 5, 12]),
        ("5-5", [5]),
        ("0-19", list(range(20))),
        ("10 - 11", [10, 11]),
    ],
)
def test_rows_spec(spec, expected):
    assert select_rows(20, spec) == expected


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("20", "'20' is out of range: the dataset has 20 rows (offsets 0-19)"),
        ("3,15-25", "'15-25' is out of range"),
        ("abc", "'abc' is not an offset (7) or a range (10-20)"),
        ("-3", "'-3' is not an offset"),
        ("1.5", "'1.5' is not an offset"),
        ("7-3", "'7-3' runs backwards; write 3-7"),
        ("1,,2", "empty entry"),
        ("1,", "empty entry"),
        ("", "the spec is empty"),
        ("٣", "'٣' is not an offset"),
    ],
)
def test_bad_rows_spec_names_the_bad_part(spec, fragment):
    with pytest.raises(RowSelectionError) as info:
        select_rows(20, spec)
    assert isinstance(info.value, UsageError)
    assert fragment in str(info.value)


def test_bad_rows_spec_reports_every_bad_part():
    with pytest.raises(RowSelectionError) as info:
        select_rows(5, "x,9,2-1")
    message = str(info.value)
    assert "'x'" in message and "'9'" in message and "'2-1'" in message


def test_rows_spec_on_an_empty_dataset():
    with pytest.raises(RowSelectionError, match="0 rows"):
        select_rows(0, "0")


def test_limit_and_all():
    assert select_rows(10, None, 3) == [0, 1, 2]
    assert select_rows(2, None, 5) == [0, 1]
    assert select_rows(4) == [0, 1, 2, 3]
    assert select_rows(5, "4", 2) == [4]  # --rows wins over limit
    with pytest.raises(RowSelectionError, match="positive"):
        select_rows(5, None, 0)


def test_rows_as_offsets():
    assert select_rows(10, [4, 0, 4, 2]) == [0, 2, 4]  # sorted, once each
    assert select_rows(5, (1,), 2) == [1]  # offsets win over limit, as a spec does
    assert select_rows(3, []) == []
    with pytest.raises(RowSelectionError, match=r"rows \[3, -1\] are out of range"):
        select_rows(3, [0, 3, -1])
