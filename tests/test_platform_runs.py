"""Eval and training run submits through the HTTP API, against a real Git repository and a
real database on both dialects: the code resolved by a fetch at submit, the references
checked (dataset, base model, secrets), names, listing, details, stop with roles, logs, and
per-run secret values that are sealed and never answered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError

from osmosis_ai.platform.api.secrets import secret_box
from osmosis_ai.platform.services import runs as run_service
from osmosis_ai.platform.services.models import register_base_model
from osmosis_ai.platform.store.orm import Dataset, Run, RunLog, Workspace
from platform_support import git, write_files

REPO = "acme/agents"
OTHER_REPO = "acme/other"
NAME = re.compile(r"^[a-z]+-[a-z]+-\d{1,2}$")
SECRET_VALUE = "sk-run-only-7d1e4c9b"
SUBMIT_KEYS = {"id", "name", "status", "created_at", "platform_url"}


def commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def origin(tmp_path) -> Path:
    """main: rollouts/alpha (main.py, agent/run.py); feature: also rollouts/beta."""
    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_files(repo, {"rollouts/alpha/main.py": "print('alpha v1')\n", "README.md": "ws\n"})
    commit(repo, "alpha v1")
    write_files(repo, {"rollouts/alpha/main.py": "print('alpha v2')\n"})
    write_files(repo, {"rollouts/alpha/agent/run.py": "print('run')\n"})
    commit(repo, "alpha v2")
    git(repo, "checkout", "-q", "-b", "feature")
    write_files(repo, {"rollouts/beta/main.py": "print('beta')\n"})
    commit(repo, "beta")
    git(repo, "checkout", "-q", "main")
    return repo


class Team:
    def __init__(self, harness, origin: Path, tmp_path: Path) -> None:
        self.harness = harness
        self.origin = origin
        self.workspace_id = harness.workspace("Team", repo=REPO, clone_url=str(origin))
        harness.workspace("Other", repo=OTHER_REPO, clone_url=str(origin))
        self.alice = harness.account("alice@example.com", workspace="Team", role="owner")
        self.bob = harness.account("bob@example.com", workspace="Team", role="member")
        self.carol = harness.account("carol@example.com", workspace="Team", role="admin")
        self.dave = harness.account("dave@example.com", workspace="Team", role="member")
        self.outsider = harness.account("eve@example.com", workspace="Other", role="owner")
        model_dir = tmp_path / "qwen"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps({"_name_or_path": "Qwen/Qwen3-0.6B"}))
        with harness.platform.transaction() as session:
            register_base_model(session, "qwen-small", model_dir)
            for name, status in (("math", "uploaded"), ("draft", "processing")):
                session.add(
                    Dataset(
                        workspace_id=self.workspace_id,
                        file_name=name,
                        extension="jsonl",
                        file_size=10,
                        status=status,
                        row_count=6,
                        created_at=harness.clock.now,
                        updated_at=harness.clock.now,
                    )
                )

    async def call(self, method: str, path: str, account=None, repo: str = REPO, **kwargs):
        account = account or self.alice
        async with self.harness.client() as client:
            return await client.request(method, path, headers=account.headers(repo), **kwargs)


@pytest.fixture
def team(harness, origin, tmp_path):
    return Team(harness, origin, tmp_path)


def eval_body(**experiment) -> dict:
    return {
        "experiment_config": {
            "rollout": "alpha",
            "entrypoint": "main.py",
            "model_path": "openai/gpt-5-mini",
            "dataset": "math",
            **experiment,
        },
        "evaluation_config": {"limit": 3, "n": 2, "pass_threshold": 0.5},
        "env_config": {"MODE": "fast"},
    }


def training_body(**experiment) -> dict:
    return {
        "experiment_config": {
            "rollout": "alpha",
            "entrypoint": "main.py",
            "model_path": "qwen-small",
            "dataset": "math",
            **experiment,
        },
        "training_config": {"lr": 1e-6, "total_epochs": 1, "rollout_batch_size": 8},
        "sampling_config": {"rollout_temperature": 1.0},
        "checkpoints_config": {"checkpoint_save_freq": 20},
        "advanced_config": {"kl_coef": 0.01, "nested": {"a": [1, 2]}},
    }


async def submit(team, kind: str, body: dict, account=None, expect: int = 201):
    path = "/api/cli/eval-runs" if kind == "eval" else "/api/cli/training-runs"
    answer = await team.call("POST", path, account, json=body)
    assert answer.status_code == expect, answer.text
    return answer.json()


# --- submit ----------------------------------------------------------------------------------


async def test_an_eval_submit_is_pending_at_the_default_branch_head(team, origin):
    submitted = await submit(team, "eval", eval_body())
    assert set(submitted) == SUBMIT_KEYS
    assert submitted["status"] == "pending" and NAME.match(submitted["name"])
    assert submitted["created_at"] == "2030-01-01T12:00:00Z"

    detail = (await team.call("GET", f"/api/cli/eval-runs/{submitted['name']}")).json()
    assert detail["eval_run"]["id"] == submitted["id"]
    assert detail["eval_run"]["creator_email"] == "alice@example.com"
    assert detail["branch"] == "main"
    assert detail["commit_sha"] == git(origin, "rev-parse", "main")
    assert detail["entrypoint"] == "main.py"
    assert detail["config"] == {
        "model_path": "openai/gpt-5-mini",
        "limit": 3,
        "n": 2,
        "pass_threshold": 0.5,
    }
    assert detail["env_config"] == {"MODE": "fast"}
    assert detail["dataset"]["name"] == "math" and detail["rollout"]["name"] == "alpha"
    assert detail["rollout"]["id"] is not None  # the Git-sync row of alpha on main
    assert detail["results"] is None and detail["resolved_secret_scopes"] == {}

    by_id = await team.call("GET", f"/api/cli/eval-runs/{submitted['id']}")
    assert by_id.json()["eval_run"]["name"] == submitted["name"]

    listed = (await team.call("GET", "/api/cli/eval-runs")).json()
    assert (listed["total_count"], listed["has_more"], listed["next_offset"]) == (1, False, None)
    item = listed["eval_runs"][0]
    assert item["id"] == submitted["id"] and item["status"] == "pending"
    assert item["model"]["name"] == "openai/gpt-5-mini" and item["dataset"]["name"] == "math"
    assert item["config"]["n"] == 2 and item["creator_name"] == "alice"

    logs = (await team.call("GET", f"/api/cli/eval-runs/{submitted['name']}/logs")).json()
    assert [entry["step"] for entry in logs["logs"]] == ["submit"]
    assert logs["logs"][0]["message"].startswith("Submitted: rollout alpha (main.py) at main@")


async def test_a_training_submit_needs_a_registered_base_model(team):
    submitted = await submit(team, "training", training_body())
    detail = (await team.call("GET", f"/api/cli/training-runs/{submitted['name']}")).json()
    assert detail["training_run"]["status"] == "pending"
    assert detail["training_run"]["current_step"] is None
    block = detail["training_run"]
    assert (block["model_name"], block["dataset_name"], block["rollout_name"]) == (
        "qwen-small",
        "math",
        "alpha",
    )
    assert block["model_id"] == detail["model"]["id"] and block["dataset_id"]
    assert detail["model"]["name"] == "qwen-small" and detail["model"]["id"]
    assert detail["config"] == {
        "model_path": "qwen-small",
        "training": {"lr": 1e-6, "total_epochs": 1, "rollout_batch_size": 8},
        "sampling": {"rollout_temperature": 1.0},
        "checkpoints": {"checkpoint_save_freq": 20},
    }
    assert detail["advanced_config"] == {"kl_coef": 0.01, "nested": {"a": [1, 2]}}
    listed = (await team.call("GET", "/api/cli/training-runs")).json()
    item = listed["training_runs"][0]
    assert item["model"]["model_name"] == "qwen-small" and item["dataset"]["file_name"] == "math"
    assert item["rollout"]["name"] == "alpha" and item["reward"] is None
    by_hf_path = await submit(team, "training", training_body(model_path="Qwen/Qwen3-0.6B"))
    assert by_hf_path["status"] == "pending"

    unknown = await submit(team, "training", training_body(model_path="gpt-9"), expect=404)
    assert unknown["code"] == "MODEL_NOT_FOUND"
    # an eval's model is whatever LiteLLM id it names; it is not looked up
    assert (await submit(team, "eval", eval_body(model_path="anything/goes")))["status"]


@pytest.mark.parametrize("dataset", ["draft", "missing"])
async def test_the_dataset_must_exist_and_be_uploaded(team, dataset):
    refused = await submit(team, "eval", eval_body(dataset=dataset), expect=404)
    assert refused["code"] == "DATASET_NOT_FOUND" and refused["field"] == "dataset"
    assert "osmosis dataset upload" in refused["message"]


async def test_branch_and_pinned_commit_choose_the_code(team, origin):
    on_feature = await submit(team, "eval", eval_body(rollout="beta", branch="feature"))
    detail = (await team.call("GET", f"/api/cli/eval-runs/{on_feature['id']}")).json()
    assert (detail["branch"], detail["commit_sha"]) == (
        "feature",
        git(origin, "rev-parse", "feature"),
    )

    first = git(origin, "rev-list", "--max-parents=0", "main")
    pinned = await submit(team, "eval", eval_body(commit_sha=first[:9].upper()))
    detail = (await team.call("GET", f"/api/cli/eval-runs/{pinned['id']}")).json()
    assert (detail["branch"], detail["commit_sha"]) == (None, first)

    nested = await submit(team, "eval", eval_body(entrypoint="./agent/run.py"))
    detail = (await team.call("GET", f"/api/cli/eval-runs/{nested['id']}")).json()
    assert detail["entrypoint"] == "agent/run.py"


@pytest.mark.parametrize(
    ("experiment", "code", "field"),
    [
        ({"branch": "nope"}, "BRANCH_NOT_FOUND", "experiment_config.branch"),
        ({"commit_sha": "0123456789abcdef"}, "COMMIT_NOT_FOUND", "experiment_config.commit_sha"),
        ({"rollout": "beta"}, "ROLLOUT_NOT_FOUND", "experiment_config.rollout"),
        ({"rollout": "README.md"}, "ROLLOUT_NOT_FOUND", "experiment_config.rollout"),
        ({"entrypoint": "serve.py"}, "ENTRYPOINT_NOT_FOUND", "experiment_config.entrypoint"),
        ({"entrypoint": "agent"}, "ENTRYPOINT_NOT_FOUND", "experiment_config.entrypoint"),
    ],
)
async def test_code_that_is_not_in_the_repository_is_a_named_404(team, experiment, code, field):
    refused = await submit(team, "eval", eval_body(**experiment), expect=404)
    assert (refused["code"], refused["field"]) == (code, field)
    assert REPO in refused["message"]
    with team.harness.platform.read() as session:
        assert session.scalars(select(Run)).all() == []


async def test_beta_on_a_pinned_feature_commit_is_found(team, origin):
    sha = git(origin, "rev-parse", "feature")
    run = await submit(team, "eval", eval_body(rollout="beta", commit_sha=sha))
    detail = (await team.call("GET", f"/api/cli/eval-runs/{run['id']}")).json()
    assert detail["commit_sha"] == sha and detail["rollout"]["id"] is not None


async def test_a_submit_fetches_even_when_a_listing_just_did(team, origin):
    listed = await team.call("GET", "/api/cli/rollouts")
    assert [r["name"] for r in listed.json()["rollouts"]] == ["alpha"]
    write_files(origin, {"rollouts/gamma/main.py": "print('gamma')\n"})
    head = commit(origin, "gamma")
    again = await team.call("GET", "/api/cli/rollouts")
    assert again.json()["sync"]["fetched"] is False  # within the refresh window
    run = await submit(team, "eval", eval_body(rollout="gamma"))
    detail = (await team.call("GET", f"/api/cli/eval-runs/{run['id']}")).json()
    assert detail["commit_sha"] == head


async def test_an_unreachable_repository_is_a_502_and_nothing_is_stored(team, origin, tmp_path):
    origin.rename(tmp_path / "gone")
    refused = await submit(team, "eval", eval_body(), expect=502)
    assert refused["code"] == "GIT_SYNC_FAILED" and REPO in refused["message"]
    with team.harness.platform.read() as session:
        assert session.scalars(select(Run)).all() == []


async def test_a_repository_without_commits_has_no_branch_to_run(harness, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q", "-b", "main")
    team = Team(harness, empty, tmp_path)
    refused = await submit(team, "eval", eval_body(), expect=404)
    assert refused["code"] == "BRANCH_NOT_FOUND" and "push a commit" in refused["message"]


# --- validation ------------------------------------------------------------------------------


async def test_every_problem_of_a_config_is_reported_at_once(team):
    body = eval_body(rollout="../up", entrypoint="/etc/passwd", branch="main", commit_sha="xyz")
    body["experiment_config"]["extra"] = 1
    body["evaluation_config"] = {"limit": 0, "n": True, "typo": 1, "pass_threshold": "high"}
    body["env_config"] = {"lower": "x", "_OSMOSIS_ROLLOUT_PORT": "1", "N": 3, "KEY": "v"}
    body["secrets"] = {"required": ["KEY", "KEY", "bad-name"], "provided": {"OTHER": "v"}}
    refused = await submit(team, "eval", body, expect=400)
    assert refused["code"] == "VALIDATION"
    assert refused["details"]["error"] == "Invalid eval config"
    keys = [issue["key"] for issue in refused["details"]["issues"]]
    assert keys == [
        "experiment_config.extra",
        "experiment_config.rollout",
        "experiment_config.entrypoint",
        "experiment_config.commit_sha",
        "experiment_config.commit_sha",
        "evaluation_config.limit",
        "evaluation_config.n",
        "evaluation_config.typo",
        "evaluation_config.pass_threshold",
        "env_config.lower",
        "env_config._OSMOSIS_ROLLOUT_PORT",
        "env_config.N",
        "secrets.required.KEY",
        "secrets.required.bad-name",
        "secrets.provided.OTHER",
        "env_config.KEY",
    ]
    assert refused["field"] == "experiment_config.extra"


@pytest.mark.parametrize(
    ("kind", "body", "key"),
    [
        ("eval", {"experiment_config": {"rollout": "alpha"}}, "experiment_config.entrypoint"),
        ("training", {**training_body(), "evaluation_config": {}}, "evaluation_config"),
        ("eval", {**eval_body(), "training_config": {"lr": 1}}, "training_config"),
        ("training", {**training_body(), "sampling_config": {"rollout_top_p": 1.5}}, None),
        ("training", {**training_body(), "training_config": {"lr": -1}}, None),
        ("eval", {"evaluation_config": {}}, "experiment_config"),
    ],
)
async def test_bad_bodies_are_400(team, kind, body, key):
    refused = await submit(team, kind, body, expect=400)
    assert refused["code"] == "VALIDATION"
    if key is not None:
        assert key in {issue["key"] for issue in refused["details"]["issues"]}


async def test_nan_in_a_passthrough_section_is_refused(team):
    raw = json.dumps(eval_body()).replace('"fast"}', '"fast"}, "advanced_config": {"x": NaN}')
    async with team.harness.client() as client:
        answer = await client.post(
            "/api/cli/eval-runs",
            content=raw,
            headers={**team.alice.headers(REPO), "Content-Type": "application/json"},
        )
    assert answer.status_code == 400
    assert answer.json()["details"]["issues"][0]["key"] == "advanced_config"


# --- secrets ---------------------------------------------------------------------------------


async def set_secret(team, account, name, value, scope):
    answer = await team.call(
        "POST",
        "/api/cli/environment-secrets",
        account,
        json={"name": name, "value": value, "scope": scope},
    )
    assert answer.status_code == 200, answer.text


async def test_missing_secrets_are_a_400_naming_them(team):
    body = eval_body()
    body["secrets"] = {
        "required": ["OPENAI_API_KEY", "JUDGE_KEY", "GIVEN"],
        "provided": {"GIVEN": "v"},
    }
    await set_secret(team, team.alice, "JUDGE_KEY", "stored", "workspace")
    refused = await submit(team, "eval", body, account=team.bob, expect=400)
    assert refused["code"] == "SECRETS_MISSING"
    assert refused["details"]["missing"] == ["OPENAI_API_KEY"]
    assert "OPENAI_API_KEY" in refused["message"]


async def test_secret_scopes_and_sealed_run_values(team, database_url):
    await set_secret(team, team.alice, "SHARED", "workspace-value", "workspace")
    await set_secret(team, team.alice, "OVERRIDDEN", "workspace-value", "workspace")
    await set_secret(team, team.bob, "OVERRIDDEN", "bob-value", "user")
    await set_secret(team, team.bob, "MINE", "bob-mine", "user")
    body = eval_body()
    body["secrets"] = {
        "required": ["SHARED", "OVERRIDDEN", "MINE", "GIVEN"],
        "provided": {"GIVEN": SECRET_VALUE},
    }
    async with team.harness.client() as client:
        answer = await client.post("/api/cli/eval-runs", json=body, headers=team.bob.headers(REPO))
        assert answer.status_code == 201 and SECRET_VALUE not in answer.text
        run = answer.json()
        pages = [
            await client.get(path, headers=team.bob.headers(REPO))
            for path in (
                f"/api/cli/eval-runs/{run['id']}",
                "/api/cli/eval-runs",
                f"/api/cli/eval-runs/{run['id']}/logs",
            )
        ]
    assert all(page.status_code == 200 and SECRET_VALUE not in page.text for page in pages)
    assert pages[0].json()["resolved_secret_scopes"] == {
        "SHARED": "workspace",
        "OVERRIDDEN": "user_override",
        "MINE": "user",
        "GIVEN": "provided",
    }
    platform = team.harness.platform
    with platform.read() as session:
        stored = session.get(Run, run["id"])
        assert stored is not None and stored.provided_secrets
        assert SECRET_VALUE not in stored.provided_secrets
        assert run_service.run_secret_values(session, stored, box=secret_box(platform)) == {
            "SHARED": "workspace-value",
            "OVERRIDDEN": "bob-value",
            "MINE": "bob-mine",
            "GIVEN": SECRET_VALUE,
        }
        rows = session.execute(text("SELECT * FROM runs")).all()
        assert all(SECRET_VALUE not in str(value) for row in rows for value in row)
    if database_url.startswith("sqlite"):
        platform.database.dispose()
        files = list(team.harness.settings.data_dir.parent.rglob("*.db*"))
        assert files and all(SECRET_VALUE.encode() not in p.read_bytes() for p in files)

    stopped = await team.call("POST", f"/api/cli/eval-runs/{run['name']}/stop", team.bob, json={})
    assert stopped.status_code == 200
    with platform.read() as session:
        after = session.get(Run, run["id"])
        assert after is not None and after.provided_secrets is None  # dropped once it ended


async def test_a_sealed_value_does_not_open_for_another_run(team):
    body = eval_body()
    body["secrets"] = {"required": ["GIVEN"], "provided": {"GIVEN": SECRET_VALUE}}
    first = await submit(team, "eval", body)
    second = await submit(team, "eval", body)
    platform = team.harness.platform
    with platform.transaction() as session:
        a, b = session.get(Run, first["id"]), session.get(Run, second["id"])
        assert a is not None and b is not None
        b.provided_secrets = a.provided_secrets
    from osmosis_ai.errors import ConfigError

    with platform.read() as session:
        moved = session.get(Run, second["id"])
        assert moved is not None
        with pytest.raises(ConfigError) as caught:
            run_service.run_secret_values(session, moved, box=secret_box(platform))
    assert SECRET_VALUE not in str(caught.value)


# --- roles, stop, listing, logs ----------------------------------------------------------------


async def test_who_may_stop_a_run(team):
    bobs = await submit(team, "training", training_body(), account=team.bob)
    path = f"/api/cli/training-runs/{bobs['name']}/stop"
    refused = await team.call("POST", path, team.dave, json={})
    assert refused.status_code == 403 and refused.json()["code"] == "RUN_STOP_FORBIDDEN"
    by_admin = await team.call("POST", path, team.carol, json={})
    assert by_admin.status_code == 200
    assert by_admin.json() == {"id": bobs["id"], "name": bobs["name"], "status": "stopped"}
    again = await team.call("POST", path, team.bob)  # no body, as some clients send
    assert again.status_code == 200 and again.json()["status"] == "stopped"

    own = await submit(team, "eval", eval_body(), account=team.dave)
    assert (await team.call("POST", f"/api/cli/eval-runs/{own['id']}/stop", team.dave)).json()[
        "status"
    ] == "stopped"
    owners = await submit(team, "eval", eval_body(), account=team.dave)
    by_owner = await team.call("POST", f"/api/cli/eval-runs/{owners['id']}/stop", team.alice)
    assert by_owner.status_code == 200

    detail = (await team.call("GET", f"/api/cli/training-runs/{bobs['id']}")).json()
    assert detail["training_run"]["completed_at"] == "2030-01-01T12:00:00Z"
    logs = (await team.call("GET", f"/api/cli/training-runs/{bobs['id']}/logs")).json()
    assert logs["logs"][-1]["message"] == "Stopped by carol@example.com (was pending)"


async def test_a_run_that_ended_cannot_be_stopped(team):
    run = await submit(team, "eval", eval_body())
    with team.harness.platform.transaction() as session:
        stored = session.get(Run, run["id"])
        assert stored is not None
        run_service.finish(stored, "finished", now=team.harness.clock.now)
    refused = await team.call("POST", f"/api/cli/eval-runs/{run['id']}/stop", json={})
    assert refused.status_code == 409 and refused.json()["code"] == "RUN_ALREADY_ENDED"
    with pytest.raises(ValueError, match="queued"):
        run_service.finish(stored, "queued", now=team.harness.clock.now)


async def test_runs_of_one_kind_or_workspace_are_not_seen_from_another(team):
    run = await submit(team, "eval", eval_body())
    as_training = await team.call("GET", f"/api/cli/training-runs/{run['id']}")
    assert as_training.status_code == 404 and as_training.json()["code"] == "RUN_NOT_FOUND"
    assert "osmosis train list" in as_training.json()["message"]
    elsewhere = await team.call("GET", f"/api/cli/eval-runs/{run['id']}", team.outsider, OTHER_REPO)
    assert elsewhere.status_code == 404
    stop = await team.call(
        "POST", f"/api/cli/eval-runs/{run['id']}/stop", team.outsider, OTHER_REPO
    )
    assert stop.status_code == 404
    listed = (await team.call("GET", "/api/cli/eval-runs", team.outsider, OTHER_REPO)).json()
    assert listed["eval_runs"] == [] and listed["total_count"] == 0
    not_member = await team.call("GET", "/api/cli/eval-runs", team.outsider)
    assert not_member.status_code == 404


async def test_lists_page_newest_first(team):
    made = []
    for _ in range(3):
        made.append((await submit(team, "eval", eval_body()))["id"])
        team.harness.clock.advance(seconds=1)
    first = (await team.call("GET", "/api/cli/eval-runs", params={"limit": 2})).json()
    assert [r["id"] for r in first["eval_runs"]] == made[:0:-1]
    assert (first["total_count"], first["has_more"], first["next_offset"]) == (3, True, 2)
    rest = (await team.call("GET", "/api/cli/eval-runs", params={"offset": 2})).json()
    assert [r["id"] for r in rest["eval_runs"]] == made[:1]
    bad = await team.call("GET", "/api/cli/eval-runs", params={"limit": 51})
    assert bad.status_code == 400 and bad.json()["field"] == "limit"


async def test_logs_page_by_cursor_oldest_first(team):
    run = await submit(team, "training", training_body())
    with team.harness.platform.transaction() as session:
        stored = session.get(Run, run["id"])
        assert stored is not None
        for step in range(1, 6):
            run_service.add_log(session, stored, team.harness.clock.now, "train", f"step {step}")
    path = f"/api/cli/training-runs/{run['name']}/logs"
    newest = (await team.call("GET", path, params={"limit": 2})).json()
    assert [e["message"] for e in newest["logs"]] == ["step 4", "step 5"]
    older = (
        await team.call("GET", path, params={"limit": 2, "cursor": newest["next_cursor"]})
    ).json()
    assert [e["message"] for e in older["logs"]] == ["step 2", "step 3"]
    oldest = (
        await team.call("GET", path, params={"limit": 2, "cursor": older["next_cursor"]})
    ).json()
    assert oldest["logs"][0]["step"] == "submit" and oldest["next_cursor"] is None
    forward = (await team.call("GET", path, params={"direction": "newer", "limit": 3})).json()
    assert [e["step"] for e in forward["logs"]] == ["submit", "train", "train"]
    bad = await team.call("GET", path, params={"cursor": "x"})
    assert bad.status_code == 400 and bad.json()["field"] == "cursor"


async def test_names_stay_unique_in_a_crowded_workspace(team, monkeypatch):
    monkeypatch.setattr(run_service, "_ADJECTIVES", ("only",))
    monkeypatch.setattr(run_service, "_ANIMALS", ("one",))
    names = set()
    for _ in range(4):
        names.add((await submit(team, "eval", eval_body()))["name"])
    assert len(names) == 4 and all(n.startswith("only-one-") for n in names)
    with team.harness.platform.transaction() as session:
        stored = session.scalars(select(Run)).first()
        assert stored is not None
        for number in range(100):
            name = f"only-one-{number}"
            if name not in names:
                session.add(
                    Run(
                        **{
                            c.key: getattr(stored, c.key)
                            for c in Run.__table__.columns
                            if c.key not in ("id", "name")
                        },
                        name=name,
                    )
                )
    crowded = await submit(team, "eval", eval_body())
    assert re.match(r"^only-one-\d{1,2}-[0-9a-f]{6}$", crowded["name"])


# --- the store ---------------------------------------------------------------------------------


def stored_run(session, workspace_id: str, **fields) -> Run:
    values = {
        "workspace_id": workspace_id,
        "kind": "eval",
        "name": "calm-otter-1",
        "rollout_name": "alpha",
        "entrypoint": "main.py",
        "commit_sha": "0" * 40,
        "model_path": "m",
        "dataset_name": "d",
        "experiment_config": {},
        "required_secrets": [],
        "secret_scopes": {},
        **fields,
    }
    run = Run(**values)
    session.add(run)
    session.flush()
    return run


@pytest.mark.parametrize(
    ("kind", "status", "ok"),
    [
        ("eval", "queued", False),
        ("eval", "crashed", False),
        ("training", "queued", True),
        ("training", "killed", True),
        ("training", "done", False),
        ("benchmark", "pending", False),
    ],
)
def test_each_kind_keeps_to_its_status_vocabulary(harness, kind, status, ok):
    workspace_id = harness.workspace("Team", repo=REPO)
    if ok:
        with harness.platform.transaction() as session:
            assert stored_run(session, workspace_id, kind=kind, status=status).status == status
        return
    with pytest.raises(IntegrityError), harness.platform.transaction() as session:
        stored_run(session, workspace_id, kind=kind, status=status)


def test_a_name_is_unique_per_workspace_and_logs_go_with_their_run(harness):
    team_id = harness.workspace("Team", repo=REPO)
    other_id = harness.workspace("Other", repo=OTHER_REPO)
    with harness.platform.transaction() as session:
        run = stored_run(session, team_id)
        stored_run(session, other_id)  # the same name in another workspace
        run_service.add_log(session, run, harness.clock.now, "submit", "hello")
    with pytest.raises(IntegrityError), harness.platform.transaction() as session:
        stored_run(session, team_id, kind="training")
    with harness.platform.transaction() as session:
        session.delete(session.get(Workspace, team_id))
    with harness.platform.read() as session:
        assert session.scalars(select(RunLog)).all() == []
        assert [r.workspace_id for r in session.scalars(select(Run))] == [other_id]


async def test_submits_at_once_all_land_with_their_own_names(team):
    import asyncio

    async with team.harness.client() as client:
        answers = await asyncio.gather(
            *(
                client.post(path, json=body, headers=account.headers(REPO))
                for path, body, account in [
                    ("/api/cli/eval-runs", eval_body(), team.alice),
                    ("/api/cli/eval-runs", eval_body(branch="feature"), team.bob),
                    ("/api/cli/training-runs", training_body(), team.carol),
                    ("/api/cli/training-runs", training_body(), team.dave),
                ]
            )
        )
    assert [a.status_code for a in answers] == [201] * 4, [a.text for a in answers]
    assert len({a.json()["name"] for a in answers}) == 4
    with team.harness.platform.read() as session:
        runs = session.scalars(select(Run)).all()
        assert sorted(r.kind for r in runs) == ["eval", "eval", "training", "training"]
        assert {r.status for r in runs} == {"pending"}
