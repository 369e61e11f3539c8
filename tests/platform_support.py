"""Test support for the platform: a real PostgreSQL server, databases on both dialects, and
a platform with users, a workspace and tokens ready to call.

The PostgreSQL server is Debian's (``/usr/lib/postgresql/<v>/bin``), started once per test
session on a free loopback port with its data dir under /tmp (``initdb`` refuses root, so as
root it runs as the ``postgres`` user). Where none can start, tests on it skip with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.testing.serving import free_port

PG_USER = "postgres"


def _pg_bin() -> Path | None:
    roots = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    for root in reversed(roots):
        if (root / "initdb").exists() and (root / "pg_ctl").exists():
            return root
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresUnavailable(Exception):
    pass


class PostgresServer:
    """One PostgreSQL server this process started; ``stop()`` stops only it."""

    def __init__(self) -> None:
        self.bin = _pg_bin()
        if self.bin is None:
            raise PostgresUnavailable("no initdb/pg_ctl found (apt-get install postgresql)")
        self.as_other_user = os.geteuid() == 0
        if self.as_other_user:
            try:
                import pwd

                self._uid = pwd.getpwnam(PG_USER).pw_uid
                self._gid = pwd.getpwnam(PG_USER).pw_gid
            except KeyError:
                raise PostgresUnavailable(f"running as root and no {PG_USER!r} user") from None
            if shutil.which("runuser") is None:
                raise PostgresUnavailable("running as root and no runuser to drop to postgres")
        self.root = Path(tempfile.mkdtemp(prefix="osmosis-pg-", dir="/tmp"))
        self.data = self.root / "data"
        self.port = free_port()
        self.started = False

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = list(args)
        if self.as_other_user:
            command = ["runuser", "-u", PG_USER, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise PostgresUnavailable(
                f"{Path(args[0]).name} failed ({done.returncode}): "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
        return done

    def start(self) -> PostgresServer:
        assert self.bin is not None
        self.root.chmod(0o755)
        if self.as_other_user:
            os.chown(self.root, self._uid, self._gid)
        self._run(
            str(self.bin / "initdb"),
            "-D", str(self.data),
            "-U", PG_USER,
            "--auth=trust",
            "--no-sync",
            "-E", "UTF8",
        )  # fmt: skip
        options = (
            f"-k {self.root} -p {self.port} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c full_page_writes=off -c synchronous_commit=off"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D", str(self.data),
            "-l", str(self.root / "server.log"),
            "-o", options,
            "-w",
            "-t", "60",
            "start",
        )  # fmt: skip
        self.started = True
        return self

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{PG_USER}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A new empty database; its SQLAlchemy URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={PG_USER} dbname=postgres", autocommit=True
        ) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')  # pyright: ignore[reportArgumentType]
        return self.url(name)

    def stop(self) -> None:
        if self.started and self.bin is not None:
            with contextlib.suppress(PostgresUnavailable):
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
            self.started = False
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class Account:
    """A user with a token, for calling the API."""

    user_id: str
    email: str
    token: str
    token_id: str

    def headers(self, repo: str | None = None, **extra: str) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.token}", **extra}
        if repo is not None:
            headers["X-Osmosis-Git"] = repo
        return headers


# --- fixtures (registered in conftest.py) ------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_server():
    """A PostgreSQL server for the whole session; skips its tests when none can start."""
    try:
        server = PostgresServer()
    except PostgresUnavailable as exc:
        pytest.skip(f"PostgreSQL not available: {exc}")
    try:
        server.start()
    except PostgresUnavailable as exc:
        server.stop()
        pytest.skip(f"PostgreSQL not available: {exc}")
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request, tmp_path):
    """An empty database on each dialect: a SQLite file, or a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db' / 'platform.db'}"
    return request.getfixturevalue("postgres_server").create_database()


# --- Git repositories the platform fetches ------------------------------------------------------

GIT_AUTHOR = "Ada Author"


