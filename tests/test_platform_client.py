"""The ``/api/cli`` client against a stand-in platform on 127.0.0.1: headers, the HTTP to
CLI-code mapping, version signals, pagination, the device-code poll, and dataset bytes
through presigned URLs (simple and multipart, retries, no bearer token to the store)."""

from __future__ import annotations

import json
import os
import stat

import pytest

import platform_cli_support as support
from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.platform.client import (
    PlatformClient,
    PlatformClientError,
    UploadInstructions,
    normalize_platform_url,
)
from osmosis_ai.platform.client import api as client_module
from osmosis_ai.platform.client.credentials import (
    Credentials,
    CredentialStore,
    credentials_path,
    keyring_prefix,
    resolve_target,
)
from osmosis_ai.platform.client.local_repo import identity_of
from osmosis_ai.platform.client.transfer import Transfers
from osmosis_ai.testing.serving import free_port

standin, home = support.standin, support.home  # fixtures


def test_calls_carry_the_cli_headers_and_the_scope_only_when_scoped(standin):
    token = standin.add_token()
    standin.add_workspace("acme/demo")
    with PlatformClient(standin.url, token, git_identity="acme/demo") as client:
        client.call("GET", "/api/cli/datasets", params={"limit": 1})
        client.call("POST", "/api/cli/device/authorize", json={"deviceName": "x"}, scoped=False)
    listed, device = standin.requests
    assert listed.headers["authorization"] == f"Bearer {token}"
    assert listed.headers["x-osmosis-cli-version"] == PACKAGE_VERSION
    assert listed.headers["user-agent"] == f"osmosis-cli/{PACKAGE_VERSION}"
    assert listed.headers["x-osmosis-git"] == "acme/demo"
    assert listed.query == {"limit": "1"}
    assert "x-osmosis-git" not in device.headers


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (400, {"message": "bad", "field": "name"}, "VALIDATION"),
        (401, {"code": "TOKEN_EXPIRED"}, "AUTH_REQUIRED"),
        (403, {"code": "BILLING_REQUIRED", "message": "pay"}, "BILLING_REQUIRED"),
        (403, {"code": "SUBSCRIPTION_REQUIRED"}, "SUBSCRIPTION_REQUIRED"),
        (403, {"error": "An active subscription is needed"}, "SUBSCRIPTION_REQUIRED"),
        (403, {"code": "FORBIDDEN", "message": "admins only"}, "PLATFORM_ERROR"),
        (404, {"message": "no such dataset"}, "NOT_FOUND"),
        (409, {"message": "exists", "details": {"existing_dataset_id": "d1"}}, "CONFLICT"),
        (426, {"status": "unsupported", "message": "Upgrade to 9.9"}, "UPGRADE_REQUIRED"),
        (429, {"message": "slow down"}, "RATE_LIMITED"),
        (500, {}, "PLATFORM_ERROR"),
    ],
)
def test_http_failures_map_to_cli_codes(standin, status, body, code):
    with PlatformClient(standin.url, "t") as client, pytest.raises(PlatformClientError) as info:
        client.call("GET", f"/test/status/{status}", params={"body": json.dumps(body)})
    error = info.value
    assert error.code == code
    assert error.status_code == status
    assert error.details["status_code"] == status
    if "code" in body and status != 426:
        assert error.details["platform_code"] == body["code"]
    if status == 400:
        assert error.details["field"] == "name" and error.message == "bad"
    if status == 409:
        assert error.details["existing_dataset_id"] == "d1"
    if status == 426:
        assert error.message == "Upgrade to 9.9"
    if status == 500:
        assert "HTTP 500" in error.message


def test_401_messages_name_the_token_in_use(standin):
    body = json.dumps({"code": "TOKEN_REVOKED"})
    for env_token, expected in ((True, "OSMOSIS_TOKEN"), (False, "osmosis auth login")):
        with (
            PlatformClient(standin.url, "t", using_env_token=env_token) as client,
            pytest.raises(PlatformClientError) as info,
        ):
            client.call("GET", "/test/status/401", params={"body": body})
        assert expected in info.value.message and "revoked" in info.value.message


def test_unreachable_platform_is_a_network_error():
    with (
        PlatformClient(f"http://127.0.0.1:{free_port()}", "t") as client,
        pytest.raises(PlatformClientError) as info,
    ):
        client.call("GET", "/api/cli/verify")
    assert info.value.code == "NETWORK"


