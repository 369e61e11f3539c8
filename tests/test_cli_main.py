"""The ``osmosis`` entry point: help, version, hoisted flags, dispatch, errors and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cli_support import invoke, register
from osmosis_ai.cli import registry
from osmosis_ai.consts import PACKAGE_VERSION

OSMOSIS = Path(sys.executable).with_name("osmosis")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OSMOSIS_ENV_FILE", raising=False)
    monkeypatch.delenv("OSMOSIS_DEBUG", raising=False)
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "")
    register(monkeypatch.setitem)


# --- help and version -------------------------------------------------------------------------


def test_version(capsys):
    for flag in ("-V", "--version"):
        result = invoke(capsys, flag)
        assert (result.code, result.out, result.err) == (0, f"osmosis-ai {PACKAGE_VERSION}\n", "")


@pytest.mark.parametrize("args", [(), ("-h",), ("--help",), ("--json", "--help")])
def test_root_help_lists_panels(capsys, args):
    result = invoke(capsys, *args)
    assert result.code == 0 and result.err == ""
    out = result.out
    assert out.startswith("Usage: osmosis [OPTIONS] COMMAND [ARGS]...")
    workflow = out.index("Workflow Commands")
    platform = out.index("Platform Commands")
    for name in ("dataset", "eval", "train", "rollout", "template", "doctor"):
        assert workflow < out.index(f"│ {name} ") < platform
    for name in ("auth", "model", "secret"):
        assert out.index(f"│ {name} ") > platform
    assert "needs a platform" in out or "need a platform" in out
    assert "│ dev " not in out and "│ fake " not in out  # hidden groups


def test_group_help_marks_what_is_not_available(capsys):
    for args in (("dataset",), ("dataset", "--help"), ("benchmark", "runs", "-h")):
        result = invoke(capsys, *args)
        assert result.code == 0
        assert result.out.startswith(f"Usage: osmosis {' '.join(a for a in args if a[0] != '-')}")
    out = invoke(capsys, "dataset").out
    assert "validate  Validate a dataset file" in out
    assert "upload    Validate and upload a dataset file." in out
    assert "list    List benchmarks. [needs a platform]" in invoke(capsys, "benchmark").out
    assert "list      List evaluation runs.  " in invoke(capsys, "eval").out


def test_command_help_is_argparse(capsys):
    result = invoke(capsys, "dataset", "validate", "--help")
    assert result.code == 0
    assert "usage: osmosis dataset validate [-h] [-y] FILE" in result.out
    assert "--json, --plain" in result.out


def test_help_box_falls_back_to_ascii():
    from osmosis_ai.cli.help import root_help

    text = root_help("ascii")
    text.encode("ascii")
    assert "+- Workflow Commands " in text


# --- usage errors (exit 2) --------------------------------------------------------------------


def test_unknown_command_suggests(capsys):
    result = invoke(capsys, "datset", "validate", "x")
    assert result.code == 2 and result.out == ""
    assert "No such command 'datset'. Did you mean 'dataset'?" in result.err
    assert "Try 'osmosis --help' for help." in result.err
    result = invoke(capsys, "dataset", "valdate")
    assert "Did you mean 'validate'?" in result.err
    assert "Try 'osmosis dataset --help'" in result.err
    result = invoke(capsys, "zzzz")
    assert result.code == 2 and "Did you mean" not in result.err


def test_hidden_commands_are_not_suggested(capsys):
    assert "'dev'" not in invoke(capsys, "dve").err  # 'dev' is hidden


def test_help_command_is_rejected_with_a_hint(capsys):
    result = invoke(capsys, "help")
    assert result.code == 2
    assert "No such command 'help'. Use 'osmosis --help'" in result.err


def test_removed_commands_name_their_replacement(capsys):
    result = invoke(capsys, "login")
    assert (
        result.code == 2 and "'osmosis login' was removed. Use 'osmosis auth login'." in result.err
    )
    result = invoke(capsys, "train", "traces", "run-1")
    assert result.code == 2 and "osmosis train info NAME" in result.err


def test_bad_options(capsys):
    assert invoke(capsys, "--nope").code == 2
    assert invoke(capsys, "dataset", "--nope").code == 2
    assert invoke(capsys, "--env-file").code == 2
    result = invoke(capsys, "dataset", "validate")
    assert result.code == 2
    assert result.err.startswith("Usage: osmosis dataset validate [-h] [-y] FILE\n")
    assert "Error: the following arguments are required: FILE" in result.err
    assert invoke(capsys, "dataset", "validate", "a", "b").code == 2


def test_usage_error_in_json_mode_is_an_envelope(capsys):
    result = invoke(capsys, "dataset", "validate", "--json")
    assert result.code == 2 and result.out == ""
    envelope = result.error()
    assert envelope["command"] == "dataset validate"
    assert envelope["error"]["code"] == "VALIDATION"
    assert invoke(capsys, "--json", "nope").error()["command"] == "<root>"


def test_json_and_plain_together_is_a_usage_error(capsys):
    result = invoke(capsys, "--plain", "fake", "message", "--json")
    assert result.code == 2 and "cannot be used together" in result.err


# --- hoisted format flags ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("--json", "fake", "message"),
        ("fake", "--json", "message"),
        ("fake", "message", "--json"),
    ],
)
def test_json_flag_is_hoisted(capsys, args):
    result = invoke(capsys, *args)
    assert result.code == 0 and result.err == ""
    assert result.json() == {"schema_version": 1, "message": "hello\nworld"}


def test_flags_after_double_dash_are_not_hoisted(capsys):
    result = invoke(capsys, "fake", "message", "--", "--json")
    assert result.code == 2  # argparse sees a stray positional; rich mode: no envelope
    assert not result.err.startswith("{")


# --- exit codes -------------------------------------------------------------------------------


def test_keyboard_interrupt_exits_130(capsys):
    result = invoke(capsys, "fake", "interrupt")
    assert result.code == 130 and "Aborted." in result.err
    result = invoke(capsys, "fake", "interrupt", "--json")
    assert result.code == 130 and result.err == "" and result.out == ""


def test_system_exit_code_is_preserved(capsys):
    assert invoke(capsys, "fake", "exit").code == 3


def test_partial_operation_exits_1_after_rendering(capsys):
    result = invoke(capsys, "fake", "partial", "--json")
    assert result.code == 1
    assert result.json() == {"schema_version": 1, "status": "partial", "operation": "fake.run"}


def test_unexpected_exception_is_internal(capsys, monkeypatch):
    result = invoke(capsys, "fake", "crash", "--json")
    assert result.code == 1 and result.out == ""
    envelope = result.error()
    assert envelope == {
        "schema_version": 1,
        "command": "fake crash",
        "cli_version": PACKAGE_VERSION,
        "error": {
            "code": "INTERNAL",
            "message": envelope["error"]["message"],
            "details": {"exception_type": "RuntimeError"},
        },
    }
    assert "Traceback" not in result.err
    monkeypatch.setenv("OSMOSIS_DEBUG", "1")
    result = invoke(capsys, "fake", "crash")
    assert result.code == 1
    assert "Traceback" in result.err and "RuntimeError: boom" in result.err
    assert "Error: An unexpected internal error occurred (RuntimeError)" in result.err


def test_library_usage_error_is_validation(capsys):
    result = invoke(capsys, "fake", "usage", "--json")
    assert result.code == 1
    assert result.error()["error"]["code"] == "VALIDATION"
    assert result.error()["error"]["message"] == "wrong state for fake usage"


def test_no_output_in_json_or_plain_is_internal(capsys):
    for flag in ("--json", "--plain"):
        result = invoke(capsys, "fake", "none", flag)
        assert result.code == 1 and result.out == ""
        assert "produced no output" in result.err
    assert invoke(capsys, "fake", "none").code == 0  # rich: a command may have shown a wizard


def test_nan_is_refused_in_json_mode(capsys):
    result = invoke(capsys, "fake", "nan", "--json")
    assert result.code == 1 and result.out == ""
    assert result.error()["error"]["code"] == "INTERNAL"
    assert "could not be encoded as JSON" in result.error()["error"]["message"]


# --- placeholders -----------------------------------------------------------------------------


def test_platform_commands_need_a_platform(capsys):
    for entry in registry.COMMANDS:
        if entry.module != registry.NEEDS_PLATFORM:
            continue
        result = invoke(capsys, *entry.path, "some-arg", "--limit", "5", "--json")
        assert result.code == 1, entry.name
        error = result.error()
        assert error["command"] == entry.name
        assert error["error"]["code"] == "PLATFORM_ERROR"
        assert "needs a platform feature this version" in error["error"]["message"]


def test_pending_commands_say_not_available_yet(capsys):
    result = invoke(capsys, "upgrade", "--pre")
    assert result.code == 1
    assert (
        result.err
        == "Error: 'osmosis upgrade' is not available yet in this version of osmosis-ai.\n"
    )
    error = invoke(capsys, "upgrade", "--json").error()
    assert error["error"]["code"] == "VALIDATION"
    assert error["error"]["details"] == {"command": "upgrade", "available": False}


def test_every_documented_group_has_its_commands():
    names = {entry.name for entry in registry.COMMANDS}
    for name in (
        "eval run", "eval rubric", "eval submit", "eval upload", "eval list", "eval info",
        "eval logs", "eval download", "eval stop", "train submit", "train list", "train info",
        "train logs", "train stop", "rollout init", "rollout list", "template list",
        "template apply", "dataset validate", "dataset upload", "auth login", "model list",
        "secret set", "benchmark runs list", "doctor",
    ):  # fmt: skip
        assert name in names
    for entry in registry.COMMANDS:
        assert registry.group(entry.path[:-1]) is not None or len(entry.path) == 1


# --- real processes ---------------------------------------------------------------------------


def run_process(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    command = [str(OSMOSIS)] if OSMOSIS.exists() else [sys.executable, "-m", "osmosis_ai.cli.main"]
    return subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=60, check=False, **kwargs
    )


def test_console_script_help_and_version():
    assert run_process("--version").stdout == f"osmosis-ai {PACKAGE_VERSION}\n"
    result = run_process("--help")
    assert result.returncode == 0 and "Workflow Commands" in result.stdout


def test_module_entry_point_exit_codes(tmp_path):
    command = [sys.executable, "-m", "osmosis_ai.cli.main"]
    unknown = subprocess.run([*command, "nope"], capture_output=True, text=True, check=False)
    assert unknown.returncode == 2
    missing = subprocess.run(
        [*command, "dataset", "validate", str(tmp_path / "x.jsonl"), "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 1 and missing.stdout == ""
    assert json.loads(missing.stderr)["error"]["code"] == "NOT_FOUND"


def test_help_and_version_import_nothing_heavy():
    code = (
        "import sys\n"
        "from osmosis_ai.cli.main import main\n"
        "main(['--version']); main(['-V', '--json'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('osmosis_ai.cli.')))\n"
        "main(['--help']); main(['dataset']); main([])\n"
        "heavy = ('rich', 'argparse', 'typing', 'dataclasses', 'pydantic', 'httpx', 'enum',\n"
        "         'osmosis_ai.workspace', 'osmosis_ai.cli.output', 'json', 'pathlib')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    lines = result.stdout.strip().splitlines()
    assert lines[2] == "['osmosis_ai.cli.main']"  # --version: nothing but the entry point
    assert lines[-1] == "['enum']"  # --help: only the error codes' enum beyond the stdlib core


def test_interactive_prompt_declined_on_a_tty(tmp_path):
    pty = pytest.importorskip("pty")
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from cli_support import register\n"
        "register(lambda d, k, v: d.__setitem__(k, v))\n"
        "from osmosis_ai.cli.main import main\n"
        "sys.exit(main(['fake', 'confirm']))\n"
    )
    primary, secondary = pty.openpty()
    env = {**os.environ, "TERM": "dumb", "COLUMNS": "100"}
    process = subprocess.Popen(
        [sys.executable, "-c", code], stdin=secondary, stdout=secondary, stderr=secondary, env=env
    )
    os.close(secondary)
    os.write(primary, b"n\n")
    output = b""
    while True:
        try:
            chunk = os.read(primary, 4096)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    assert process.wait(timeout=60) == 0
    os.close(primary)
    text = output.decode()
    assert "Delete 2 runs?" in text and "This cannot be undone." in text
    assert "Cancelled." in text
