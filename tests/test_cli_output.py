"""The renderer (rich, plain, JSON envelopes), warnings, errors and the confirmation contract."""

from __future__ import annotations

import io

import pytest

from cli_support import invoke, register
from osmosis_ai.cli import output, results
from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.errors import CLIError, CLIErrorCode, PromptDeclinedError, to_cli_error
from osmosis_ai.consts import PACKAGE_VERSION


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OSMOSIS_ENV_FILE", raising=False)
    register(monkeypatch.setitem)


# --- JSON envelopes ---------------------------------------------------------------------------


def test_list_envelope_with_extra_keys(capsys):
    result = invoke(capsys, "fake", "list", "--json")
    assert result.code == 0
    assert result.json() == {
        "schema_version": 1,
        "items": [
            {"id": "r0", "name": "run\t0", "tags": ["a", "b"]},
            {"id": "r1", "name": "run\t1", "tags": ["a", "b"]},
        ],
        "total_count": 10,
        "has_more": True,
        "next_offset": 2,
        "next_cursor": "c2",
    }
    assert result.out.count("\n") == 1  # exactly one envelope


def test_sectioned_list_envelope(capsys):
    assert invoke(capsys, "fake", "sections", "--json").json() == {
        "schema_version": 1,
        "base_models": {
            "items": [{"id": "b1"}],
            "total_count": 1,
            "has_more": False,
            "next_offset": None,
        },
        "lora_models": {
            "items": [],
            "total_count": 0,
            "has_more": False,
            "next_offset": None,
            "active_deployments": 0,
        },
    }


def test_detail_operation_and_message_envelopes(capsys):
    assert invoke(capsys, "fake", "detail", "--json").json() == {
        "schema_version": 1,
        "data": {"id": "r1", "ok": True, "missing": None, "nested": {"a": 1}},
    }
    assert invoke(capsys, "fake", "operation", "--json").json() == {
        "schema_version": 1,
        "status": "success",
        "operation": "fake.op",
        "resource": {"id": "r1"},
        "message": "Done.",
        "next_steps_structured": [{"action": "detail", "id": "r1"}],
        "extra_key": 1,
    }
    assert invoke(capsys, "fake", "message", "--json").json() == {
        "schema_version": 1,
        "message": "hello\nworld",
    }


def test_encode_is_strict_and_knows_paths_and_dates(tmp_path):
    import datetime

    assert results.encode({"p": tmp_path, "d": datetime.date(2024, 1, 2)}) == (
        f'{{"p": "{tmp_path}", "d": "2024-01-02"}}'
    )
    with pytest.raises(ValueError):
        results.encode(float("inf"))
    with pytest.raises(TypeError):
        results.encode(object())


def test_commands_find_every_result_type_in_output():
    missing = [name for name in output.__all__ if not hasattr(output, name)]
    assert missing == []
    for name in results.__all__:
        if name[0].isupper():
            assert getattr(output, name) is getattr(results, name), name


# --- plain ------------------------------------------------------------------------------------


def test_plain_output(capsys):
    assert invoke(capsys, "fake", "list", "--plain").out == "r0\trun 0\ta, b\nr1\trun 1\ta, b\n"
    assert invoke(capsys, "fake", "detail", "--plain").out == (
        'ID: r1\nOK: true\nMissing: \nNested: {"a": 1}\n'
    )
    assert invoke(capsys, "fake", "operation", "--plain").out == (
        "Done.\nNext: osmosis fake detail\n"
    )
    assert invoke(capsys, "fake", "partial", "--plain").out == "fake.run: partial\n"
    assert invoke(capsys, "fake", "message", "--plain").out == "hello world\n"
    assert invoke(capsys, "fake", "sections", "--plain").out == "# Base models\nb1\n# lora_models\n"


def test_plain_columns_default_to_every_key():
    result = output.ListResult(items=[{"a": 1}, {"b": 2}])
    assert output.plain_lines(result) == ["1\t", "\t2"]


# --- rich -------------------------------------------------------------------------------------


def test_rich_output_is_the_default(capsys):
    out = invoke(capsys, "fake", "list").out
    assert "Runs" in out and "ID" in out and "r1" in out
    assert "Showing 2 of 10." in out
    out = invoke(capsys, "fake", "detail").out
    assert "Run r1" in out and "Nested" in out and '{"a": 1}' in out
    assert "Done." in invoke(capsys, "fake", "operation").out
    out = invoke(capsys, "fake", "sections").out
    assert "Base models" in out and "lora_models" in out and "Nothing to show." in out


def test_rich_markup_in_values_is_not_interpreted(capsys):
    ctx = output.Context(format="rich")
    output.render(output.MessageResult(message="[bold]x[/bold] [red]"), ctx)
    assert capsys.readouterr().out == "[bold]x[/bold] [red]\n"