def test_a_non_json_answer_is_a_platform_error(standin):
    with PlatformClient(standin.url, "t") as client, pytest.raises(PlatformClientError) as info:
        client.call("GET", "/test/status/200", params={"body": json.dumps([1, 2])})
    assert info.value.code == "PLATFORM_ERROR"


def test_version_signal_warns_once_per_status(standin, monkeypatch):
    monkeypatch.setattr(client_module, "_signalled", set())
    standin.version_signal = ("upgrade_available", "osmosis-ai 9.9 is out")
    seen: list[tuple[str, str]] = []
    token = standin.add_token()
    with PlatformClient(standin.url, token, warn=lambda c, m: seen.append((c, m))) as client:
        client.verify()
        client.verify()
    assert seen == [("UPGRADE_AVAILABLE", "osmosis-ai 9.9 is out")]


def test_fetch_walks_every_page_with_all(standin):
    token = standin.add_token()
    standin.add_workspace("acme/demo")
    standin.rollouts = [{"id": f"r{i}", "name": f"r-{i}"} for i in range(120)]
    with PlatformClient(standin.url, token, git_identity="acme/demo") as client:
        one = client.fetch("/api/cli/rollouts", "rollouts", limit=7)
        every = client.fetch("/api/cli/rollouts", "rollouts", fetch_all=True)
    assert [r["id"] for r in one.items] == [f"r{i}" for i in range(7)]
    assert (one.total_count, one.has_more, one.next_offset) == (120, True, 7)
    assert [r["id"] for r in every.items] == [f"r{i}" for i in range(120)]
    assert (every.has_more, every.next_offset) == (False, None)
    offsets = [r.query["offset"] for r in standin.of("GET", "/api/cli/rollouts")][1:]
    assert offsets == ["0", "50", "100"]


def test_device_poll_honours_pending_and_slow_down(standin):
    standin.device_pending = ["authorization_pending", "slow_down", "authorization_pending"]
    waits: list[float] = []
    with PlatformClient(standin.url, sleep=waits.append) as client:
        code = client.device_authorize("laptop")
        grant = client.device_poll(code)
    assert grant.user.email == "device@example.com" and grant.token in standin.tokens
    assert waits == [1.0, 6.0, 6.0]  # interval 1 s; slow_down adds 5 s for good
    assert standin.of("POST", "/api/cli/device/authorize")[0].body == {"deviceName": "laptop"}


def test_device_poll_stops_on_denial(standin):
    standin.device_pending = ["access_denied"]
    with PlatformClient(standin.url, sleep=lambda s: None) as client:
        code = client.device_authorize()
        with pytest.raises(PlatformClientError) as info:
            client.device_poll(code)
    assert info.value.code == "AUTH_REQUIRED" and "denied" in info.value.message


# --- dataset bytes ----------------------------------------------------------------------------


