"""Compatibility tier: the original osmosis-ai CLI (0.3.8) runs its dataset, secret and model
commands against our platform, unmodified, over real HTTP.

Needs ``OSMOSIS_COMPAT_PYTHON``: an interpreter with the original build installed (its
``osmosis`` script next to it), e.g. ``python3.12 -m venv /tmp/orig && /tmp/orig/bin/pip
install "osmosis-ai==0.3.8"``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy")

from osmosis_ai.platform.services import datasets as datasets_service
from osmosis_ai.platform.services.models import register_base_model
from platform_support import run_original
from platform_world import TEAM, running_world

COMPAT_PYTHON = os.environ.get("OSMOSIS_COMPAT_PYTHON", "")

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        not COMPAT_PYTHON,
        reason="compat tier: set OSMOSIS_COMPAT_PYTHON to an interpreter with the original "
        "osmosis-ai 0.3.8 installed",
    ),
]

ROWS = [
    {"system_prompt": "Be brief.", "user_prompt": f"{i} * 2 = ?", "ground_truth": str(2 * i)}
    for i in range(6)
]
SECRET_VALUE = "sk-compat-value-91c2"


def workspace_dir(root: Path) -> Path:
    root.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    origin = f"https://github.com/{TEAM}.git"
    subprocess.run(["git", "remote", "add", "origin", origin], cwd=root, check=True)
    for folder in ("rollouts", "configs/training", "configs/eval", "data"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    (root / "data" / ".gitkeep").touch()
    lines = [json.dumps(row) for row in ROWS]
    (root / "data" / "math.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.mark.timeout(300)
def test_original_cli_dataset_secret_and_model_commands(tmp_path, monkeypatch):
    original = Path(COMPAT_PYTHON).parent / "osmosis"
    assert original.exists(), f"no osmosis script next to {COMPAT_PYTHON}"
    workspace = workspace_dir(tmp_path / "ws")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"_name_or_path": "Qwen/Qwen3-0.6B"}))
    with running_world(tmp_path / "data") as world:
        with world.database.transaction() as session:
            register_base_model(session, "qwen-small", model)
        env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
        env |= {
            "OSMOSIS_PLATFORM_URL": world.url,
            "OSMOSIS_TOKEN": world.tokens["alice"],
            "OSMOSIS_TOKEN_PLATFORM_URL": world.url,
            "HOME": str(tmp_path / "home"),
            "NO_COLOR": "1",
            "MY_SECRET": SECRET_VALUE,
        }

        def run(*args: str) -> dict:
            return run_original(original, workspace, env, SECRET_VALUE, *args)

        first = run("dataset", "upload", "data/math.jsonl", "-y")
        assert first["rc"] == 0 and first["resource"]["status"] == "uploaded", first
        assert first["resource"]["row_count"] == 6
        conflict = run("dataset", "upload", "data/math.jsonl", "-y")
        assert conflict["rc"] == 1 and conflict["error"]["code"] == "CONFLICT"
        replaced = run("dataset", "upload", "data/math.jsonl", "-y", "--overwrite")
        assert replaced["rc"] == 0 and replaced["resource"]["id"] != first["resource"]["id"]

        # the original's multipart path: parts PUT on their URLs, ETags sent back on complete
        monkeypatch.setattr(datasets_service, "MULTIPART_THRESHOLD", 100)
        monkeypatch.setattr(datasets_service, "PART_SIZE", 128)
        (workspace / "data" / "parts.jsonl").write_bytes(
            (workspace / "data" / "math.jsonl").read_bytes()
        )
        multipart = run("dataset", "upload", "data/parts.jsonl", "-y")
        assert multipart["rc"] == 0 and multipart["resource"]["status"] == "uploaded", multipart
        monkeypatch.undo()
        started = run("dataset", "logs", "parts")["items"][0]["message"]
        assert "multipart" in started, started

        listed = run("dataset", "list")
        assert {d["file_name"] for d in listed["items"]} == {"math", "parts"}
        assert replaced["resource"]["id"] in {d["id"] for d in listed["items"]}
        preview = run("dataset", "preview", "math", "--rows", "2")
        assert preview["data"]["rows"] == ROWS[:2]
        logs = run("dataset", "logs", "math")
        assert logs["items"][-1]["message"].startswith("Ready: 6 rows")
        target = tmp_path / "back.jsonl"
        run("dataset", "download", "math", "-o", str(target))
        assert target.read_bytes() == (workspace / "data" / "math.jsonl").read_bytes()

        saved = run("secret", "set", "OPENAI_API_KEY", "--env", "MY_SECRET")
        assert saved["rc"] == 0 and saved["resource"]["scope"] == "personal"
        secrets = run("secret", "list")
        assert [s["name"] for s in secrets["items"]] == ["OPENAI_API_KEY"]
        assert run("secret", "delete", "OPENAI_API_KEY", "-y")["rc"] == 0

        models = run("model", "list")
        assert [m["model_name"] for m in models["base_models"]["items"]] == ["qwen-small"]
        assert models["lora_models"]["items"] == []
        assert run("model", "info", "nope")["error"]["code"] == "NOT_FOUND"