# --- warnings and errors ----------------------------------------------------------------------


def test_warning_envelope_in_json_mode(capsys):
    result = invoke(capsys, "fake", "warn", "--json")
    assert result.code == 0
    assert result.stderr_lines() == [
        {
            "schema_version": 1,
            "cli_version": PACKAGE_VERSION,
            "warning": {"code": "DEPRECATION", "message": "fake is deprecated"},
        }
    ]
    assert result.json()["message"] == "warned"


def test_warning_line_otherwise(capsys):
    assert invoke(capsys, "fake", "warn", "--plain").err == "Warning: fake is deprecated\n"
    assert invoke(capsys, "fake", "warn").err == "Warning: fake is deprecated\n"


def test_error_envelope_survives_unencodable_details(capsys):
    ctx = output.Context(command="x y", format="json")
    output.emit_error(ctx, CLIError("VALIDATION", "bad", {"value": float("nan")}))
    envelope = output.error_envelope("x y", CLIError("VALIDATION", "bad", {"v": object()}))
    assert envelope["error"] == {
        "code": "VALIDATION",
        "message": "bad",
        "details": {"details_omitted": "TypeError"},
    }
    assert '"details": {"details_omitted": "ValueError"}' in capsys.readouterr().err


def test_cli_error_codes_are_the_documented_vocabulary():
    assert len(CLIErrorCode) == 22
    assert CLIError("NOT_FOUND", "x").code is CLIErrorCode.NOT_FOUND
    with pytest.raises(ValueError):
        CLIError("NOPE", "x")


def test_library_errors_map_to_codes(tmp_path):
    from osmosis_ai.errors import MissingExtraError, ProtocolError
    from osmosis_ai.workspace import (
        ConfigIssue,
        ConfigValidationError,
        WorkspaceNotFoundError,
    )

    config = ConfigValidationError("eval", tmp_path / "e.toml", [ConfigIssue("a.b", "bad")])
    error = to_cli_error(config)
    assert error.code is CLIErrorCode.VALIDATION
    assert error.details == {
        "error": "Invalid eval config",
        "issues": [{"key": "a.b", "message": "bad"}],
    }
    assert to_cli_error(WorkspaceNotFoundError(tmp_path)).code is CLIErrorCode.WORKSPACE_REQUIRED
    extra = to_cli_error(MissingExtraError("eval", "Reading Parquet", "pyarrow"))
    assert extra.code is CLIErrorCode.VALIDATION
    assert extra.details["install"] == 'pip install "osmosis-ai[eval]"'
    missing = to_cli_error(FileNotFoundError(2, "No such file", "/x/y"))
    assert (missing.code, missing.details) == (CLIErrorCode.NOT_FOUND, {"path": "/x/y"})
    assert to_cli_error(ProtocolError("peer")).code is CLIErrorCode.INTERNAL
    assert to_cli_error(KeyError("k")).details == {"exception_type": "KeyError"}


# --- confirmation contract --------------------------------------------------------------------


def test_confirmation_without_a_tty_needs_yes(capsys):
    result = invoke(capsys, "fake", "confirm", "--json")
    assert result.code == 1 and result.out == ""
    error = result.error()["error"]
    assert error["code"] == "INTERACTIVE_REQUIRED"
    assert error["details"] == {
        "prompt": "Delete 2 runs?",
        "summary": {"runs": 2, "workspace": "demo"},
        "notes": ["This cannot be undone."],
        "warnings": ["One run is still running."],
    }
    plain = invoke(capsys, "fake", "confirm", "--plain")
    assert plain.code == 1
    assert plain.err.splitlines() == [
        "Error: Confirmation required: Delete 2 runs? Re-run with --yes to proceed.",
        "Summary:",
        "  runs: 2",
        "  workspace: demo",
        "Notes:",
        "  - This cannot be undone.",
        "Warnings:",
        "  - One run is still running.",
    ]
    assert invoke(capsys, "fake", "confirm").code == 1  # rich, but stdin is not a TTY


def test_yes_skips_the_prompt(capsys):
    result = invoke(capsys, "fake", "confirm", "--yes", "--json")
    assert result.code == 0 and result.json()["status"] == "success"


@pytest.mark.parametrize(("answer", "accepted"), [("y\n", True), ("n\n", False), ("", False)])
def test_interactive_prompt(monkeypatch, capsys, answer, accepted):
    monkeypatch.setattr("sys.stdin", io.StringIO(answer))
    token = output.install(output.Context(format="rich", interactive=True))
    try:
        if accepted:
            confirm("Go?", yes=False, summary={"a": 1})
        else:
            with pytest.raises(PromptDeclinedError):
                confirm("Go?", yes=False, summary={"a": 1})
    finally:
        output.uninstall(token)
    assert "Go?" in capsys.readouterr().out