def _instructions(standin, key: str, size: int, part_size: int | None) -> UploadInstructions:
    if part_size is None:
        return UploadInstructions(method="simple", presigned_url=f"{standin.url}/objects/{key}")
    total = -(-size // part_size)
    return UploadInstructions.model_validate(
        {
            "method": "multipart",
            "part_size": part_size,
            "total_parts": total,
            "presigned_urls": [
                {"part_number": n, "presigned_url": f"{standin.url}/objects/{key}?part={n}"}
                for n in range(1, total + 1)
            ],
        }
    )


def test_multipart_upload_streams_parts_and_returns_their_etags(standin, tmp_path):
    data = os.urandom(2_500_000)
    path = tmp_path / "big.jsonl"
    path.write_bytes(data)
    progress: list[int] = []
    with Transfers() as transfers:
        parts = transfers.upload(
            _instructions(standin, "k", len(data), 1_000_000),
            path,
            progress=lambda done, total: progress.append(done),
        )
    import hashlib

    assert parts == [
        {
            "PartNumber": n,
            "ETag": hashlib.md5(data[(n - 1) * 1_000_000 : n * 1_000_000]).hexdigest(),
        }
        for n in (1, 2, 3)
    ]
    assert b"".join(standin.parts["k"][n] for n in (1, 2, 3)) == data
    puts = standin.of("PUT", "/objects/k")
    assert [p.headers["content-length"] for p in puts] == ["1000000", "1000000", "500000"]
    assert all("authorization" not in p.headers for p in puts)  # presigned: no bearer token
    assert progress[-1] == len(data) and progress == sorted(progress)


def test_simple_upload_retries_transient_failures(standin, tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes(b"a,b\n1,2\n")
    standin.fail["PUT /objects/s"] = [(503, {}), (429, {})]
    waits: list[float] = []
    with Transfers(sleep=waits.append) as transfers:
        assert transfers.upload(_instructions(standin, "s", 8, None), path) is None
    assert standin.objects["s"] == b"a,b\n1,2\n" and waits == [1.0, 2.0]
    standin.fail["PUT /objects/s"] = [(403, {"message": "signature expired"})]
    with (
        Transfers(sleep=waits.append) as transfers,
        pytest.raises(PlatformClientError) as info,
    ):
        transfers.upload(_instructions(standin, "s", 8, None), path)
    assert info.value.code == "PLATFORM_ERROR" and "HTTP 403" in info.value.message


def test_plaintext_transfer_urls_to_remote_hosts_are_refused(tmp_path):
    path = tmp_path / "d.csv"
    path.write_bytes(b"x")
    instructions = UploadInstructions(method="simple", presigned_url="http://store.example/o")
    with (
        Transfers() as transfers,
        pytest.raises(PlatformClientError) as info,
    ):
        transfers.upload(instructions, path)
    assert info.value.code == "VALIDATION" and "OSMOSIS_ALLOW_INSECURE" in info.value.message


def test_download_never_clobbers_and_checks_the_size(standin, tmp_path):
    standin.objects["d"] = b"0123456789"
    target = tmp_path / "out" / "d.jsonl"
    with Transfers() as transfers:
        transfers.download(f"{standin.url}/objects/d", target, expected_size=10)
        assert target.read_bytes() == b"0123456789"
        with pytest.raises(FileExistsError):
            transfers.download(f"{standin.url}/objects/d", target)
        with pytest.raises(PlatformClientError, match="promised 11"):
            transfers.download(f"{standin.url}/objects/d", target, overwrite=True, expected_size=11)
    assert target.read_bytes() == b"0123456789"  # the failed download left it alone
    assert sorted(p.name for p in target.parent.iterdir()) == ["d.jsonl"]  # no temp files left


# --- URLs, targets and saved logins -----------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normal"),
    [
        (None, "https://platform.osmosis.ai"),
        ("https://Platform.Example.com:443/", "https://platform.example.com"),
        ("localhost:8080", "http://localhost:8080"),
        ("example.com", "https://example.com"),
        ("http://[::1]:80/base/", "http://[::1]/base"),
    ],
)
def test_platform_urls_are_normalised(raw, normal):
    assert normalize_platform_url(raw) == normal


def test_target_rules_for_urls_and_environment_tokens():
    local = "http://127.0.0.1:8080"
    assert resolve_target({"OSMOSIS_PLATFORM_URL": local}).insecure is False
    with pytest.raises(PlatformClientError) as info:
        resolve_target({"OSMOSIS_PLATFORM_URL": "http://platform.lan"})
    assert info.value.code == "VALIDATION"
    allowed = {
        "OSMOSIS_PLATFORM_URL": "http://platform.lan",
        "OSMOSIS_ALLOW_INSECURE_PLATFORM_URL": "1",
    }
    assert resolve_target(allowed).insecure is True
    with pytest.raises(PlatformClientError) as info:
        resolve_target({"OSMOSIS_PLATFORM_URL": local, "OSMOSIS_TOKEN": "t"})
    assert info.value.code == "ENV_TOKEN_PLATFORM_REQUIRED"
    with pytest.raises(PlatformClientError) as info:
        resolve_target(
            {
                "OSMOSIS_PLATFORM_URL": local,
                "OSMOSIS_TOKEN": "t",
                "OSMOSIS_TOKEN_PLATFORM_URL": "http://127.0.0.1:9090",
            }
        )
    assert info.value.code == "ENV_TOKEN_PLATFORM_MISMATCH"
    bound = resolve_target(
        {
            "OSMOSIS_PLATFORM_URL": local,
            "OSMOSIS_TOKEN": "t",
            "OSMOSIS_TOKEN_PLATFORM_URL": local + "/",
        }
    )
    assert bound.env_token == "t"
    assert resolve_target({"OSMOSIS_TOKEN": "t"}).env_token == "t"  # the default platform


def _credentials(token: str = "tok-1", token_id: str | None = "id-1") -> Credentials:
    from datetime import UTC, datetime

    from osmosis_ai.platform.client import User

    return Credentials(
        access_token=token,
        user=User(id="u1", email="ada@example.com", name="Ada"),
        expires_at=datetime(2099, 1, 1, tzinfo=UTC),
        created_at=datetime(2030, 1, 1, tzinfo=UTC),
        token_id=token_id,
    )


def test_file_store_is_owner_only_version_2_and_keyed_by_platform(home):
    warnings: list[tuple[str, str]] = []
    store = CredentialStore(
        "http://127.0.0.1:8480", keyring=None, warn=lambda c, m: warnings.append((c, m)), environ={}
    )
    assert store.save(_credentials()) == "file"
    assert warnings[0][0] == "KEYRING_UNAVAILABLE"
    other = CredentialStore("https://platform.osmosis.ai", keyring=None, environ={})
    other.save(_credentials("tok-2", "id-2"))
    path = credentials_path()
    assert path == home / ".config" / "osmosis" / "credentials.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    data = json.loads(path.read_text())
    assert data["version"] == 2
    entry = data["platforms"]["http://127.0.0.1:8480"]
    assert entry["access_token"] == "tok-1" and entry["token_store"] == "file"
    assert entry["user"] == {"id": "u1", "email": "ada@example.com", "name": "Ada"}
    loaded = store.load()
    assert loaded is not None and loaded.access_token == "tok-1" and loaded.source == "file"
    assert store.delete() is True and store.load() is None
    assert other.load() is not None and other.load().access_token == "tok-2"  # untouched


class MemoryKeyring:
    def __init__(self) -> None:
        self.entries: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, account: str) -> str | None:
        return self.entries.get((service, account))

    def set_password(self, service: str, account: str, password: str) -> None:
        self.entries[(service, account)] = password

    def delete_password(self, service: str, account: str) -> None:
        if (service, account) not in self.entries:
            raise type("PasswordDeleteError", (Exception,), {})()
        del self.entries[(service, account)]


