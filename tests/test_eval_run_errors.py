"""``osmosis eval run`` refusing bad input with a clear error, before any rollout runs.

In-process (``main([...])``) for speed; the scripted model and the rollout servers are real.
"""

from __future__ import annotations

import json
import socket
import textwrap
from pathlib import Path
from typing import Any

import pytest

from cli_support import check_golden, invoke, normalise
from osmosis_ai.testing.model_server import ScriptedModelServer
from test_eval_run_cli import CONFIG, enter_workspace


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return enter_workspace(tmp_path, monkeypatch)


def run(capsys: Any, *args: str) -> Any:
    return invoke(capsys, "eval", "run", *args, "-y", "--json")


def error_of(outcome: Any) -> dict[str, Any]:
    assert outcome.code == 1, (outcome.out, outcome.err)
    return outcome.error()["error"]


def journal_lines(ws: Path, name: str) -> int:
    path = ws / ".osmosis" / "evals" / name / "events.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_every_config_problem_at_once(ws: Path, capsys: Any, tmp_path: Path):
    (ws / "configs" / "eval" / "bad.toml").write_text(
        textwrap.dedent(
            """\
            [experiment]
            rollout = "multiply"
            entrypoint = "main.py"
            model_path = "openai/scripted"
            dataset = "multiply"
            rolout = "typo"

            [evaluation]
            n = "4"
            bach_size = 2

            [sampling]
            temperature = 1.0

            [secrets]
            required = []
            """
        )
    )
    outcome = run(capsys, "configs/eval/bad.toml")
    error = error_of(outcome)
    assert error["code"] == "VALIDATION"
    keys = {issue["key"] for issue in error["details"]["issues"]}
    assert keys == {"experiment.rolout", "evaluation.n", "evaluation.bach_size", "sampling"}
    check_golden("eval_run_invalid_config", normalise(outcome, {str(tmp_path): "<TMP>"}))


def test_config_outside_configs_eval(ws: Path, capsys: Any):
    (ws / "data" / "multiply.toml").write_text(CONFIG.format(rollout="multiply", evaluation=""))
    error = error_of(run(capsys, "data/multiply.toml"))
    assert error["code"] == "VALIDATION"
    assert "must be under" in error["message"] and "configs/eval" in error["message"]
    assert not (ws / ".osmosis").exists()


def test_missing_config_dataset_secret_and_upload(ws: Path, capsys: Any):
    error = error_of(run(capsys, "configs/eval/nope.toml"))
    assert error["code"] == "NOT_FOUND" and "nope.toml" in error["message"]

    (ws / "data" / "multiply.jsonl").unlink()
    error = error_of(run(capsys, "configs/eval/multiply.toml"))
    assert "data/multiply.jsonl" in error["message"] and "--dataset-file" in error["message"]

    (ws / "data" / "multiply.jsonl").write_text(
        "".join(json.dumps({"user_prompt": f"q{i}", "answer": "1"}) + "\n" for i in range(4))
    )
    error = error_of(run(capsys, "configs/eval/multiply.toml"))
    assert error["code"] == "VALIDATION" and "ground_truth" in error["message"]

    (ws / "configs" / "eval" / "secret.toml").write_text(
        CONFIG.format(rollout="multiply", evaluation="").replace("[]", '["MY_TOKEN", "OTHER"]')
    )
    error = error_of(run(capsys, "configs/eval/secret.toml", "--dataset-file", "data/x.jsonl"))
    assert error["code"] == "VALIDATION"  # the dataset is checked before secrets are asked for
    error = error_of(run(capsys, "configs/eval/multiply.toml", "--upload"))
    assert "platform" in error["message"]


def test_missing_secrets_need_a_secrets_file(ws: Path, capsys: Any):
    (ws / "configs" / "eval" / "secret.toml").write_text(
        CONFIG.format(rollout="multiply", evaluation="").replace("[]", '["MY_TOKEN", "OTHER"]')
    )
    error = error_of(run(capsys, "configs/eval/secret.toml"))
    assert error["code"] == "INTERACTIVE_REQUIRED"
    assert error["details"] == {"missing": ["MY_TOKEN", "OTHER"], "flags": ["--secrets-file"]}


