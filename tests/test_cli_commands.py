"""``osmosis dataset validate`` and ``osmosis doctor``, with their JSON pinned by golden files."""

from __future__ import annotations

import csv
import json
import sys

import pytest

from cli_support import check_golden, invoke, normalise

ROWS = [{"user_prompt": f"{i} * 2 = ?", "ground_truth": str(2 * i)} for i in range(4)]
SCAFFOLD = [
    "rollouts",
    "configs/training",
    "configs/eval",
    "data",
    "data/.gitkeep",
    "AGENTS.md",
    "CLAUDE.md",
    "configs/AGENTS.md",
]


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OSMOSIS_ENV_FILE", raising=False)
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "")


def golden(name, outcome, tmp_path):
    check_golden(name, normalise(outcome, {str(tmp_path): "<TMP>"}))


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def write_csv(path, rows):
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


# --- dataset validate -------------------------------------------------------------------------


def test_valid_jsonl(capsys, tmp_path):
    write_jsonl(tmp_path / "data.jsonl", ROWS)
    result = invoke(capsys, "dataset", "validate", "data.jsonl", "--json")
    assert result.code == 0 and result.err == ""
    assert result.json()["data"] == {
        "valid": True,
        "file": str(tmp_path / "data.jsonl"),
        "file_name": "data.jsonl",
        "extension": "jsonl",
        "file_size": (tmp_path / "data.jsonl").stat().st_size,
        "errors": [],
        "warnings": [],
    }
    golden("dataset_validate_valid_jsonl", result, tmp_path)


def test_valid_csv_in_every_format(capsys, tmp_path):
    write_csv(tmp_path / "data.csv", ROWS)
    result = invoke(capsys, "--json", "dataset", "validate", "data.csv")
    assert result.code == 0
    golden("dataset_validate_valid_csv", result, tmp_path)
    plain = invoke(capsys, "dataset", "validate", "data.csv", "--plain")
    assert plain.out.splitlines() == [
        f"File: {tmp_path / 'data.csv'}",
        "Format: csv",
        f"Size: {(tmp_path / 'data.csv').stat().st_size} bytes",
        "Rows: 4",
    ]
    rich = invoke(capsys, "dataset", "validate", "data.csv")
    assert rich.code == 0 and "Valid dataset: data.csv" in rich.out


def test_invalid_jsonl_is_a_validation_error(capsys, tmp_path):
    (tmp_path / "bad.jsonl").write_text('{"user_prompt": "a"}\nnot json\n', encoding="utf-8")
    result = invoke(capsys, "dataset", "validate", "bad.jsonl", "--json")
    assert result.code == 1 and result.out == ""
    error = result.error()["error"]
    assert error["code"] == "VALIDATION"
    assert error["details"]["valid"] is False
    assert any("line 2" in message for message in error["details"]["errors"])
    golden("dataset_validate_invalid_jsonl", result, tmp_path)
    plain = invoke(capsys, "dataset", "validate", "bad.jsonl", "--plain")
    assert plain.code == 1 and plain.out == ""
    assert plain.err.startswith("Error: bad.jsonl is not a valid dataset:\n  - ")


def test_invalid_csv(capsys, tmp_path):
    write_csv(tmp_path / "few.csv", ROWS[:2])
    result = invoke(capsys, "dataset", "validate", "few.csv", "--json")
    assert result.code == 1
    assert result.error()["error"]["details"]["errors"] == [
        "the dataset has 2 rows; at least 4 are required"
    ]
    golden("dataset_validate_invalid_csv", result, tmp_path)


def test_missing_file_is_not_found(capsys, tmp_path):
    result = invoke(capsys, "dataset", "validate", "nope.jsonl", "--json")
    assert result.code == 1
    assert result.error()["error"]["code"] == "NOT_FOUND"
    golden("dataset_validate_not_found", result, tmp_path)


def test_parquet(capsys, tmp_path):
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed (extra eval)")
    import pyarrow

    pq.write_table(pyarrow.Table.from_pylist(ROWS), tmp_path / "d.parquet")
    result = invoke(capsys, "dataset", "validate", "d.parquet", "--json")
    assert result.code == 0 and result.json()["data"]["extension"] == "parquet"
    pq.write_table(pyarrow.Table.from_pylist(ROWS[:1]), tmp_path / "e.parquet")
    assert invoke(capsys, "dataset", "validate", "e.parquet", "--json").code == 1


