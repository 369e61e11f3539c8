"""``.env`` loading: which file, how it is parsed, and which value wins."""

from __future__ import annotations

import pytest

from cli_support import invoke
from osmosis_ai.cli.env import find_env_file, parse_dotenv

KEYS = ("OSMOSIS_PLATFORM_URL", "OSMOSIS_TEST_A", "OSMOSIS_TEST_B")


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OSMOSIS_ENV_FILE", raising=False)
    for key in KEYS:  # empty: the CLI may set them; monkeypatch restores them afterwards
        monkeypatch.setenv(key, "")


def platform_url(capsys, *args: str) -> str | None:
    """The OSMOSIS_PLATFORM_URL a platform command saw (it reports it in its error details)."""
    result = invoke(capsys, *args, "dataset", "list", "--json")
    assert result.code == 1, result.err
    return result.error()["error"]["details"]["platform_url"]


def test_parse_dotenv():
    text = """
# a comment
export A=1
B = two words   # trailing comment
C="quoted # not a comment" # comment
D='single'
E="line\\nbreak"
F=
G=a#b
not an assignment
1BAD=x
=novalue
"""
    assert parse_dotenv(text) == {
        "A": "1",
        "B": "two words",
        "C": "quoted # not a comment",
        "D": "single",
        "E": "line\nbreak",
        "F": "",
        "G": "a#b",
    }


def test_nearest_env_file_upward(tmp_path, monkeypatch, capsys):
    (tmp_path / ".env").write_text("OSMOSIS_PLATFORM_URL=http://outer\n", encoding="utf-8")
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    monkeypatch.chdir(inner)
    assert find_env_file(inner) == tmp_path / ".env"
    assert platform_url(capsys) == "http://outer"


def test_process_variables_win_unless_empty(tmp_path, monkeypatch, capsys):
    (tmp_path / ".env").write_text("OSMOSIS_PLATFORM_URL=http://dotenv\n", encoding="utf-8")
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "http://process")
    assert platform_url(capsys) == "http://process"
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "")
    assert platform_url(capsys) == "http://dotenv"


def test_explicit_env_file_and_variable(tmp_path, monkeypatch, capsys):
    (tmp_path / ".env").write_text("OSMOSIS_PLATFORM_URL=http://nearest\n", encoding="utf-8")
    (tmp_path / "other.env").write_text("OSMOSIS_PLATFORM_URL=http://other\n", encoding="utf-8")
    (tmp_path / "third.env").write_text("OSMOSIS_PLATFORM_URL=http://third\n", encoding="utf-8")
    assert platform_url(capsys, "--env-file", "other.env") == "http://other"
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "")
    monkeypatch.setenv("OSMOSIS_ENV_FILE", str(tmp_path / "third.env"))
    assert platform_url(capsys) == "http://third"
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "")
    assert platform_url(capsys, "--env-file=other.env") == "http://other"


def test_platform_option_overrides_everything(tmp_path, monkeypatch, capsys):
    (tmp_path / ".env").write_text("OSMOSIS_PLATFORM_URL=http://dotenv\n", encoding="utf-8")
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "http://process")
    assert platform_url(capsys, "--platform", "http://flag") == "http://flag"


def test_missing_env_file_is_not_found(capsys):
    result = invoke(capsys, "--env-file", "missing.env", "doctor", "--json")
    assert result.code == 1
    assert result.error()["error"]["code"] == "NOT_FOUND"
    assert "missing.env" in result.error()["error"]["message"]


def test_other_variables_are_loaded(tmp_path, capsys):
    import os

    (tmp_path / ".env").write_text(
        "OSMOSIS_TEST_A=from-file\nexport OSMOSIS_TEST_B='b'\n", encoding="utf-8"
    )
    invoke(capsys, "doctor")
    assert (os.environ["OSMOSIS_TEST_A"], os.environ["OSMOSIS_TEST_B"]) == ("from-file", "b")


def test_help_does_not_load_the_env_file(tmp_path, capsys):
    import os

    (tmp_path / ".env").write_text("OSMOSIS_TEST_A=loaded\n", encoding="utf-8")
    invoke(capsys, "--help")
    invoke(capsys, "dataset")
    assert os.environ["OSMOSIS_TEST_A"] == ""