def test_model_refusing_auth_fails_before_any_rollout(ws: Path, capsys: Any, monkeypatch):
    with ScriptedModelServer(api_key="sk-right-key") as model:
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong-key-123")
        error = error_of(run(capsys, "configs/eval/multiply.toml", "--name", "auth"))
        assert model.request_count == 1  # the preflight only
    assert error["code"] == "VALIDATION"
    assert "HTTP 401" in error["message"] and "missing or wrong API key" in error["message"]
    assert error["details"]["status_code"] == 401
    run_dir = ws / ".osmosis" / "evals" / "auth"
    assert journal_lines(ws, "auth") == 0 and not (run_dir / "server.json").exists()
    assert "sk-wrong-key-123" not in (run_dir / "logs.txt").read_text()


def test_entrypoint_raising_at_import_shows_its_traceback(ws: Path, capsys: Any, monkeypatch):
    broken = ws / "rollouts" / "broken"
    broken.mkdir()
    (broken / "main.py").write_text(
        textwrap.dedent(
            """\
            import os
            print("token seen:", os.environ.get("MY_TOKEN"), flush=True)
            print("openai key:", repr(os.environ.get("OPENAI_API_KEY")), flush=True)
            raise RuntimeError("config is broken: missing API_URL")
            """
        )
    )
    (ws / "configs" / "eval" / "broken.toml").write_text(
        CONFIG.format(rollout="broken", evaluation="").replace("[]", '["MY_TOKEN"]')
    )
    (ws / "secrets.env").write_text("MY_TOKEN=tok-very-secret\n")
    with ScriptedModelServer() as model:
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-for-the-model-only")
        error = error_of(
            run(capsys, "configs/eval/broken.toml", "--name", "b", "--secrets-file", "secrets.env")
        )
    message = error["message"]
    assert "exited with code 1" in message and "rollouts/broken/main.py" in message
    assert "RuntimeError: config is broken: missing API_URL" in message
    assert "token seen: [REDACTED]" in message and "tok-very-secret" not in message
    assert "openai key: ''" in message  # the model key never reaches the rollout server
    logs = (ws / ".osmosis" / "evals" / "b" / "logs.txt").read_text()
    assert "token seen: [REDACTED]" in logs and "tok-very-secret" not in logs


def test_rollout_port_in_use(ws: Path, capsys: Any, monkeypatch):
    with ScriptedModelServer() as model, socket.socket() as taken:
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        error = error_of(run(capsys, "configs/eval/multiply.toml", "--rollout-port", str(port)))
    assert f"port {port} is already in use" in error["message"]
    assert "--rollout-port" in error["message"]


def test_rollout_server_dying_mid_run_halts_and_keeps_the_rest_pending(
    ws: Path, capsys, monkeypatch
):
    crashy = ws / "rollouts" / "crashy"
    crashy.mkdir()
    source = (ws / "rollouts" / "multiply" / "main.py").read_text()
    anchor = "        messages: list[dict[str, Any]] = list(ctx.prompt)\n"
    crash = (
        anchor + '        if "val1 = 5" in str(messages):\n            __import__("os")._exit(3)\n'
    )
    (crashy / "main.py").write_text(source.replace(anchor, crash, 1))
    (ws / "configs" / "eval" / "crashy.toml").write_text(
        CONFIG.format(rollout="crashy", evaluation="")
    )
    with ScriptedModelServer(["#### 1"], on_exhausted="repeat_last") as model:
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        outcome = run(capsys, "configs/eval/crashy.toml", "--name", "c", "--max-in-flight", "1")
    assert outcome.code == 1
    result = outcome.json()
    assert result["status"] == "partial" and "exited with code 3 mid-run" in result["message"]
    resource = result["resource"]
    assert (resource["succeeded"], resource["failed"], resource["total_work_items"]) == (3, 0, 6)
    assert journal_lines(ws, "c") == 3  # rows 0-2; the crashed row and the rest stay pending
    warning = outcome.stderr_lines()[0]["warning"]
    assert warning["code"] == "DISPATCH_HALTED" and "--name c" in warning["message"]