def test_keyring_store_keeps_the_token_out_of_the_file(home):
    keyring = MemoryKeyring()
    url = "https://platform.example.com"
    store = CredentialStore(url, keyring=keyring, environ={})
    assert store.save(_credentials()) == "keyring"
    entry = json.loads(credentials_path().read_text())["platforms"][url]
    assert "access_token" not in entry and entry["token_store"] == "keyring"
    account = entry["keyring_account"]
    assert account.startswith(f"{keyring_prefix(url)}:")
    assert keyring.entries == {("osmosis-cli", account): "tok-1"}
    loaded = store.load()
    assert loaded is not None and loaded.access_token == "tok-1" and loaded.source == "keyring"
    assert store.save(_credentials("tok-3", "id-3")) == "keyring"
    assert list(keyring.entries.values()) == ["tok-3"]  # the replaced token left the keyring
    store.delete()
    assert keyring.entries == {} and not credentials_path().exists()


def test_unreadable_metadata_is_reported_and_moved_aside_on_login(home):
    path = credentials_path()
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    store = CredentialStore("https://platform.example.com", keyring=None, environ={})
    with pytest.raises(PlatformClientError) as info:
        store.load()
    assert info.value.code == "CREDENTIALS_PARSE_FAILED"
    path.write_text(json.dumps({"version": 3, "platforms": {}}))
    with pytest.raises(PlatformClientError) as info:
        store.load()
    assert info.value.code == "CREDENTIALS_VERSION_CHANGED"
    warnings: list[str] = []
    store.warn = lambda code, message: warnings.append(code)
    store.save(_credentials())
    assert "CREDENTIALS_METADATA_BACKED_UP" in warnings
    assert (path.parent / "credentials.json.bak").exists() and store.load() is not None


def test_a_keyring_entry_without_its_token_warns_token_not_found(home):
    keyring = MemoryKeyring()
    store = CredentialStore("https://platform.example.com", keyring=keyring, environ={})
    store.save(_credentials())
    keyring.entries.clear()
    seen: list[str] = []
    store.warn = lambda code, message: seen.append(code)
    assert store.load() is None and seen == ["TOKEN_NOT_FOUND"]


