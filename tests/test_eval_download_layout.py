"""What ``osmosis eval download`` adds to the platform's files so the folder has the layout of
a local run (reference §5.6), and which existing ``metrics.json`` it may refresh."""

from __future__ import annotations

import json
import re
from pathlib import Path

from osmosis_ai.platform.client.eval_runs import own_metrics, write_local_layout

RECORD = {
    "id": "2e8feb14-b342-45ed-804a-58aa4098963a",
    "name": "bold-narwhal-44",
    "created_at": "2026-12-02T07:02:51Z",
    "model_name": "openai/gpt-5-mini",
    "dataset_name": "multiply",
    "rollout_name": "multiply-local-openai",
    "results": {"rows": 2, "dataset_rows": 20, "total_runs": 2, "sampled_rows": 2},
}
DETAIL = {
    "entrypoint": "main.py",
    "branch": "main",
    "commit_sha": "81386fdb66eec02e7a277413793de64653f035cf",
    "env_config": {"OPENAI_BASE_URL": "http://127.0.0.1:8000/v1"},
    "config": {"n": 1},
    "resolved_secret_scopes": {"OPENAI_API_KEY": "provided"},
}
INDEX = (
    '{"duration_ms":812,"reward":1.0,"rollout_id":"a1","row_index":0,"run_index":0,'
    '"status":"success","tokens":800,"trajectory_filename":"trajectory.json"}\n'
    '{"duration_ms":90,"error_type":"timeout","rollout_id":"b2","row_index":1,"run_index":0,'
    '"status":"failed"}\n'
)


def test_a_download_gets_index_events_progress_and_manifest(tmp_path: Path):
    (tmp_path / "summary.jsonl").write_text(INDEX)
    assert write_local_layout(tmp_path, RECORD, DETAIL) == 4
    assert (tmp_path / "index.jsonl").read_text() == INDEX
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert events[0] == {
        "row_index": 0, "run_index": 0, "rollout_id": "a1", "status": "success",
        "reward": 1.0, "tokens": 800, "duration_ms": 812,
    }  # fmt: skip
    assert events[1]["error_type"] == "timeout" and "reward" not in events[1]
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress == {"total_runs": 2, "sampled_rows": 2, "total_dataset_rows": 20}
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert re.fullmatch(r"[0-9a-f]{32}", manifest["local_run_id"])
    assert manifest["run_name"] == "bold-narwhal-44"
    assert manifest["inputs"]["model_path"] == "openai/gpt-5-mini"
    assert manifest["inputs"]["secret_names"] == ["OPENAI_API_KEY"]
    assert manifest["provenance"]["source"] == "platform"
    assert manifest["provenance"]["config_commit_sha"] == DETAIL["commit_sha"]


def test_without_the_sample_index_nothing_is_added(tmp_path: Path):
    assert write_local_layout(tmp_path, RECORD, DETAIL) == 0
    assert list(tmp_path.iterdir()) == []


def test_only_this_runs_metrics_json_is_refreshed_without_overwrite(tmp_path: Path):
    metrics = tmp_path / "metrics.json"
    metrics.write_text(json.dumps({"eval_run": {"id": RECORD["id"]}, "summary": {}}))
    assert own_metrics("metrics.json", metrics, RECORD["id"])
    assert not own_metrics("metrics.json", metrics, "another-run")
    assert not own_metrics("summary.jsonl", metrics, RECORD["id"])
    metrics.write_text("not json")
    assert not own_metrics("metrics.json", metrics, RECORD["id"])
