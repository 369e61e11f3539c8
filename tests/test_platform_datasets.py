"""``/api/cli/datasets`` over real HTTP: upload (simple and multipart), processing, list,
detail, download, logs, abort, overwrite, and bad input."""

from __future__ import annotations

import json
import time

import httpx
import pytest

pytest.importorskip("sqlalchemy")

from osmosis_ai.platform.services import datasets as service
from platform_world import OTHER, running_world

ROWS = [
    {"system_prompt": "Be brief.", "user_prompt": f"{i} * 2 = ?", "ground_truth": str(2 * i)}
    for i in range(6)
]


def jsonl(rows) -> bytes:
    return ("\n".join(json.dumps(row) for row in rows) + "\n").encode()


@pytest.fixture
def world(tmp_path, database_url):
    """The platform on SQLite and on PostgreSQL (``database_url`` is parametrized)."""
    with running_world(tmp_path / "data", database_url) as running:
        yield running


@pytest.fixture
def alice(world):
    with world.client("alice") as client:
        yield client


def create(client, name="math", body=b"", extension="jsonl", **extra):
    payload = {"file_name": name, "file_size": len(body), "extension": extension, **extra}
    return client.post("/api/cli/datasets", json=payload)


def put_simple(upload, body):
    return httpx.put(upload["presigned_url"], content=body, headers=upload["upload_headers"])


def upload(client, name="math", body=None, **extra):
    body = jsonl(ROWS) if body is None else body
    created = create(client, name, body, **extra)
    assert created.status_code == 201, created.text
    dataset = created.json()
    assert put_simple(dataset["upload"], body).status_code == 200
    done = client.post(
        f"/api/cli/datasets/{dataset['id']}/complete", json={"file_extension": "jsonl"}
    )
    assert done.status_code == 200, done.text
    return done.json()


