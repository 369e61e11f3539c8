"""The platform's edges: bodies capped before authentication (413 without reading them),
header floods refused, storage limits checked before a URL is signed, abandoned uploads and
imports swept, the device login rate-limited, other members' work guarded, artifacts served
from disk, names limited in bytes, malformed version headers, sign-out ending sessions on the
server, and signed URLs kept out of the access log.

Caps that live in the app are checked through httpx's ASGI transport or uvicorn on a free
loopback port; what ``osmosis platform serve`` configures (the HTTP parser's header bound, the
access log) against uvicorn started with the same configuration.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
import secrets
import socket
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import select

from dashboard_world import seed_eval, seed_training
from osmosis_ai.platform.store.orm import (
    Dataset,
    DeviceAuthorization,
    EvalImport,
    Run,
    RunLog,
    Workspace,
)
from osmosis_ai.testing.serving import ServerThread, free_port
from platform_support import Harness

REPO = "acme/alpha"
WS = "Team Alpha"
CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')
MIB = 1024 * 1024


@pytest.fixture
def team(tmp_path):
    """A SQLite platform with a workspace: owner alice, members bob and carol."""
    harness = Harness(tmp_path / "data", f"sqlite:///{tmp_path / 'platform.db'}")
    harness.workspace(WS, REPO)
    people = {
        "harness": harness,
        "alice": harness.account("alice@example.com", workspace=WS, role="owner"),
        "bob": harness.account("bob@example.com", workspace=WS),
        "carol": harness.account("carol@example.com", workspace=WS),
    }
    yield people
    harness.close()


def _workspace_id(harness: Harness) -> str:
    with harness.platform.read() as db:
        found = db.scalar(select(Workspace.id).where(Workspace.name == WS))
    assert found is not None
    return found


def _chunks(counter: list[int], *, total: int, size: int = 64 * 1024):
    """``total`` bytes in chunks of ``size``, counting each chunk handed out in ``counter``."""
    chunk = b"x" * size
    for _ in range(total // size):
        counter[0] += 1
        yield chunk


# --- bodies --------------------------------------------------------------------------------


def test_a_content_length_over_the_cap_is_answered_413_before_any_body_byte(team):
    harness = team["harness"]
    with (
        ServerThread(harness.app) as server,
        socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock,
    ):
        sock.sendall(
            b"POST /api/cli/device/token HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n"
        )
        answer = sock.recv(65536).decode("latin-1")  # no body sent: the answer cannot wait
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413"), answer
    assert "connection: close" in head.lower()
    envelope = json.loads(body)
    assert envelope["code"] == "PAYLOAD_TOO_LARGE"
    assert "1048576 bytes" in envelope["message"] and "--max-body-bytes" in envelope["message"]


def test_a_chunked_body_is_cut_at_the_cap_while_it_streams(team):
    harness = team["harness"]
    total = 400 * MIB
    sent = [0]
    with ServerThread(harness.app) as server:
        answer = httpx.post(
            f"{server.url}/api/cli/device/authorize",  # no token needed, body read by pydantic
            content=_chunks(sent, total=total),
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        still_up = httpx.get(f"{server.url}/api/health", timeout=10)
    assert answer.status_code == 413, answer.text
    assert answer.json()["code"] == "PAYLOAD_TOO_LARGE"
    assert sent[0] * 64 * 1024 < total  # refused long before the generator ran out
    assert still_up.status_code == 200


async def test_the_cap_is_a_setting_and_applies_before_authentication(tmp_path):
    from osmosis_ai.platform.api.app import create_platform_app
    from osmosis_ai.platform.settings import load_settings

    settings = load_settings(
        data_dir=tmp_path / "data",
        database_url=f"sqlite:///{tmp_path / 'p.db'}",
        public_url="http://127.0.0.1:8480",
        max_body_bytes=4096,
    )
    app = create_platform_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=settings.public_url) as client:
        big = await client.post("/api/cli/datasets", content=b"{" + b" " * 5000 + b"}")
        small = await client.post("/api/cli/datasets", content=b"{" + b" " * 3000 + b"}")
        login = await client.post("/login", content=b"a=" + b"b" * 5000)
    app.state.platform.database.dispose()
    assert big.status_code == 413 and "4096 bytes" in big.json()["message"]
    assert small.status_code == 401  # under the cap: on to authentication
    assert login.status_code == 413


def test_max_body_bytes_is_checked_where_it_is_read(tmp_path, monkeypatch):
    from osmosis_ai.errors import ConfigError
    from osmosis_ai.platform.settings import MAX_BODY_ENV, load_settings

    monkeypatch.setenv(MAX_BODY_ENV, "2048")
    assert load_settings(data_dir=tmp_path).max_body_bytes == 2048
    with pytest.raises(ConfigError, match="--max-body-bytes 10 is out of range"):
        load_settings(data_dir=tmp_path, max_body_bytes=10)
    monkeypatch.setenv(MAX_BODY_ENV, "lots")
    with pytest.raises(ConfigError, match="OSMOSIS_PLATFORM_MAX_BODY_BYTES='lots'"):
        load_settings(data_dir=tmp_path)


async def test_thousands_of_headers_are_refused_431(team):
    harness = team["harness"]
    headers = [(f"x-h{i}", "v") for i in range(2000)]
    async with harness.client() as client:
        answer = await client.get("/api/health", headers=headers)
    assert answer.status_code == 431 and answer.json()["code"] == "HEADERS_TOO_LARGE"


# --- storage -------------------------------------------------------------------------------


def _import_body(files: list[dict[str, object]], *, run_id: str | None = None) -> dict[str, object]:
    return {
        "schema_version": 1,
        "local_run_id": run_id or secrets.token_hex(16),
        "manifest_digest": hashlib.sha256(secrets.token_bytes(8)).hexdigest(),
        "run": {
            "name": "local-run",
            "model_path": "openai/gpt-x",
            "dataset_name": "rows",
            "rollout_name": "multiply",
        },
        "files": files,
    }


def _file(path: str, data: bytes | None = None, *, size: int | None = None) -> dict[str, object]:
    content = data or b""
    return {
        "path": path,
        "size": len(content) if size is None else size,
        "sha256": hashlib.sha256(content).hexdigest(),
    }


async def test_an_import_declaring_a_petabyte_is_refused_before_signing(team):
    harness, bob = team["harness"], team["bob"]
    async with harness.client() as client:
        answer = await client.post(
            "/api/cli/eval-runs/imports",
            json=_import_body([_file("index.jsonl", size=10**15)]),
            headers=bob.headers(REPO),
        )
        trajectory = await client.post(
            "/api/cli/eval-runs/imports",
            json=_import_body(
                [_file("index.jsonl", b"x"), _file("trajectories/row_0_run_0.json", size=2**30)]
            ),
            headers=bob.headers(REPO),
        )
    assert answer.status_code == 400, answer.text
    assert answer.json()["code"] == "FILE_TOO_LARGE"
    assert str(10**15) in answer.json()["message"]
    assert trajectory.status_code == 400 and trajectory.json()["code"] == "FILE_TOO_LARGE"
    assert "67108864 bytes" in trajectory.json()["message"]
    with harness.platform.read() as db:
        assert db.scalars(select(Run)).all() == []
        assert db.scalars(select(EvalImport)).all() == []


async def test_uploads_past_the_workspace_quota_are_refused_before_signing(tmp_path):
    harness = Harness(tmp_path / "data", f"sqlite:///{tmp_path / 'p.db'}")
    harness.settings = dataclasses.replace(harness.settings, workspace_quota_bytes=10_000)
    harness.platform.settings = harness.settings
    harness.workspace(WS, REPO)
    bob = harness.account("bob@example.com", workspace=WS)
    try:
        async with harness.client() as client:
            first = await client.post(
                "/api/cli/datasets",
                json={"file_name": "rows", "file_size": 6_000, "extension": "jsonl"},
                headers=bob.headers(REPO),
            )
            second = await client.post(
                "/api/cli/datasets",
                json={"file_name": "more", "file_size": 6_000, "extension": "jsonl"},
                headers=bob.headers(REPO),
            )
            imported = await client.post(
                "/api/cli/eval-runs/imports",
                json=_import_body([_file("index.jsonl", size=5_000)]),
                headers=bob.headers(REPO),
            )
        assert first.status_code == 201, first.text
        for refused in (second, imported):
            assert refused.status_code == 413, refused.text
            body = refused.json()
            assert body["code"] == "STORAGE_QUOTA_EXCEEDED"
            assert body["details"]["used_bytes"] == 6_000
            assert "--workspace-quota-bytes" in body["message"]
        with harness.platform.read() as db:
            assert db.scalars(select(Dataset.file_name)).all() == ["rows"]
    finally:
        harness.close()


async def _open_import(client, account, index: bytes) -> dict[str, object]:
    opened = await client.post(
        "/api/cli/eval-runs/imports",
        json=_import_body([_file("index.jsonl", index)]),
        headers=account.headers(REPO),
    )
    assert opened.status_code == 200, opened.text
    return opened.json()


async def test_a_failed_import_ends_its_run_failed_with_the_reason(team):
    harness, bob = team["harness"], team["bob"]
    index = b"this is not an index entry\n"
    async with harness.client() as client:
        session = await _open_import(client, bob, index)
        base = f"/api/cli/eval-runs/imports/{session['session_id']}"
        signed = await client.post(
            f"{base}/uploads", json={"paths": ["index.jsonl"]}, headers=bob.headers(REPO)
        )
        upload = signed.json()["files"][0]["upload"]
        put = await client.put(
            upload["presigned_url"], content=index, headers=upload["upload_headers"]
        )
        assert put.status_code == 200, put.text
        done = await client.post(
            f"{base}/uploads/complete", json={"path": "index.jsonl"}, headers=bob.headers(REPO)
        )
        assert done.status_code == 200, done.text
        final = await client.post(f"{base}/finalize", headers=bob.headers(REPO))
    assert final.status_code == 400
    with harness.platform.read() as db:
        run = db.get(Run, session["eval_run_id"])
        assert run is not None and run.status == "failed"
        assert run.error is not None and "index.jsonl line 1" in run.error
        logged = db.scalars(select(RunLog.message).where(RunLog.run_id == run.id)).all()
        assert any("The import failed" in line for line in logged)
        assert db.scalar(select(EvalImport.status)) == "failed"


def _age_everything(harness: Harness, bob) -> tuple[str, str]:
    """A dataset upload and an import opened and left; a device login started. Their ids."""
    from osmosis_ai.platform.api.objects import object_store, url_signer
    from osmosis_ai.platform.services import datasets, device, eval_results
    from osmosis_ai.platform.services.accounts import workspace_for_name

    platform = harness.platform
    with platform.transaction() as db:
        access = workspace_for_name(db, bob.user_id, WS)
        assert access is not None
        created = datasets.create_dataset(
            db,
            access,
            bob.user_id,
            file_name="left",
            file_size=100,
            extension="jsonl",
            overwrite_dataset_id=None,
            store=object_store(platform),
            signer=url_signer(platform),
            base_url=harness.settings.public_url,
            now=platform.now(),
            quota_bytes=harness.settings.workspace_quota_bytes,
        )
        request = eval_results.ImportRequest(
            local_run_id=secrets.token_hex(16),
            manifest_digest=hashlib.sha256(b"m").hexdigest(),
            run=_import_body([])["run"],  # pyright: ignore[reportArgumentType]
            schema_versions={},
            provenance={},
            files=[eval_results.ImportFile("index.jsonl", 10, hashlib.sha256(b"").hexdigest())],
        )
        imported = eval_results.open_import(
            db, access, bob.user_id, request, now=platform.now(), quota_bytes=10**9
        )
        eval_results.sign_uploads(
            imported, ["index.jsonl"], object_store(platform), url_signer(platform), "http://x"
        )
        device.start(db, device_name="laptop", now=platform.now())
        return created.dataset.id, imported.run_id


def test_the_servers_periodic_sweep_ends_what_was_abandoned(tmp_path):
    from osmosis_ai.platform.api.app import create_platform_app
    from osmosis_ai.platform.api.objects import object_store

    harness = Harness(tmp_path / "data", f"sqlite:///{tmp_path / 'p.db'}")
    harness.workspace(WS, REPO)
    bob = harness.account("bob@example.com", workspace=WS)
    dataset_id, run_id = _age_everything(harness, bob)
    staging = object_store(harness.platform).root / "staging" / "uploads"
    assert len(list(staging.iterdir())) == 2  # the dataset's upload and the import's
    app = create_platform_app(
        harness.settings,
        database=harness.platform.database,
        clock=harness.clock,
        sweep_interval_s=0.05,
    )
    try:
        with ServerThread(app):
            time.sleep(0.3)  # passes run, but nothing is old yet
            with harness.platform.read() as db:
                assert db.get(Dataset, dataset_id).status == "uploading"  # pyright: ignore[reportOptionalMemberAccess]
            harness.clock.advance(days=3)
            deadline = time.monotonic() + 10
            while True:
                with harness.platform.read() as db:
                    run = db.get(Run, run_id)
                    dataset = db.get(Dataset, dataset_id)
                    logins = db.scalars(select(DeviceAuthorization)).all()
                    assert run is not None and dataset is not None
                    if run.status == "failed" and dataset.status == "cancelled" and not logins:
                        break
                assert time.monotonic() < deadline, (run.status, dataset.status, len(logins))
                time.sleep(0.05)
        assert run.error is not None and "expired unfinished" in run.error
        assert list(staging.iterdir()) == []  # what the uploads received is gone
        with harness.platform.read() as db:
            assert db.scalar(select(EvalImport.status)) == "expired"
    finally:
        harness.close()


# --- the device login ------------------------------------------------------------------------


async def test_starting_device_logins_is_rate_limited_per_address(team):
    from osmosis_ai.platform.api.device import AUTHORIZE_LIMIT

    harness = team["harness"]
    async with harness.client() as client:
        answers = [
            await client.post("/api/cli/device/authorize", json={"deviceName": "laptop"})
            for _ in range(AUTHORIZE_LIMIT + 1)
        ]
    assert [a.status_code for a in answers[:-1]] == [200] * AUTHORIZE_LIMIT
    refused = answers[-1]
    assert refused.status_code == 429 and refused.json()["code"] == "RATE_LIMITED"
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    with harness.platform.read() as db:
        assert len(db.scalars(select(DeviceAuthorization)).all()) == AUTHORIZE_LIMIT


def test_the_rate_limit_lets_a_caller_through_after_retry_after():
    from osmosis_ai.platform.api.limits import RateLimitedError, RateLimiter

    now = [100.0]
    limiter = RateLimiter(2, 10.0, clock=lambda: now[0])
    limiter.check("10.0.0.1", "calls")
    now[0] += 4
    limiter.check("10.0.0.1", "calls")
    with pytest.raises(RateLimitedError) as refused:
        limiter.check("10.0.0.1", "calls")
    limiter.check("10.0.0.2", "calls")  # another address has its own window
    assert refused.value.retry_after == 6
    now[0] += refused.value.retry_after
    limiter.check("10.0.0.1", "calls")


# --- other members' work ----------------------------------------------------------------------


async def test_only_the_creator_or_an_admin_overwrites_or_aborts_a_dataset(team):
    harness, alice, bob, carol = team["harness"], team["alice"], team["bob"], team["carol"]
    make = {"file_name": "rows", "file_size": 10, "extension": "jsonl"}
    async with harness.client() as client:
        created = await client.post("/api/cli/datasets", json=make, headers=bob.headers(REPO))
        dataset_id = created.json()["id"]
        overwrite = {**make, "overwrite_dataset_id": dataset_id}
        carol_over = await client.post(
            "/api/cli/datasets", json=overwrite, headers=carol.headers(REPO)
        )
        carol_abort = await client.post(
            f"/api/cli/datasets/{dataset_id}/abort", headers=carol.headers(REPO)
        )
        alice_over = await client.post(
            "/api/cli/datasets", json=overwrite, headers=alice.headers(REPO)
        )
        bob_abort = await client.post(
            f"/api/cli/datasets/{dataset_id}/abort", headers=bob.headers(REPO)
        )
    for refused, code in ((carol_over, "OVERWRITE"), (carol_abort, "ABORT")):
        assert refused.status_code == 403, refused.text
        assert refused.json()["code"] == f"DATASET_{code}_FORBIDDEN"
        assert "your role in 'Team Alpha' is member" in refused.json()["message"]
    assert alice_over.status_code == 201  # an owner may
    assert bob_abort.status_code == 200 and bob_abort.json()["status"] == "cancelled"


async def test_only_who_deployed_or_an_admin_undeploys(team):
    harness, alice, bob, carol = team["harness"], team["alice"], team["bob"], team["carol"]
    training = seed_training(
        harness.platform, _workspace_id(harness), bob.user_id, steps=4, checkpoints=(2,)
    )
    model = f"{training.name}-step-2"
    async with harness.client() as client:
        deployed = await client.post(f"/api/cli/models/{model}/deploy", headers=bob.headers(REPO))
        assert deployed.status_code == 200, deployed.text
        carol_off = await client.post(
            f"/api/cli/models/{model}/undeploy", headers=carol.headers(REPO)
        )
        alice_off = await client.post(
            f"/api/cli/models/{model}/undeploy", headers=alice.headers(REPO)
        )
    assert carol_off.status_code == 403 and carol_off.json()["code"] == "UNDEPLOY_FORBIDDEN"
    assert alice_off.status_code == 200 and alice_off.json()["status"] == "inactive"


def test_stop_retry_overwrite_abort_and_undeploy_share_one_rule():
    """The rule has one implementation: every service calls it instead of its own check."""
    root = Path(__file__).parents[1] / "src/osmosis_ai/platform/services"
    callers = {
        path.name
        for path in root.glob("*.py")
        if "require_creator_or_manager(" in path.read_text() and path.name != "accounts.py"
    }
    assert callers == {"runs.py", "eval_results.py", "datasets.py", "deployments.py"}
    for path in root.glob("*.py"):
        assert "creator_id != user_id" not in path.read_text(), path.name


# --- artifacts, names, headers -----------------------------------------------------------------


async def _sign_in(client, account) -> None:
    page = await client.get("/login")
    csrf = CSRF_FIELD.search(page.text)
    assert csrf is not None
    answer = await client.post(
        "/login", data={"csrf": csrf.group(1), "email": account.email, "token": account.token}
    )
    assert answer.status_code == 303, answer.text


async def test_an_artifact_streams_from_disk_with_ranges(team):
    harness, bob = team["harness"], team["bob"]
    evaluation = seed_eval(harness.platform, _workspace_id(harness), bob.user_id, samples=2)
    url = f"/w/{quote(WS, safe='')}/evals/{evaluation.name}/samples/0/0/artifact"
    async with harness.client() as client:
        await _sign_in(client, bob)
        whole = await client.get(url, params={"path": "logs/agent.log"})
        part = await client.get(
            url, params={"path": "logs/agent.log"}, headers={"Range": "bytes=0-5"}
        )
        missing = await client.get(url, params={"path": "nothing.txt"})
    assert whole.status_code == 200 and whole.content.startswith(b"line 1\n")
    assert "attachment" in whole.headers["content-disposition"]
    assert part.status_code == 206 and part.content == b"line 1"
    assert missing.status_code == 404


async def test_names_are_limited_in_bytes_before_anything_is_made(team):
    harness, bob = team["harness"], team["bob"]
    emoji = "\U0001f600" * 200  # 200 characters, 800 bytes
    async with harness.client() as client:
        dataset = await client.post(
            "/api/cli/datasets",
            json={"file_name": emoji, "file_size": 10, "extension": "jsonl"},
            headers=bob.headers(REPO),
        )
        artifact = await client.post(
            "/api/cli/eval-runs/imports",
            json=_import_body(
                [_file("index.jsonl", b"x"), _file(f"artifacts/row_0_run_0/{emoji}.txt", b"x")]
            ),
            headers=bob.headers(REPO),
        )
    assert dataset.status_code == 400, dataset.text
    assert "800 bytes" in dataset.json()["message"] and "200 bytes" in dataset.json()["message"]
    assert artifact.status_code == 400, artifact.text
    assert "255 bytes" in artifact.json()["message"]
    with harness.platform.read() as db:
        assert db.scalars(select(Dataset)).all() == [] and db.scalars(select(Run)).all() == []


async def test_a_malformed_version_header_is_400(team):
    harness, bob = team["harness"], team["bob"]
    async with harness.client() as client:
        huge = await client.get(
            "/api/cli/verify", headers=bob.headers(**{"X-Osmosis-CLI-Version": "9" * 5000})
        )
        words = await client.get(
            "/api/cli/verify", headers=bob.headers(**{"X-Osmosis-CLI-Version": "latest"})
        )
        good = await client.get(
            "/api/cli/verify", headers=bob.headers(**{"X-Osmosis-CLI-Version": "0.3.8"})
        )
    for refused in (huge, words):
        assert refused.status_code == 400
        assert refused.json()["code"] == "INVALID_CLI_VERSION"
        assert refused.json()["field"] == "X-Osmosis-CLI-Version"
    assert len(huge.text) < 2000  # the value is named, shortened
    assert good.status_code == 200


# --- dashboard sessions -------------------------------------------------------------------------


async def test_signing_out_ends_the_session_on_the_server(team):
    harness, bob = team["harness"], team["bob"]
    home = f"/w/{quote(WS, safe='')}/runs"
    async with harness.client() as client:
        await _sign_in(client, bob)
        kept = client.cookies.get("osmosis_session")
        page = await client.get(home)
        assert page.status_code == 200
        csrf = CSRF_FIELD.search(page.text)
        assert csrf is not None
        out = await client.post("/logout", data={"csrf": csrf.group(1)})
        assert out.status_code == 303
    async with harness.client(cookies={"osmosis_session": kept}) as replay:
        again = await replay.get(home)
    assert again.status_code == 303 and again.headers["location"].startswith("/login")
    async with harness.client() as client:  # signing in again works
        await _sign_in(client, bob)
        assert (await client.get(home)).status_code == 200


async def test_revoking_the_token_refuses_a_cookie_minted_before(team):
    harness, bob = team["harness"], team["bob"]
    home = f"/w/{quote(WS, safe='')}/runs"
    async with harness.client() as client:
        await _sign_in(client, bob)
        kept = client.cookies.get("osmosis_session")
        revoked = await client.delete(f"/api/cli/tokens/{bob.token_id}", headers=bob.headers())
        assert revoked.status_code in (200, 204), revoked.text
    async with harness.client(cookies={"osmosis_session": kept}) as replay:
        again = await replay.get(home)
    assert again.status_code == 303 and again.headers["location"].startswith("/login")


# --- a served platform: the parser's header bound, the access log ------------------------------


@pytest.fixture
def served(tmp_path):
    """The platform as ``osmosis platform serve`` configures uvicorn (its parser, its access
    log), in a thread on a free loopback port, with an object to download; the access log
    is collected in ``lines``."""
    import logging
    import threading

    import uvicorn

    from osmosis_ai.platform.api.app import create_platform_app
    from osmosis_ai.platform.api.objects import object_store, url_signer
    from osmosis_ai.platform.server import ACCESS_LOGGER, server_config
    from osmosis_ai.platform.settings import load_settings

    port = free_port()
    settings = load_settings(
        data_dir=tmp_path / "data", database_url=f"sqlite:///{tmp_path / 'p.db'}", port=port
    )
    app = create_platform_app(settings)
    server = uvicorn.Server(server_config(app, settings, log_level="info"))
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    collect = Collect()
    logging.getLogger(ACCESS_LOGGER).addHandler(collect)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        platform = app.state.platform
        object_store(platform).put("datasets/w/d/data.jsonl", b'{"a": 1}\n')
        url = settings.public_url
        signed = url_signer(platform).url(
            url, "get", "datasets/w/d/data.jsonl", {"name": "data.jsonl"}
        )
        yield {"url": url, "port": port, "lines": lines, "signed": signed}
    finally:
        server.should_exit = True
        thread.join(30)
        logging.getLogger(ACCESS_LOGGER).removeHandler(collect)


def test_a_megabyte_header_is_refused_by_the_parser(served):
    with socket.create_connection(("127.0.0.1", served["port"]), timeout=10) as sock:
        sock.sendall(b"GET /api/health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        with contextlib.suppress(OSError):  # closed while sending: refused
            sock.sendall(b"a" * MIB + b"\r\n\r\n")
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
    assert b"200 OK" not in answer
    assert answer == b"" or answer.startswith((b"HTTP/1.1 400", b"HTTP/1.1 431")), answer[:200]


def test_the_access_log_never_holds_a_signature(served):
    answer = httpx.get(served["signed"], timeout=10)
    assert answer.status_code == 200 and answer.content == b'{"a": 1}\n'
    tampered = httpx.get(served["signed"].replace("op=get", "op=get&x=1"), timeout=10)
    assert tampered.status_code == 403
    signature = re.search(r"signature=([^&]+)", served["signed"])
    assert signature is not None
    text = "\n".join(served["lines"])
    assert text.count("/objects/datasets/w/d/data.jsonl?[redacted]") == 2, text
    assert signature.group(1) not in text and "signature=" not in text