def test_parquet_without_pyarrow_warns(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    (tmp_path / "d.parquet").write_bytes(b"PAR1 not really")
    result = invoke(capsys, "dataset", "validate", "d.parquet", "--json")
    assert result.code == 0
    (warning,) = result.stderr_lines()
    assert warning["warning"]["code"] == "PARQUET_VALIDATION_SKIPPED"
    assert result.json()["data"]["warnings"] == [warning["warning"]]
    golden("dataset_validate_parquet_skipped", result, tmp_path)
    plain = invoke(capsys, "dataset", "validate", "d.parquet", "--plain")
    assert plain.err.startswith("Warning: Parquet validation skipped")


# --- doctor -----------------------------------------------------------------------------------


def test_doctor_reports_missing_paths(capsys, tmp_path):
    (tmp_path / "rollouts").mkdir()
    result = invoke(capsys, "doctor", "--json")
    assert result.code == 1 and result.out == ""
    error = result.error()["error"]
    assert error["code"] == "VALIDATION"
    assert error["details"]["present"] == ["rollouts"]
    assert error["details"]["missing"] == SCAFFOLD[1:]
    assert "osmosis doctor --fix" in error["message"]
    golden("doctor_missing", result, tmp_path)


def test_doctor_fix_creates_and_never_overwrites(capsys, tmp_path):
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "AGENTS.md").write_text("mine\n", encoding="utf-8")
    result = invoke(capsys, "doctor", "--fix", "--json")
    assert result.code == 0
    envelope = result.json()
    assert envelope["operation"] == "doctor" and envelope["status"] == "success"
    assert envelope["resource"]["missing"] == []
    assert "AGENTS.md" not in envelope["resource"]["created"]
    assert (tmp_path / "AGENTS.md").read_text(encoding="utf-8") == "mine\n"
    assert all((tmp_path / path).exists() for path in SCAFFOLD)
    golden("doctor_fix", result, tmp_path)
    again = invoke(capsys, "doctor", "--fix", "--plain")
    assert again.code == 0 and again.out.startswith("Nothing to fix")


def test_doctor_ok_from_a_subdirectory(capsys, tmp_path, monkeypatch):
    assert invoke(capsys, "doctor", "--fix").code == 0
    monkeypatch.chdir(tmp_path / "configs" / "eval")
    result = invoke(capsys, "doctor", "--json")
    assert result.code == 0
    assert result.json()["resource"]["root"] == str(tmp_path)
    golden("doctor_ok", result, tmp_path)
    rich = invoke(capsys, "doctor")
    assert rich.code == 0 and "is complete" in rich.out


def test_doctor_path_argument(capsys, tmp_path):
    (tmp_path / "ws").mkdir()
    result = invoke(capsys, "doctor", "ws", "--fix", "--json")
    assert result.code == 0 and result.json()["resource"]["root"] == str(tmp_path / "ws")
    missing = invoke(capsys, "doctor", "nowhere", "--json")
    assert missing.code == 1 and missing.error()["error"]["code"] == "NOT_FOUND"


def test_doctor_conflict_is_reported(capsys, tmp_path):
    (tmp_path / "data").write_text("a file where a directory belongs", encoding="utf-8")
    result = invoke(capsys, "doctor", "--fix", "--json")
    assert result.code == 1
    assert result.error()["error"]["code"] == "VALIDATION"
    assert "is not a directory" in result.error()["error"]["message"]


# --- placeholders -----------------------------------------------------------------------------


def test_placeholder_envelopes(capsys, tmp_path):
    golden("eval_run_pending", invoke(capsys, "eval", "run", "c.toml", "--json"), tmp_path)
    golden("benchmark_list_platform", invoke(capsys, "benchmark", "list", "--json"), tmp_path)
    golden("unknown_command", invoke(capsys, "datset", "--json"), tmp_path)


def test_every_command_takes_yes(capsys, tmp_path):
    """-y/--yes is one of the parser's common options: in every command's help, accepted by
    commands that never ask (a no-op), so a script can pass it everywhere."""
    from osmosis_ai.cli import registry

    for entry in registry.COMMANDS:
        if entry.module in (registry.PENDING, registry.NEEDS_PLATFORM):
            continue
        outcome = invoke(capsys, *entry.path, "--help")
        assert outcome.code == 0, entry.name
        assert "-y, --yes" in outcome.out, entry.name
    rows = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    for flag in ("-y", "--yes"):
        outcome = invoke(capsys, "--json", "dataset", "validate", str(rows), flag)
        assert outcome.code == 0, outcome.err
        assert outcome.json()["data"]["valid"] is True


@pytest.mark.parametrize("value", ["0", "-5", "soon"])
def test_wait_takes_seconds_above_zero(capsys, value):
    outcome = invoke(capsys, "--json", "eval", "info", "some-run", "--wait", value)
    assert outcome.code == 2
    assert f"--wait {value!r}" in outcome.error()["error"]["message"]
