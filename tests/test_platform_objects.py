"""The platform's object store, its signed URLs over real HTTP, and the key files."""

from __future__ import annotations

import os
import socket
import stat
import time
import tracemalloc
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx
import pytest

pytest.importorskip("starlette")

from starlette.routing import Mount, Router

from osmosis_ai.errors import ConfigError
from osmosis_ai.platform.api.objects import CONTENT_TYPE, objects_router
from osmosis_ai.platform.crypto import (
    SECRET_KEY_ENV,
    SecretBox,
    load_or_create_key,
    new_key_text,
    secret_key,
)
from osmosis_ai.platform.objects import (
    InvalidObjectKeyError,
    InvalidUploadPartError,
    ObjectNotFoundError,
    ObjectStore,
    SignatureRejectedError,
    UploadSizeMismatchError,
    UrlSigner,
    check_key,
)
from osmosis_ai.testing.serving import ServerThread


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path):
    return ObjectStore(tmp_path / "objects")


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def signer(tmp_path, clock):
    return UrlSigner(load_or_create_key(tmp_path / "signing.key"), clock=clock)


@pytest.fixture
def server(store, signer):
    app = Router(routes=[Mount("/objects", app=objects_router(store, signer))])
    with ServerThread(app) as running:
        yield running


def staging_files(store):
    return sorted(p.name for p in (store.root / "staging").rglob("*") if p.is_file())


def with_param(url, **changes):
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    query.update(changes)
    return urlunsplit(parts._replace(query=urlencode(query)))


# --- keys -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("", "empty"),
        ("../etc/passwd", "'..'"),
        ("a/../../b", "'..'"),
        ("/etc/passwd", "absolute"),
        ("a//b", "empty path segment"),
        ("a/./b", "'.'"),
        ("a/b/", "empty path segment"),
        ("a\x00b", "NUL"),
        ("a\nb", "control character"),
        ("a\\..\\b", "backslash"),
        ("x" * 1025, "longer than 1024"),
    ],
)
def test_bad_keys_are_refused_with_a_named_error(store, key, reason):
    with pytest.raises(InvalidObjectKeyError, match=reason) as caught:
        store.put(key, b"data")
    assert caught.value.status_code == 400 and caught.value.code == "INVALID_OBJECT_KEY"
    assert not list((store.root / "objects").rglob("*"))