def git(cwd: Path, *args: str) -> str:
    """Run git in ``cwd`` as :data:`GIT_AUTHOR`; its stdout, stripped."""
    done = subprocess.run(
        ["git", "-c", f"user.name={GIT_AUTHOR}", "-c", "user.email=ada@example.com", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def write_files(root: Path, files: dict[str, str]) -> None:
    """Write each ``{relative path: text}`` under ``root``, making folders as needed."""
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


# --- a served platform and the original CLI --------------------------------------------------------


def wait_until_healthy(
    process: subprocess.Popen[str], url: str, output: Callable[[], object]
) -> None:
    """Wait up to 60 s for ``process`` to answer ``GET <url>/api/health`` with 200; should it
    exit first, fail with ``output()`` (what it printed)."""
    import httpx

    deadline = time.monotonic() + 60
    while True:
        assert process.poll() is None, output()
        try:
            if httpx.get(f"{url}/api/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the platform did not come up in 60 s"
        time.sleep(0.05)


def run_original(
    original: Path, cwd: Path, env: dict[str, str], secret: str, *args: str
) -> dict[str, Any]:
    """The original CLI's ``--json`` answer to ``args`` with its exit code as ``rc``; it must
    not print ``secret``. Warning envelopes (a top-level ``warning`` key) are skipped; the
    answer is the last JSON object left."""
    done = subprocess.run(
        [str(original), "--json", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert secret not in done.stdout + done.stderr
    stream = done.stdout if done.returncode == 0 else done.stderr
    answers: list[dict[str, Any]] = []
    for line in stream.splitlines():
        try:
            parsed = json.loads(line)
        except ValueError:
            continue
        if isinstance(parsed, dict) and "warning" not in parsed:
            answers.append(parsed)  # pyright: ignore[reportUnknownArgumentType]
    assert answers, f"no JSON answer (exit {done.returncode}): {done.stdout}{done.stderr}"
    return {"rc": done.returncode, **answers[-1]}


# --- a platform to call --------------------------------------------------------------------------

PUBLIC_URL = "http://127.0.0.1:8480"


class Clock:
    """The platform's clock in tests: fixed until advanced."""

    def __init__(self) -> None:
        from datetime import UTC, datetime

        self.now = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)

    def __call__(self):
        return self.now

    def advance(self, **delta: float) -> None:
        from datetime import timedelta

        self.now += timedelta(**delta)


class Harness:
    """A platform app on a real database, with helpers to make accounts and workspaces."""

    def __init__(self, data_dir: Path, database_url: str, public_url: str = PUBLIC_URL) -> None:
        from osmosis_ai.platform.api.app import create_platform_app
        from osmosis_ai.platform.settings import load_settings

        self.settings = load_settings(
            data_dir=data_dir, database_url=database_url, public_url=public_url
        )
        self.clock = Clock()
        self.app = create_platform_app(self.settings, clock=self.clock)
        self.platform = self.app.state.platform

    def client(self, **kwargs):
        import httpx

        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url=self.settings.public_url, **kwargs)

    def workspace(self, name: str, repo: str, clone_url: str = "/nonexistent") -> str:
        from osmosis_ai.platform.services.accounts import create_workspace

        with self.platform.transaction() as session:
            return create_workspace(session, name, repo=repo, clone_url=clone_url).id

    def account(
        self,
        email: str,
        *,
        workspace: str | None = None,
        role: str = "member",
        platform_url: str | None = None,
    ) -> Account:
        from sqlalchemy import select

        from osmosis_ai.platform.auth import issue_token
        from osmosis_ai.platform.services.accounts import add_member, create_user
        from osmosis_ai.platform.store.orm import User, Workspace

        with self.platform.transaction() as session:
            user = session.scalar(select(User).where(User.email == email))
            if user is None:
                user = create_user(session, email, name=email.split("@", maxsplit=1)[0])
            if workspace is not None:
                found = session.scalar(select(Workspace).where(Workspace.name == workspace))
                assert found is not None
                add_member(session, found, user, role=role)
            issued = issue_token(
                session,
                user,
                platform_url=platform_url or self.settings.public_url,
                name="test",
                now=self.clock(),
            )
        return Account(user_id=user.id, email=user.email, token=issued.raw, token_id=issued.id)

    def close(self) -> None:
        self.platform.database.dispose()


@pytest.fixture
def harness(tmp_path, database_url):
    made = Harness(tmp_path / "data", database_url)
    yield made
    made.close()