def wait_for_status(client, dataset_id, statuses, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        found = client.get(f"/api/cli/datasets/{dataset_id}").json()
        if found["status"] in statuses or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


# --- the happy path ---------------------------------------------------------------------


def test_simple_upload_is_processed_listed_and_downloadable(world, alice):
    body = jsonl(ROWS)
    created = create(alice, "math", body)
    assert created.status_code == 201
    dataset = created.json()
    assert dataset["status"] == "uploading" and dataset["file_name"] == "math"
    assert dataset["creator_name"] == "Alice" and dataset["original_file_format"] == "jsonl"
    plan = dataset["upload"]
    assert plan["method"] == "simple" and plan["expires_in"] > 0
    assert plan["upload_headers"] == {"Content-Type": "application/octet-stream"}
    assert plan["presigned_url"].startswith(world.url + "/objects/")
    assert set(plan) == {"method", "presigned_url", "upload_headers", "expires_in"}

    assert put_simple(plan, body).status_code == 200
    done = alice.post(
        f"/api/cli/datasets/{dataset['id']}/complete", json={"file_extension": "jsonl"}
    )
    assert done.status_code == 200, done.text
    ready = done.json()
    assert ready["status"] == "uploaded"
    assert ready["row_count"] == 6 and ready["file_format"] == "jsonl"
    assert ready["data_preview"] == ROWS
    assert ready["file_size"] == ready["original_file_size"] == len(body)
    assert set(ready) >= {
        "id", "file_name", "file_size", "status", "data_preview", "file_format",
        "original_file_format", "row_count", "original_file_size", "creator_name",
        "created_at", "updated_at", "platform_url",
    }  # fmt: skip

    by_name = alice.get("/api/cli/datasets/math").json()
    assert by_name["id"] == dataset["id"]
    page = alice.get("/api/cli/datasets").json()
    assert [d["id"] for d in page["datasets"]] == [dataset["id"]]
    assert (page["total_count"], page["has_more"], page["next_offset"]) == (1, False, None)
    listed = page["datasets"][0]
    assert listed == {**by_name, "data_preview": None}  # a list item is the detail less preview

    info = alice.get("/api/cli/datasets/math/download").json()
    assert info["file_name"] == "math.jsonl" and info["expires_in"] > 0
    download = httpx.get(info["presigned_url"])
    assert download.status_code == 200 and download.content == body

    logs = alice.get("/api/cli/datasets/math/logs").json()
    steps = [(entry["step"], entry["level"]) for entry in logs["logs"]]
    assert steps[0] == ("upload", "info") and steps[-1] == ("processing", "info")
    assert "Ready: 6 rows" in logs["logs"][-1]["message"]
    assert logs["next_cursor"] is None


def test_completing_twice_answers_the_dataset_as_it_is(alice):
    dataset = upload(alice)
    again = alice.post(f"/api/cli/datasets/{dataset['id']}/complete", json={})
    assert again.status_code == 200 and again.json()["status"] == "uploaded"


def test_a_large_file_is_processed_after_complete_answers(alice, monkeypatch):
    monkeypatch.setattr(service, "INLINE_PROCESSING_BYTES", 0)
    body = jsonl(ROWS)
    dataset = create(alice, "later", body).json()
    put_simple(dataset["upload"], body)
    done = alice.post(f"/api/cli/datasets/{dataset['id']}/complete", json={})
    assert done.json()["status"] in ("processing", "uploaded")
    assert wait_for_status(alice, dataset["id"], {"uploaded", "error"})["status"] == "uploaded"


def test_multipart_upload_with_etags(alice, monkeypatch):
    monkeypatch.setattr(service, "MULTIPART_THRESHOLD", 100)
    monkeypatch.setattr(service, "PART_SIZE", 200)
    body = jsonl(ROWS)
    dataset = create(alice, "parts", body).json()
    plan = dataset["upload"]
    assert plan["method"] == "multipart" and plan["part_size"] == 200
    assert plan["total_parts"] == len(plan["presigned_urls"]) == -(-len(body) // 200)
    parts = []
    for entry in plan["presigned_urls"]:
        number = entry["part_number"]
        chunk = body[(number - 1) * 200 : number * 200]
        assert entry["size"] == len(chunk)
        answer = httpx.put(entry["presigned_url"], content=chunk)
        assert answer.status_code == 200, answer.text
        parts.append({"PartNumber": number, "ETag": answer.headers["etag"].strip('"')})

    wrong = [dict(part, ETag="0" * 32) if part["PartNumber"] == 1 else part for part in parts]
    refused = alice.post(f"/api/cli/datasets/{dataset['id']}/complete", json={"parts": wrong})
    assert refused.status_code == 400 and refused.json()["code"] == "INVALID_PART"
    missing = alice.post(f"/api/cli/datasets/{dataset['id']}/complete", json={"parts": parts[1:]})
    assert missing.status_code == 400 and missing.json()["field"] == "parts"
    assert alice.get(f"/api/cli/datasets/{dataset['id']}").json()["status"] == "uploading"

    done = alice.post(f"/api/cli/datasets/{dataset['id']}/complete", json={"parts": parts[::-1]})
    assert done.status_code == 200, done.text
    assert done.json()["status"] == "uploaded" and done.json()["row_count"] == 6
    info = alice.get(f"/api/cli/datasets/{dataset['id']}/download").json()
    assert httpx.get(info["presigned_url"]).content == body


# --- names, conflicts, overwrite ---------------------------------------------------------


def test_duplicate_name_conflicts_and_overwrite_replaces(world, alice):
    first = upload(alice, "math")
    conflict = create(alice, "math", jsonl(ROWS))
    assert conflict.status_code == 409
    error = conflict.json()
    assert error["code"] == "DATASET_EXISTS"
    assert error["details"]["existing_dataset_id"] == first["id"]
    assert error["existing_dataset_id"] == first["id"]  # where older CLIs look

    rows = [*ROWS, {"system_prompt": "", "user_prompt": "one more", "ground_truth": "1"}]
    second = upload(alice, "math", jsonl(rows), overwrite_dataset_id=first["id"])
    assert second["status"] == "uploaded" and second["row_count"] == 7
    page = alice.get("/api/cli/datasets").json()
    assert [d["id"] for d in page["datasets"]] == [second["id"]]
    assert alice.get(f"/api/cli/datasets/{first['id']}").status_code == 404
    objects = world.settings.objects_dir / "objects" / "datasets"
    assert [p.parent.name for p in objects.rglob("*.jsonl")] == [second["id"]]


def test_overwrite_keeps_the_old_dataset_until_the_new_one_is_ready(alice):
    first = upload(alice, "math")
    bad = upload(alice, "math", jsonl(ROWS[:2]), overwrite_dataset_id=first["id"])
    assert bad["status"] == "error"
    assert alice.get(f"/api/cli/datasets/{first['id']}").json()["status"] == "uploaded"
    assert alice.get("/api/cli/datasets").json()["total_count"] == 2


def test_overwrite_of_an_unknown_id_is_refused(alice):
    answer = create(alice, "fresh", jsonl(ROWS), overwrite_dataset_id="nope")
    assert answer.status_code == 404 and answer.json()["field"] == "overwrite_dataset_id"


@pytest.mark.parametrize(
    "name", ["../escape", "a/b", "..", "a\\b", "tab\there", " padded", "x" * 201, ""]
)
def test_bad_names_are_refused(world, alice, name):
    answer = create(alice, name, b"abc")
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == "file_name"
    assert not list((world.settings.objects_dir / "staging" / "uploads").iterdir())


# --- failures ---------------------------------------------------------------------------


def test_an_invalid_file_ends_in_error_with_its_reasons_in_the_logs(alice):
    bad = jsonl([{"user_prompt": "no answer"} for _ in range(5)])
    dataset = upload(alice, "broken", bad)
    assert dataset["status"] == "error" and dataset["row_count"] is None
    assert dataset["data_preview"] is None
    logs = alice.get("/api/cli/datasets/broken/logs").json()["logs"]
    errors = [entry for entry in logs if entry["level"] == "error"]
    assert any("ground_truth" in entry["message"] for entry in errors)
    assert errors[-1]["details"]["errors"] and errors[-1]["step"] == "validation"
    refused = alice.get("/api/cli/datasets/broken/download")
    assert refused.status_code == 409 and refused.json()["code"] == "DATASET_NOT_READY"


def test_a_body_larger_than_declared_is_refused_and_complete_says_so(alice):
    body = jsonl(ROWS)
    dataset = create(alice, "math", body).json()
    answer = put_simple(dataset["upload"], body + b"extra")
    assert answer.status_code == 400 and answer.json()["code"] == "UPLOAD_SIZE_MISMATCH"
    done = alice.post(f"/api/cli/datasets/{dataset['id']}/complete", json={})
    assert done.status_code == 400 and "nothing was uploaded" in done.json()["message"]
    assert alice.get(f"/api/cli/datasets/{dataset['id']}").json()["status"] == "uploading"


def test_abort_cancels_and_frees_the_name(alice):
    body = jsonl(ROWS)
    dataset = create(alice, "math", body).json()
    aborted = alice.post(f"/api/cli/datasets/{dataset['id']}/abort", json={})
    assert aborted.status_code == 200 and aborted.json()["status"] == "cancelled"
    assert alice.post(f"/api/cli/datasets/{dataset['id']}/abort", json={}).status_code == 200
    assert put_simple(dataset["upload"], body).status_code == 404
    done = alice.post(f"/api/cli/datasets/{dataset['id']}/complete", json={})
    assert done.status_code == 409
    assert create(alice, "math", body).status_code == 201


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"file_name": "a", "file_size": 10, "extension": "txt"}, "extension"),
        ({"file_name": "a", "file_size": 0, "extension": "csv"}, "file_size"),
        ({"file_name": "a", "file_size": 6 * 1024**3, "extension": "csv"}, "file_size"),
        ({"file_name": "a", "file_size": "10", "extension": "csv"}, "file_size"),
        ({"file_name": "a", "file_size": 10, "extension": "csv", "colour": "red"}, "colour"),
        ({"file_size": 10, "extension": "csv"}, "file_name"),
    ],
)
def test_bad_create_bodies_are_400_with_the_field(alice, payload, field):
    answer = alice.post("/api/cli/datasets", json=payload)
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == field and answer.json()["code"] == "VALIDATION"


