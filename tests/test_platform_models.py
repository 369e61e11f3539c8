"""``/api/cli/models`` over real HTTP: base models (list, detail by name or Hugging Face
path) and LoRA models (empty until training makes some, with the deployment quota)."""

from __future__ import annotations

import json
from urllib.parse import quote

import pytest

pytest.importorskip("sqlalchemy")

from osmosis_ai.platform.services.models import MAX_ACTIVE_DEPLOYMENTS, register_base_model
from osmosis_ai.platform.store.orm import Model
from platform_world import OTHER, running_world


@pytest.fixture
def world(tmp_path, database_url):
    with running_world(tmp_path / "data", database_url) as running:
        yield running


def model_dir(root, origin, context=4096):
    root.mkdir(parents=True)
    config = {"_name_or_path": origin, "max_position_embeddings": context}
    (root / "config.json").write_text(json.dumps(config))
    return root


def test_base_models_list_and_detail(world, tmp_path):
    with world.database.transaction() as session:
        register_base_model(session, "qwen-small", model_dir(tmp_path / "a", "Qwen/Qwen3-0.6B"))
        register_base_model(session, "tiny", model_dir(tmp_path / "b", "/local/tiny", 512))
        register_base_model(session, "zeta", model_dir(tmp_path / "c", "Org/Zeta"))
        session.add(
            Model(
                kind="base",
                name="others-only",
                path=str(tmp_path / "c"),
                workspace_id=world.workspace_ids["other"],
            )
        )
    with world.client() as alice:
        page = alice.get("/api/cli/models/base", params={"limit": 2}).json()
        assert [m["model_name"] for m in page["models"]] == ["qwen-small", "tiny"]
        assert (page["total_count"], page["has_more"], page["next_offset"]) == (3, True, 2)
        assert set(page["models"][0]) == {
            "id", "model_name", "base_model", "creator_name", "created_at", "updated_at",
        }  # fmt: skip
        assert page["models"][0]["base_model"] == "Qwen/Qwen3-0.6B"

        detail = alice.get("/api/cli/models/base/qwen-small").json()
        assert detail["namespace"] == "Qwen" and detail["context_window"] == 4096
        assert detail["hf_url"] == "https://huggingface.co/Qwen/Qwen3-0.6B"
        by_path = alice.get(f"/api/cli/models/base/{quote('Qwen/Qwen3-0.6B', safe='')}")
        assert by_path.status_code == 200 and by_path.json()["id"] == detail["id"]
        local = alice.get("/api/cli/models/base/tiny").json()
        assert local["hf_url"] is None and local["context_window"] == 512

        hidden = alice.get("/api/cli/models/base/others-only")
        assert hidden.status_code == 404 and hidden.json()["code"] == "MODEL_NOT_FOUND"
    with world.client("alice", repo=OTHER) as other:
        names = [m["model_name"] for m in other.get("/api/cli/models/base").json()["models"]]
        assert names == ["others-only", "qwen-small", "tiny", "zeta"]


def test_lora_models_are_empty_until_training_makes_some(world):
    with world.client() as alice:
        page = alice.get("/api/cli/models/lora").json()
        assert page == {
            "models": [],
            "total_count": 0,
            "has_more": False,
            "next_offset": None,
            "active_deployments": 0,
            "max_active_deployments": MAX_ACTIVE_DEPLOYMENTS,
        }
        missing = alice.get("/api/cli/models/nope")
        assert missing.status_code == 404 and "model list --type lora" in missing.json()["message"]


def test_a_lora_model_of_the_workspace_is_listed_with_its_detail(world, tmp_path):
    with world.database.transaction() as session:
        register_base_model(session, "base", model_dir(tmp_path / "a", "Qwen/Qwen3-0.6B"))
        register_base_model(session, "qwen-base", model_dir(tmp_path / "b", "Qwen/Qwen3-1B"))
        session.add(
            Model(
                kind="lora",
                name="run-1-step-10",
                path=str(tmp_path / "a"),
                base_model="base",
                workspace_id=world.workspace_ids["team"],
            )
        )
    with world.client() as alice:
        page = alice.get("/api/cli/models/lora").json()
        assert [m["model_name"] for m in page["models"]] == ["run-1-step-10"]
        assert page["models"][0]["deployment_status"] == "inactive"
        detail = alice.get("/api/cli/models/run-1-step-10").json()
        assert detail["base_model"] == "base" and "inference_model" in detail
        # a base model asked for as a LoRA model: 404 that says what it is
        not_lora = alice.get("/api/cli/models/qwen-base")
        assert not_lora.status_code == 404
        assert "is a base model" in not_lora.json()["message"]
        # /models/base stays the list even with a base model named "base"
        assert "models" in alice.get("/api/cli/models/base").json()
        assert alice.get("/api/cli/models/base/base").json()["model_name"] == "base"
    with world.client("alice", repo=OTHER) as other:
        assert other.get("/api/cli/models/lora").json()["models"] == []
        assert other.get("/api/cli/models/run-1-step-10").status_code == 404


def test_bad_paging_is_400(world):
    with world.client() as alice:
        for path in ("/api/cli/models/base", "/api/cli/models/lora"):
            answer = alice.get(path, params={"limit": 100})
            assert answer.status_code == 400 and answer.json()["field"] == "limit"