def test_a_symlink_cannot_lead_a_key_out_of_the_store(store, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (store.root / "objects" / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidObjectKeyError, match="outside the object store"):
        store.put("link/escaped.txt", b"x")
    assert not list(outside.iterdir())


def test_check_key_returns_a_normal_key():
    assert check_key("datasets/w/1/data.jsonl") == "datasets/w/1/data.jsonl"


# --- whole objects ----------------------------------------------------------------------


def test_put_open_stat_list_delete(store):
    info = store.put("a/b/one.txt", [b"hello ", b"world"])
    assert (info.key, info.size) == ("a/b/one.txt", 11)
    store.put("a/two.txt", b"2")
    store.put("c.txt", b"3")
    with store.open("a/b/one.txt") as handle:
        assert handle.read() == b"hello world"
    assert [i.key for i in store.list("a")] == ["a/b/one.txt", "a/two.txt"]
    assert [i.key for i in store.list()] == ["a/b/one.txt", "a/two.txt", "c.txt"]
    assert store.delete("a/b/one.txt") is True
    assert store.delete("a/b/one.txt") is False
    assert not (store.root / "objects" / "a" / "b").exists()  # empty folders pruned
    with pytest.raises(ObjectNotFoundError):
        store.open("a/b/one.txt")
    with pytest.raises(ObjectNotFoundError):
        store.stat("a")  # a folder is not an object
    assert store.delete_prefix("a") == 1 and store.exists("c.txt")
    assert staging_files(store) == []


def test_put_replaces_atomically_and_a_failed_put_keeps_the_old_object(store):
    store.put("k.bin", b"old")

    def broken():
        yield b"new data"
        raise OSError("disk went away")

    with pytest.raises(OSError, match="disk went away"):
        store.put("k.bin", broken())
    with store.open("k.bin") as handle:
        assert handle.read() == b"old"
    assert staging_files(store) == []


# --- signed URLs ------------------------------------------------------------------------


def test_signer_accepts_its_own_url_and_refuses_changes(signer, clock):
    query = dict(parse_qsl(signer.query("get", "a/b.txt", {"name": "b.txt"}, expires_in=60)))
    assert signer.verify("get", "a/b.txt", query)["name"] == "b.txt"
    with pytest.raises(SignatureRejectedError, match="not signed for 'put'"):
        signer.verify("put", "a/b.txt", query)
    with pytest.raises(SignatureRejectedError, match="does not match"):
        signer.verify("get", "a/c.txt", query)
    with pytest.raises(SignatureRejectedError, match="does not match"):
        signer.verify("get", "a/b.txt", {**query, "name": "evil.txt"})
    with pytest.raises(SignatureRejectedError, match="does not match"):
        signer.verify("get", "a/b.txt", {**query, "expires": str(int(query["expires"]) + 1)})
    with pytest.raises(SignatureRejectedError, match="does not match"):
        signer.verify("get", "a/b.txt", {**query, "signature": "é" + query["signature"][1:]})
    clock.now += 61
    with pytest.raises(SignatureRejectedError, match="expired") as caught:
        signer.verify("get", "a/b.txt", query)
    assert caught.value.code == "URL_EXPIRED" and caught.value.status_code == 403


def test_another_key_file_signs_differently(tmp_path, clock):
    one = UrlSigner(load_or_create_key(tmp_path / "one.key"), clock=clock)
    two = UrlSigner(load_or_create_key(tmp_path / "two.key"), clock=clock)
    query = dict(parse_qsl(one.query("get", "k", expires_in=60)))
    with pytest.raises(SignatureRejectedError):
        two.verify("get", "k", query)


# --- simple upload over HTTP ------------------------------------------------------------


def simple_url(server, signer, store, key, size, *, expires_in=300):
    upload_id = store.start_upload(key)
    params = {"upload_id": upload_id, "size": str(size), "content_type": CONTENT_TYPE}
    return upload_id, signer.url(server.url, "put", key, params, expires_in=expires_in)


def test_simple_put_then_complete_then_get(server, signer, store):
    body = os.urandom(300_000)
    upload_id, url = simple_url(server, signer, store, "datasets/w/1/data.jsonl", len(body))
    answer = httpx.put(url, content=body, headers={"Content-Type": CONTENT_TYPE})
    assert answer.status_code == 200, answer.text
    assert not store.exists("datasets/w/1/data.jsonl")  # not an object until completed
    info = store.complete_upload(upload_id, size=len(body))
    assert info.size == len(body)
    with store.open(info.key) as handle:
        assert handle.read() == body

    # the upload URL is dead once completed: it cannot replace the object
    again = httpx.put(url, content=b"x" * len(body), headers={"Content-Type": CONTENT_TYPE})
    assert again.status_code == 404 and "completed or aborted" in again.json()["message"]
    with store.open(info.key) as handle:
        assert handle.read() == body

    get_url = signer.url(server.url, "get", info.key, {"name": "data.jsonl"}, expires_in=60)
    download = httpx.get(get_url)
    assert download.status_code == 200 and download.content == body
    assert 'filename="data.jsonl"' in download.headers["content-disposition"]
    partial = httpx.get(get_url, headers={"Range": "bytes=10-19"})
    assert partial.status_code == 206 and partial.content == body[10:20]
    assert staging_files(store) == []


def test_put_needs_the_signed_content_type(server, signer, store):
    _, url = simple_url(server, signer, store, "k.bin", 4)
    answer = httpx.put(url, content=b"abcd", headers={"Content-Type": "text/plain"})
    assert answer.status_code == 403
    body = answer.json()
    assert body["code"] == "SIGNATURE_REJECTED" and "upload_headers" in body["message"]


def test_expired_or_altered_urls_answer_403_with_the_envelope(server, signer, store, clock):
    _, url = simple_url(server, signer, store, "k.bin", 4, expires_in=30)
    altered = with_param(url, size="5")
    answer = httpx.put(altered, content=b"abcde", headers={"Content-Type": CONTENT_TYPE})
    assert answer.status_code == 403
    assert set(answer.json()) >= {"error", "message", "code"}
    assert answer.json()["code"] == "SIGNATURE_REJECTED"

    clock.now += 31
    answer = httpx.put(url, content=b"abcd", headers={"Content-Type": CONTENT_TYPE})
    assert answer.status_code == 403 and answer.json()["code"] == "URL_EXPIRED"

    store.put("real.txt", b"secret")
    get_url = signer.url(server.url, "get", "real.txt", expires_in=60)
    other = get_url.replace("/objects/real.txt", "/objects/other.txt")
    assert httpx.get(other).status_code == 403
    assert httpx.get(with_param(get_url, op="put")).status_code == 403
    unsigned = httpx.get(f"{server.url}/objects/real.txt")
    assert unsigned.status_code == 403


def test_percent_encoded_traversal_is_refused(server, signer, store):
    store.put("inside.txt", b"x")
    for path in ("a/%2e%2e/%2e%2e/etc/passwd", "a%2F..%2F..%2Fetc%2Fpasswd"):
        answer = httpx.get(f"{server.url}/objects/{path}?op=get")
        assert answer.status_code == 400, answer.text
        assert answer.json()["code"] == "INVALID_OBJECT_KEY" and "'..'" in answer.json()["message"]


def test_a_body_longer_than_signed_is_refused_and_nothing_is_kept(server, signer, store):
    upload_id, url = simple_url(server, signer, store, "k.bin", 10)
    answer = httpx.put(url, content=b"x" * 11, headers={"Content-Type": CONTENT_TYPE})
    assert answer.status_code == 400 and answer.json()["code"] == "UPLOAD_SIZE_MISMATCH"

    def chunked():  # no Content-Length: caught while streaming
        yield b"x" * 6
        yield b"x" * 6

    answer = httpx.put(url, content=chunked(), headers={"Content-Type": CONTENT_TYPE})
    assert answer.status_code == 400 and "larger than the 10 bytes" in answer.json()["message"]
    assert staging_files(store) == ["key"]
    with pytest.raises(UploadSizeMismatchError, match="nothing was uploaded"):
        store.complete_upload(upload_id, size=10)


def test_a_truncated_body_is_refused_and_nothing_is_kept(server, signer, store):
    upload_id, url = simple_url(server, signer, store, "k.bin", 10)

    def short():
        yield b"x" * 4

    answer = httpx.put(url, content=short(), headers={"Content-Type": CONTENT_TYPE})
    assert answer.status_code == 400 and "ended after 4 of 10 bytes" in answer.json()["message"]

    # a client that promises 10 bytes, sends 4 and hangs up
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port)) as sock:
        sock.sendall(
            f"PUT {parts.path}?{parts.query} HTTP/1.1\r\nHost: x\r\n"
            f"Content-Type: {CONTENT_TYPE}\r\nContent-Length: 10\r\n\r\nxxxx".encode()
        )
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10)
        while sock.recv(4096):
            pass
    # the server notices the hang-up on its own loop: wait for its clean-up to finish
    deadline = time.monotonic() + 30
    while staging_files(store) != ["key"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert staging_files(store) == ["key"]
    with pytest.raises(UploadSizeMismatchError):
        store.complete_upload(upload_id, size=10)
    assert not store.exists("k.bin")


def test_an_aborted_upload_is_gone(server, signer, store):
    upload_id, url = simple_url(server, signer, store, "k.bin", 4)
    assert store.abort_upload(upload_id) is True
    assert store.abort_upload(upload_id) is False
    answer = httpx.put(url, content=b"abcd", headers={"Content-Type": CONTENT_TYPE})
    assert answer.status_code == 404
    assert staging_files(store) == []


def test_upload_memory_stays_flat(server, signer, store):
    size = 48 * 1024 * 1024
    upload_id, url = simple_url(server, signer, store, "big.bin", size)
    block = b"z" * (1 << 20)

    def body():
        for _ in range(size // len(block)):
            yield block

    tracemalloc.start()
    try:
        answer = httpx.put(url, content=body(), headers={"Content-Type": CONTENT_TYPE})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer.status_code == 200
    assert peak < 12 * 1024 * 1024, f"peak traced memory {peak} for a {size}-byte upload"
    assert store.complete_upload(upload_id, size=size).size == size


# --- multipart over HTTP ----------------------------------------------------------------


def test_multipart_parts_in_any_order_join_in_part_order(server, signer, store):
    chunks = [os.urandom(100_000), os.urandom(100_000), os.urandom(1234)]
    upload_id = store.start_upload("data/multi.bin")
    etags: dict[int, str] = {}
    for number in (3, 1, 2):
        params = {
            "upload_id": upload_id,
            "part_number": str(number),
            "size": str(len(chunks[number - 1])),
        }
        url = signer.url(server.url, "part", "data/multi.bin", params, expires_in=60)
        answer = httpx.put(url, content=chunks[number - 1])
        assert answer.status_code == 200, answer.text
        etags[number] = answer.headers["etag"]
        assert etags[number].startswith('"') and etags[number].endswith('"')

    with pytest.raises(InvalidUploadPartError, match="part 2 does not match"):
        store.complete_upload(upload_id, [(1, etags[1]), (2, etags[1]), (3, etags[3])])
    with pytest.raises(InvalidUploadPartError, match="repeat"):
        store.complete_upload(upload_id, [(1, etags[1]), (1, etags[1])])
    with pytest.raises(UploadSizeMismatchError, match="holds"):
        store.complete_upload(upload_id, [(1, etags[1])], size=201_234)

    shuffled = [(2, etags[2].strip('"')), (3, etags[3]), (1, etags[1])]
    info = store.complete_upload(upload_id, shuffled, size=201_234)
    with store.open(info.key) as handle:
        assert handle.read() == b"".join(chunks)
    assert staging_files(store) == []


def test_resending_a_part_changes_its_etag(server, signer, store):
    upload_id = store.start_upload("p.bin")
    params = {"upload_id": upload_id, "part_number": "1", "size": "4"}
    url = signer.url(server.url, "part", "p.bin", params, expires_in=60)
    first = httpx.put(url, content=b"aaaa").headers["etag"]
    second = httpx.put(url, content=b"bbbb").headers["etag"]
    assert first != second
    with pytest.raises(InvalidUploadPartError, match="stored ETag"):
        store.complete_upload(upload_id, [(1, first)])
    info = store.complete_upload(upload_id, [(1, second)])
    with store.open(info.key) as handle:
        assert handle.read() == b"bbbb"


def test_a_part_url_is_not_a_put_url(server, signer, store):
    upload_id = store.start_upload("p.bin")
    params = {"upload_id": upload_id, "part_number": "1", "size": "4"}
    url = signer.url(server.url, "part", "p.bin", params, expires_in=60)
    answer = httpx.put(with_param(url, op="put"), content=b"aaaa")
    assert answer.status_code == 403
    wrong_size = httpx.put(url, content=b"aaaaa")
    assert wrong_size.status_code == 400


# --- key files and secret encryption ----------------------------------------------------


def test_key_file_is_made_once_with_mode_0600(tmp_path):
    path = tmp_path / "keys" / "signing.key"
    key = load_or_create_key(path)
    assert len(key) == 32 and load_or_create_key(path) == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["signing.key"]


def test_a_damaged_or_exposed_key_file_is_refused(tmp_path):
    path = tmp_path / "signing.key"
    load_or_create_key(path)
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        load_or_create_key(path)
    path.write_bytes(b"short")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="damaged"):
        load_or_create_key(path)


def test_secret_box_round_trip_is_bound_to_its_row(tmp_path):
    box = SecretBox(secret_key(tmp_path, environ={}))
    stored = box.encrypt("sk-live-123", bound_to="row-1")
    assert "sk-live-123" not in stored and stored.startswith("v1.")
    assert box.encrypt("sk-live-123", bound_to="row-1") != stored  # fresh nonce
    assert box.decrypt(stored, bound_to="row-1") == "sk-live-123"
    with pytest.raises(ConfigError, match="does not decrypt") as caught:
        box.decrypt(stored, bound_to="row-2")
    assert "sk-live-123" not in str(caught.value)
    other = SecretBox(secret_key(tmp_path / "elsewhere", environ={}))
    with pytest.raises(ConfigError, match="key changed"):
        other.decrypt(stored, bound_to="row-1")
    assert stat.S_IMODE((tmp_path / "secrets.key").stat().st_mode) == 0o600


def test_secret_key_from_the_environment(tmp_path):
    text = new_key_text()
    box = SecretBox(secret_key(tmp_path, environ={SECRET_KEY_ENV: text}))
    same = SecretBox(secret_key(tmp_path / "x", environ={SECRET_KEY_ENV: text}))
    assert same.decrypt(box.encrypt("v", bound_to="r"), bound_to="r") == "v"
    assert not (tmp_path / "secrets.key").exists()
    with pytest.raises(ConfigError, match="44 characters"):
        secret_key(tmp_path, environ={SECRET_KEY_ENV: "too-short"})


def put_part(server, signer, upload_id, key, number, body, *, offset=None, size=None):
    params = {"upload_id": upload_id, "part_number": str(number), "size": str(size or len(body))}
    if offset is not None:
        params["offset"] = str(offset)
    url = signer.url(server.url, "part", key, params, expires_in=60)
    return httpx.put(url, content=body)


def test_parts_with_offsets_are_written_in_place(server, signer, store):
    chunks = [os.urandom(70_000), os.urandom(70_000), os.urandom(999)]
    offsets = [0, 70_000, 140_000]
    upload_id = store.start_upload("data/placed.bin")
    etags = {}
    for number in (2, 3, 1):
        answer = put_part(
            server, signer, upload_id, "data/placed.bin", number, chunks[number - 1],
            offset=offsets[number - 1],
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        etags[number] = answer.headers["etag"]
    assert not any(p.name.endswith(".part") for p in (store.root / "staging").rglob("*"))

    with pytest.raises(InvalidUploadPartError, match="do not join up"):
        store.complete_upload(upload_id, [(1, etags[1]), (3, etags[3])])
    with pytest.raises(UploadSizeMismatchError, match="declared 5"):
        store.complete_upload(upload_id, list(etags.items()), size=5)
    with pytest.raises(InvalidUploadPartError, match="part 2 does not match"):
        store.complete_upload(upload_id, [(1, etags[1]), (2, etags[3]), (3, etags[3])])

    info = store.complete_upload(upload_id, list(etags.items()), size=140_999)
    with store.open(info.key) as handle:
        assert handle.read() == b"".join(chunks)
    assert staging_files(store) == []


def test_a_truncated_part_in_place_leaves_no_part(server, signer, store):
    upload_id = store.start_upload("p.bin")
    first = put_part(server, signer, upload_id, "p.bin", 1, b"a" * 8, offset=0).headers["etag"]

    def short():
        yield b"b" * 3

    answer = put_part(server, signer, upload_id, "p.bin", 1, short(), offset=0, size=8)
    assert answer.status_code == 400
    with pytest.raises(InvalidUploadPartError, match="never received"):  # the old part is gone too
        store.complete_upload(upload_id, [(1, first)])
    again = put_part(server, signer, upload_id, "p.bin", 1, b"c" * 8, offset=0).headers["etag"]
    info = store.complete_upload(upload_id, [(1, again)], size=8)
    with store.open(info.key) as handle:
        assert handle.read() == b"c" * 8