def test_malformed_json_is_400(alice):
    answer = alice.post(
        "/api/cli/datasets", content=b'{"file_name": ', headers={"Content-Type": "application/json"}
    )
    assert answer.status_code == 400 and answer.json()["code"] == "VALIDATION"
    bad_parts = alice.post("/api/cli/datasets/x/complete", json={"parts": [{"PartNumber": 1}]})
    assert bad_parts.status_code == 400


def test_another_workspace_sees_nothing(world, alice):
    dataset = upload(alice, "math")
    with world.client("alice", repo=OTHER) as other:
        assert other.get("/api/cli/datasets").json()["datasets"] == []
        for path in ("", "/download", "/logs"):
            answer = other.get(f"/api/cli/datasets/{dataset['id']}{path}")
            assert answer.status_code == 404 and answer.json()["code"] == "DATASET_NOT_FOUND"
        assert other.post(f"/api/cli/datasets/{dataset['id']}/abort", json={}).status_code == 404
        assert create(other, "math", jsonl(ROWS)).status_code == 201  # names are per workspace
    with world.client("bob") as bob:  # another member of the same workspace sees it
        assert bob.get("/api/cli/datasets/math").json()["id"] == dataset["id"]


# --- pagination -------------------------------------------------------------------------


def test_list_pages_by_offset(alice):
    ids = [create(alice, f"d{i}", b"x" * 10).json()["id"] for i in range(7)]
    first = alice.get("/api/cli/datasets", params={"limit": 3}).json()
    assert [d["id"] for d in first["datasets"]] == ids[::-1][:3]
    assert (first["total_count"], first["has_more"], first["next_offset"]) == (7, True, 3)
    last = alice.get("/api/cli/datasets", params={"limit": 3, "offset": 6}).json()
    assert [d["id"] for d in last["datasets"]] == [ids[0]]
    assert (last["has_more"], last["next_offset"]) == (False, None)
    for params in ({"limit": 51}, {"limit": 0}, {"offset": -1}):
        answer = alice.get("/api/cli/datasets", params=params)
        assert answer.status_code == 400 and answer.json()["field"] in params


