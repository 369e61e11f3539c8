"""``osmosis platform``: serving, and the admin commands on the same data dir or database,
with the server running (a real ``osmosis platform serve`` process) or not."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from cli_support import invoke
from osmosis_ai.platform.store.database import make_engine
from osmosis_ai.testing.serving import free_port


def admin(capsys, *args: str, data_dir: Path, database_url: str):
    return invoke(
        capsys, "--json", "platform", *args, "--data-dir", str(data_dir), "--database-url",
        database_url,
    )  # fmt: skip


class Served:
    """``osmosis platform serve`` in a child process, stopped with SIGINT like Ctrl-C."""

    def __init__(self, data_dir: Path, database_url: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [
            sys.executable, "-m", "osmosis_ai.cli.main", "--json", "platform", "serve",
            "--data-dir", str(data_dir), "--database-url", database_url,
            "--port", str(self.port), "--log-level", "warning",
            "--single-tenant",  # not about isolation: runs where bubblewrap is missing
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise AssertionError(f"serve exited: {self.process.communicate()}")
            try:
                if httpx.get(f"{self.url}/api/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError("serve did not answer /api/health in 60 s")
            time.sleep(0.05)

    def stop(self) -> tuple[int, str, str]:
        self.process.send_signal(signal.SIGINT)
        out, err = self.process.communicate(timeout=30)
        return self.process.returncode, out, err


@pytest.fixture
def served(tmp_path, database_url):
    server = Served(tmp_path / "data", database_url)
    yield server
    if server.process.poll() is None:
        server.stop()


def verify(url: str, token: str, **headers: str) -> httpx.Response:
    return httpx.get(
        f"{url}/api/cli/verify", headers={"Authorization": f"Bearer {token}", **headers}, timeout=10
    )


def verify_until_refused(url: str, token: str) -> httpx.Response:
    """Another process's revoke reaches a running server once its cached lookup of the token
    is older than ACCESS_CACHE_TTL_S (a second); the deadline is far past that."""
    deadline = time.monotonic() + 60
    while (answer := verify(url, token)).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    return answer


def test_admin_commands_against_a_running_server(capsys, tmp_path, database_url, served):
    data = tmp_path / "data"
    made = admin(capsys, "user", "create", "Alice@Example.com", "--name", "Alice",
                 data_dir=data, database_url=database_url)  # fmt: skip
    assert made.code == 0, made.err
    assert made.json()["resource"]["email"] == "alice@example.com"
    workspace = admin(capsys, "workspace", "create", "Team", "--repo", "Acme/Agents",
                      "--clone-url", str(tmp_path / "repo"),
                      data_dir=data, database_url=database_url)  # fmt: skip
    assert workspace.json()["resource"]["repo_full_name"] == "acme/agents"
    member = admin(capsys, "workspace", "add-member", "Team", "alice@example.com", "--role",
                   "admin", data_dir=data, database_url=database_url)  # fmt: skip
    assert member.json()["resource"]["role"] == "admin"

    created = admin(capsys, "token", "create", "--email", "alice@example.com",
                    data_dir=data, database_url=database_url)  # fmt: skip
    envelope = created.json()
    assert envelope["operation"] == "platform.token.create"
    token = envelope["token"]
    assert token.startswith("osm_") and token not in envelope["message"]
    # The server recorded where it runs; the token is scoped to that.
    assert envelope["resource"]["platform_url"] == served.url

    answer = verify(served.url, token, **{"X-Osmosis-Git": "acme/agents"})
    assert answer.status_code == 200
    assert answer.json()["workspace"] == {
        "id": workspace.json()["resource"]["id"],
        "name": "Team",
        "role": "admin",
    }

    revoked = admin(capsys, "token", "revoke", envelope["resource"]["id"],
                    data_dir=data, database_url=database_url)  # fmt: skip
    assert revoked.code == 0
    gone = verify_until_refused(served.url, token)
    assert gone.status_code == 401 and gone.json()["code"] == "TOKEN_REVOKED"

    code, out, _ = served.stop()
    assert code == 0
    assert json.loads(out)["operation"] == "platform.serve"


def test_admin_commands_before_the_server_first_starts(capsys, tmp_path, database_url):
    data = tmp_path / "data"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    assert admin(capsys, "user", "create", "bob@example.com",
                 data_dir=data, database_url=database_url).code == 0  # fmt: skip
    early = admin(capsys, "token", "create", "--email", "bob@example.com", "--platform-url",
                  url, "--expires-days", "7", data_dir=data, database_url=database_url)  # fmt: skip
    assert early.code == 0
    served = Served(data, database_url, port=port)
    try:
        answer = verify(url, early.json()["token"])
        assert answer.status_code == 200
        assert answer.json()["user"]["email"] == "bob@example.com"
    finally:
        served.stop()


def test_a_token_for_another_platform_url_is_refused(capsys, tmp_path, database_url, served):
    data = tmp_path / "data"
    admin(capsys, "user", "create", "carol@example.com", data_dir=data, database_url=database_url)
    other = admin(capsys, "token", "create", "--email", "carol@example.com", "--platform-url",
                  "https://platform.example.com/", data_dir=data,
                  database_url=database_url)  # fmt: skip
    assert other.json()["resource"]["platform_url"] == "https://platform.example.com"
    answer = verify(served.url, other.json()["token"])
    assert answer.status_code == 401
    assert answer.json()["code"] == "TOKEN_PLATFORM_MISMATCH"


def test_admin_errors_carry_the_cli_codes(capsys, tmp_path, database_url):
    data = tmp_path / "data"

    def run(*args: str):
        return admin(capsys, *args, data_dir=data, database_url=database_url)

    assert run("user", "create", "dave@example.com").code == 0
    duplicate = run("user", "create", "DAVE@example.com")
    assert duplicate.code == 1
    assert duplicate.error()["error"]["code"] == "CONFLICT"
    missing = run("workspace", "add-member", "Nope", "dave@example.com")
    assert missing.error()["error"]["code"] == "NOT_FOUND"
    assert missing.error()["error"]["details"]["platform_code"] == "WORKSPACE_NOT_FOUND"
    bad_repo = run("workspace", "create", "W", "--repo", "not a repo", "--clone-url", "/x")
    assert bad_repo.error()["error"]["code"] == "VALIDATION"
    assert bad_repo.error()["error"]["details"]["field"] == "repo"
    lifetime = run("token", "create", "--email", "dave@example.com", "--expires-days", "0")
    assert lifetime.error()["error"]["code"] == "VALIDATION"
    unknown = run("token", "revoke", "no-such-id")
    assert unknown.error()["error"]["code"] == "NOT_FOUND"


def test_workspace_create_never_prints_the_clone_urls_credentials(capsys, tmp_path, database_url):
    clone_url = "https://x-access-token:ghp_SECRET123@github.com/acme/agents.git"
    made = admin(capsys, "workspace", "create", "Team", "--repo", "acme/agents", "--clone-url",
                 clone_url, data_dir=tmp_path / "data", database_url=database_url)  # fmt: skip
    assert made.code == 0, made.err
    assert "ghp_SECRET123" not in made.out + made.err
    assert made.json()["resource"]["clone_url"] == "https://***@github.com/acme/agents.git"


def test_model_add_registers_a_hugging_face_directory(capsys, tmp_path, database_url):
    data = tmp_path / "data"
    model_dir = tmp_path / "tiny"
    model_dir.mkdir()
    refused = admin(capsys, "model", "add", "acme/tiny", "--path", str(model_dir),
                    data_dir=data, database_url=database_url)  # fmt: skip
    assert refused.code == 1
    assert "config.json" in refused.error()["error"]["message"]
    (model_dir / "config.json").write_text(json.dumps({"_name_or_path": "Qwen/Qwen3-0.6B"}))
    added = admin(capsys, "model", "add", "acme/tiny", "--path", str(model_dir),
                  data_dir=data, database_url=database_url)  # fmt: skip
    assert added.code == 0
    resource = added.json()["resource"]
    assert resource["model_name"] == "acme/tiny"
    assert resource["base_model"] == "Qwen/Qwen3-0.6B"
    assert resource["path"] == str(model_dir.resolve())
    again = admin(capsys, "model", "add", "acme/tiny", "--path", str(model_dir),
                  data_dir=data, database_url=database_url)  # fmt: skip
    assert again.error()["error"]["code"] == "CONFLICT"


def test_commands_refuse_a_database_migrated_by_a_newer_release(capsys, tmp_path, database_url):
    data = tmp_path / "data"
    assert admin(capsys, "user", "create", "erin@example.com",
                 data_dir=data, database_url=database_url).code == 0  # fmt: skip
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0042_later'"))
    engine.dispose()
    refused = admin(capsys, "user", "create", "frank@example.com",
                    data_dir=data, database_url=database_url)  # fmt: skip
    assert refused.code == 1
    error = refused.error()["error"]
    assert error["details"]["database_revision"] == "0042_later"
    assert "Upgrade" in error["message"] and "0042_later" in error["message"]
    serve = subprocess.run(
        [sys.executable, "-m", "osmosis_ai.cli.main", "platform", "serve", "--data-dir",
         str(data), "--database-url", database_url, "--port", str(free_port())],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert serve.returncode == 1
    assert "0042_later" in serve.stderr and "osmosis-ai[platform]" in serve.stderr


def test_the_cli_imports_no_server_code_until_a_platform_command_runs():
    code = """
import sys
import osmosis_ai.cli.dispatch as dispatch
import osmosis_ai.cli.commands.platform_token_create
import osmosis_ai.cli.commands.platform_serve
dispatch.run(["platform", "--help"])
heavy = [m for m in ("sqlalchemy", "alembic", "fastapi", "uvicorn", "psycopg") if m in sys.modules]
print("HEAVY", heavy)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "COLUMNS": "80"},
    )  # fmt: skip
    assert done.stdout.strip().splitlines()[-1] == "HEAVY []"