@pytest.mark.parametrize(
    ("url", "identity"),
    [
        ("git@github.com:Acme/Demo.git", "acme/demo"),
        ("https://user:secret@github.com/acme/demo", "acme/demo"),
        ("ssh://git@gitea.local:2222/Team/Repo.git", "team/repo"),
        ("file:///srv/git/acme/demo.git", "acme/demo"),
        ("/srv/git/acme/demo.git", "acme/demo"),
    ],
)
def test_origin_urls_name_owner_and_repo(url, identity):
    repo = identity_of(url)
    assert repo.identity == identity
    assert "secret" not in repo.remote_url


def test_an_origin_without_owner_and_repo_is_refused():
    with pytest.raises(PlatformClientError) as info:
        identity_of("https://example.com/demo")
    assert info.value.code == "WORKSPACE_REQUIRED"


# --- paths the platform names in downloads ---------------------------------------------------


@pytest.mark.parametrize(
    "path", ["", "/etc/passwd", "../up", "a/../../up", "a//b", "./a", "a\\..\\b", "a\\b"]
)
def test_every_download_refuses_a_path_that_could_leave_its_folder(path):
    # One check for checkpoint and eval downloads: checkpoints used to turn backslashes
    # into folders and let empty segments through.
    from osmosis_ai.platform.client.errors import UnsafeAnswerError
    from osmosis_ai.platform.client.transfer import safe_relative

    with pytest.raises(UnsafeAnswerError) as caught:
        safe_relative(path)
    assert caught.value.code == "PLATFORM_ERROR"
    assert caught.value.message == f"The platform sent an unsafe file path: {path!r}"


def test_a_download_keeps_a_safe_path_and_the_last_part_of_a_name():
    from osmosis_ai.platform.client.errors import UnsafeAnswerError
    from osmosis_ai.platform.client.transfer import safe_name, safe_relative

    assert safe_relative("trajectories/row_0_run_0.json").parts == (
        "trajectories",
        "row_0_run_0.json",
    )
    assert safe_name("../../etc/sums.jsonl") == "sums.jsonl"
    assert safe_name("dir\\sums.jsonl") == "sums.jsonl"
    with pytest.raises(UnsafeAnswerError, match=r"bad name: '\.\.'"):
        safe_name("..", "name")


# --- the library sequences, without the CLI ---------------------------------------------------


def test_a_dataset_goes_up_and_comes_back_through_the_library_alone(standin, tmp_path):
    from osmosis_ai.platform.client.datasets import (
        check_dataset_file,
        download_dataset,
        upload_dataset,
    )
    from osmosis_ai.platform.client.errors import AlreadyExistsError, LocalFileError

    token = standin.add_token()
    standin.add_workspace("acme/demo")
    rows = "".join(
        json.dumps({"user_prompt": f"q{i}", "system_prompt": "s", "ground_truth": str(i)}) + "\n"
        for i in range(5)
    )
    source = tmp_path / "sums.jsonl"
    source.write_text(rows)
    with pytest.raises(LocalFileError) as missing:
        check_dataset_file(tmp_path / "absent.jsonl")
    assert missing.value.code == "NOT_FOUND"
    shown: list[tuple[int, str]] = []

    def bar(total: int, description: str):
        import contextlib

        shown.append((total, description))
        return contextlib.nullcontext(None)

    with PlatformClient(standin.url, token, git_identity="acme/demo") as client:
        dataset = check_dataset_file(source)
        record = upload_dataset(client, dataset, progress=bar)
        assert record["status"] == "uploaded" and record["file_name"] == "sums"
        with pytest.raises(AlreadyExistsError) as taken:
            upload_dataset(client, dataset)
        assert taken.value.code == "CONFLICT" and "already exists" in taken.value.message
        done = download_dataset(client, "sums", str(tmp_path / "out") + "/", progress=bar)
        assert done.path == tmp_path / "out" / "sums.jsonl" and done.path.read_text() == rows
        with pytest.raises(AlreadyExistsError):
            download_dataset(client, "sums", str(done.path))
    assert shown == [
        (len(rows), "Uploading sums.jsonl"),
        (len(rows), "Downloading sums.jsonl"),
    ]