def test_a_page_past_the_end_is_empty_and_still_counts(alice):
    for i in range(3):
        create(alice, f"d{i}", b"x" * 10)
    past = alice.get("/api/cli/datasets", params={"limit": 2, "offset": 5}).json()
    assert (past["datasets"], past["total_count"], past["has_more"]) == ([], 3, False)
    assert past["next_offset"] is None


def test_logs_page_by_cursor_in_both_directions(alice):
    upload(alice, "math")
    everything = alice.get("/api/cli/datasets/math/logs", params={"limit": 200}).json()["logs"]
    messages = [entry["message"] for entry in everything]
    assert len(messages) >= 4

    newest = alice.get("/api/cli/datasets/math/logs", params={"limit": 2}).json()
    assert [e["message"] for e in newest["logs"]] == messages[-2:]
    older = alice.get(
        "/api/cli/datasets/math/logs", params={"limit": 2, "cursor": newest["next_cursor"]}
    ).json()
    assert [e["message"] for e in older["logs"]] == messages[-4:-2]

    walked: list[str] = []
    cursor = None
    while True:
        params = {"limit": 1, "direction": "newer"} | ({"cursor": cursor} if cursor else {})
        page = alice.get("/api/cli/datasets/math/logs", params=params).json()
        walked += [e["message"] for e in page["logs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert walked == messages

    for params in ({"cursor": "abc"}, {"direction": "sideways"}, {"limit": 201}):
        answer = alice.get("/api/cli/datasets/math/logs", params=params)
        assert answer.status_code == 400 and answer.json()["field"] in params


def test_no_token_or_no_workspace_header(world):
    assert httpx.get(f"{world.url}/api/cli/datasets").status_code == 401
    with world.client("alice", repo=None) as client:
        answer = client.get("/api/cli/datasets")
        assert answer.status_code == 400 and answer.json()["code"] == "GIT_SCOPE_HEADER_REQUIRED"


def test_a_restarted_server_finishes_datasets_left_processing(world, alice):
    from sqlalchemy import update

    from osmosis_ai.platform.api.app import create_platform_app
    from osmosis_ai.platform.store.orm import Dataset
    from osmosis_ai.testing.serving import ServerThread

    dataset = upload(alice, "math")
    with world.database.transaction() as session:  # as if the server stopped mid-processing
        session.execute(
            update(Dataset)
            .where(Dataset.id == dataset["id"])
            .values(status="processing", row_count=None, data_preview=None)
        )
    restarted = create_platform_app(world.settings, database=world.database)
    with ServerThread(restarted):
        pass  # start-up and shut-down: shut-down waits for the resumed processing
    found = alice.get(f"/api/cli/datasets/{dataset['id']}").json()
    assert found["status"] == "uploaded" and found["row_count"] == 6


def test_an_upload_abandoned_long_ago_is_cancelled_and_its_data_dropped(world, alice):
    from datetime import timedelta

    from sqlalchemy import update

    from osmosis_ai.platform.store.orm import Upload, utcnow

    body = jsonl(ROWS)
    old = create(alice, "abandoned", body).json()
    assert put_simple(old["upload"], body).status_code == 200
    uploads = world.settings.objects_dir / "staging" / "uploads"
    [old_folder] = list(uploads.iterdir())
    with world.database.transaction() as session:
        long_ago = utcnow() - service.STALE_UPLOAD_GRACE - timedelta(hours=2)
        session.execute(
            update(Upload).where(Upload.dataset_id == old["id"]).values(expires_at=long_ago)
        )
    fresh = create(alice, "fresh", body).json()  # any create in the workspace sweeps
    assert alice.get(f"/api/cli/datasets/{old['id']}").json()["status"] == "cancelled"
    remaining = list(uploads.iterdir())  # the fresh upload's folder only
    assert len(remaining) == 1 and remaining[0] != old_folder
    assert alice.get(f"/api/cli/datasets/{fresh['id']}").json()["status"] == "uploading"
    logs = alice.get("/api/cli/datasets/abandoned/logs").json()["logs"]
    assert "expired" in logs[-1]["message"]
