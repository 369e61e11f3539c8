"""The CLI's platform commands against a stand-in platform on 127.0.0.1: auth, datasets,
secrets, models, rollouts, and the submit flow, through ``osmosis ... --json``."""

from __future__ import annotations

import json

import pytest

import platform_cli_support as support
from cli_support import check_golden, invoke
from osmosis_ai.cli import records
from osmosis_ai.platform.client.credentials import credentials_path
from platform_cli_support import IDENTITY, git

standin, home, workspace, platform_env = (
    support.standin,
    support.home,
    support.workspace,
    support.platform_env,
)

ROWS = [{"user_prompt": f"{i} * 2 = ?", "ground_truth": str(i * 2)} for i in range(6)]


def write_jsonl(path, rows=ROWS):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# --- auth -------------------------------------------------------------------------------------


def test_whoami_names_the_workspace_of_the_origin(capsys, platform_env, tmp_path, monkeypatch):
    result = invoke(capsys, "auth", "whoami", "--json")
    assert result.code == 0, result.err
    data = result.json()["data"]
    assert data["email"] == "ada@example.com"
    assert data["source"] == "environment" and data["persistent_login"] is False
    assert data["workspace"]["name"] == "demo" and data["workspace"]["role"] == "owner"
    assert data["platform_url"] == platform_env.url
    verify = platform_env.of("GET", "/api/cli/verify")[-1]
    assert verify.headers["x-osmosis-git"] == IDENTITY
    monkeypatch.chdir(tmp_path)  # outside the workspace: no scope, no workspace
    outside = invoke(capsys, "auth", "whoami", "--json").json()["data"]
    assert outside["workspace"] is None
    assert "x-osmosis-git" not in platform_env.of("GET", "/api/cli/verify")[-1].headers


def test_login_with_token_saves_it_and_logout_revokes_it(capsys, standin, home, monkeypatch):
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", standin.url)
    first, second = standin.add_token(), standin.add_token("bob@example.com", "Bob")
    login = invoke(capsys, "auth", "login", "--token", first, "--json")
    assert login.code == 0, login.err
    resource = login.json()["resource"]
    assert resource["email"] == "ada@example.com" and resource["token_store"] == "file"
    saved = json.loads(credentials_path().read_text())["platforms"][standin.url]
    assert saved["access_token"] == first and saved["token_id"] == standin.token_id(first)
    whoami = invoke(capsys, "auth", "whoami", "--json").json()["data"]
    assert whoami["effective_source"] == "file" and whoami["persistent_login"] is True
    assert whoami["account"]["token_id"] == standin.token_id(first)
    # A new login replaces the saved one and revokes the token it replaced.
    assert invoke(capsys, "auth", "login", "--token", second, "--json").code == 0
    assert standin.tokens[first]["revoked"] is True
    refused = invoke(capsys, "auth", "logout", "--json")
    assert refused.code == 1 and refused.error()["error"]["code"] == "INTERACTIVE_REQUIRED"
    logout = invoke(capsys, "auth", "logout", "-y", "--json")
    assert logout.code == 0 and logout.json()["resource"]["revoked"] is True
    assert standin.tokens[second]["revoked"] is True and not credentials_path().exists()
    again = invoke(capsys, "auth", "logout", "-y", "--json")
    assert again.json()["status"] == "noop"
    gone = invoke(capsys, "auth", "whoami", "--json")
    assert gone.code == 1 and gone.error()["error"]["code"] == "AUTH_REQUIRED"


def test_login_refuses_a_bad_token_and_saves_nothing(capsys, standin, home, monkeypatch):
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", standin.url)
    result = invoke(capsys, "auth", "login", "--token", "osm_wrong", "--json")
    assert result.code == 1
    error = result.error()["error"]
    assert error["code"] == "AUTH_REQUIRED" and error["details"]["platform_code"] == "TOKEN_INVALID"
    assert "not valid on this platform" in error["message"]
    assert not credentials_path().exists()


def test_device_login_in_rich_mode(capsys, standin, home, monkeypatch):
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", standin.url)
    result = invoke(capsys, "auth", "login")
    assert result.code == 0, result.err
    assert "ABCD-EFGH" in result.err and f"{standin.url}/device?code=ABCD-EFGH" in result.err
    assert "device@example.com" in result.out
    saved = json.loads(credentials_path().read_text())["platforms"][standin.url]
    assert saved["user"]["email"] == "device@example.com"
    needs_rich = invoke(capsys, "auth", "login", "--json")
    assert needs_rich.error()["error"]["code"] == "INTERACTIVE_REQUIRED"
    monkeypatch.setenv("OSMOSIS_TOKEN", "x")
    monkeypatch.setenv("OSMOSIS_TOKEN_PLATFORM_URL", standin.url)
    assert invoke(capsys, "auth", "login").code == 1  # CONFLICT: OSMOSIS_TOKEN already set


def test_logout_keeps_an_environment_token_and_says_so(capsys, platform_env, monkeypatch):
    token = platform_env.add_token()
    assert invoke(capsys, "auth", "login", "--token", token, "--json").code == 0
    result = invoke(capsys, "auth", "logout", "-y", "--json")
    assert result.code == 0
    warnings = [line["warning"]["code"] for line in result.stderr_lines()]
    assert "ENV_TOKEN_ACTIVE" in warnings
    assert result.json()["resource"]["env_token_set"] is True


def test_insecure_platform_urls_warn_and_are_refused_unless_allowed(capsys, home, monkeypatch):
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", "http://platform.example.com")
    result = invoke(capsys, "auth", "whoami", "--json")
    lines = result.stderr_lines()
    assert lines[0]["warning"]["code"] == "INSECURE_PLATFORM_URL"
    assert result.code == 1 and lines[-1]["error"]["code"] == "VALIDATION"
    monkeypatch.setenv("OSMOSIS_ALLOW_INSECURE_PLATFORM_URL", "1")
    allowed = invoke(capsys, "auth", "whoami", "--json")
    assert allowed.error()["error"]["code"] == "AUTH_REQUIRED"  # got past the URL check


def test_environment_token_must_be_bound_to_a_non_default_platform(
    capsys, standin, home, monkeypatch
):
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", standin.url)
    monkeypatch.setenv("OSMOSIS_TOKEN", standin.add_token())
    result = invoke(capsys, "auth", "whoami", "--json")
    assert result.error()["error"]["code"] == "ENV_TOKEN_PLATFORM_REQUIRED"
    monkeypatch.setenv("OSMOSIS_TOKEN_PLATFORM_URL", "http://127.0.0.1:1")
    result = invoke(capsys, "auth", "whoami", "--json")
    assert result.error()["error"]["code"] == "ENV_TOKEN_PLATFORM_MISMATCH"
    assert standin.requests == []  # the token never left


def test_commands_need_a_workspace_directory_with_origin(
    capsys, standin, home, tmp_path, monkeypatch
):
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", standin.url)
    monkeypatch.chdir(tmp_path)
    outside = invoke(capsys, "dataset", "list", "--json")
    assert outside.error()["error"]["code"] == "WORKSPACE_REQUIRED"
    bare = support.make_workspace(tmp_path / "bare", origin=None)
    monkeypatch.chdir(bare)
    assert (
        invoke(capsys, "dataset", "list", "--json").error()["error"]["code"] == "WORKSPACE_REQUIRED"
    )
    git(bare, "remote", "add", "origin", "/srv/git/team/bare.git")
    no_login = invoke(capsys, "dataset", "list", "--json")
    assert no_login.error()["error"]["code"] == "AUTH_REQUIRED"
    (bare / "data" / ".gitkeep").unlink()
    (bare / "data").rmdir()
    scaffold = invoke(capsys, "dataset", "list", "--json").error()["error"]
    assert scaffold["code"] == "VALIDATION" and "osmosis doctor --fix" in scaffold["message"]


def test_a_repository_no_workspace_claims_is_reported(capsys, platform_env, workspace):
    git(workspace, "remote", "set-url", "origin", "https://git.example.com/x/y")
    result = invoke(capsys, "dataset", "list", "--json")
    error = result.error()["error"]
    assert error["code"] == "NOT_FOUND"
    assert error["details"]["platform_code"] == "GIT_REPOSITORY_NOT_CONNECTED"
    assert "connected" in error["message"]


# --- datasets ---------------------------------------------------------------------------------


def test_dataset_upload_simple_then_conflict_then_overwrite(capsys, platform_env, workspace):
    path = write_jsonl(workspace / "data" / "multiply.jsonl")
    asked = invoke(capsys, "dataset", "upload", str(path), "--json")
    assert asked.error()["error"]["code"] == "INTERACTIVE_REQUIRED"
    assert asked.error()["error"]["details"]["summary"]["Dataset"] == "multiply"
    assert platform_env.of("POST", "/api/cli/datasets") == []
    result = invoke(capsys, "dataset", "upload", str(path), "-y", "--json")
    assert result.code == 0, result.err
    envelope = result.json()
    assert envelope["operation"] == "dataset.upload"
    resource = envelope["resource"]
    assert resource["status"] == "uploaded" and resource["row_count"] == 6
    assert resource["git"] == {"identity": IDENTITY, "remote_url": "git@github.com:Acme/Demo.git"}
    assert "internal_field" not in resource and "upload" not in resource
    create = platform_env.of("POST", "/api/cli/datasets")[0].body
    assert create == {
        "file_name": "multiply",
        "file_size": path.stat().st_size,
        "extension": "jsonl",
    }
    assert platform_env.objects[resource["id"]] == path.read_bytes()
    complete = platform_env.of("POST", f"/api/cli/datasets/{resource['id']}/complete")[0].body
    assert complete == {"file_extension": "jsonl"}
    again = invoke(capsys, "dataset", "upload", str(path), "-y", "--json")
    error = again.error()["error"]
    assert error["code"] == "CONFLICT" and error["details"]["existing_dataset_id"] == resource["id"]
    replaced = invoke(capsys, "dataset", "upload", str(path), "-y", "--overwrite", "--json")
    assert replaced.code == 0
    assert (
        platform_env.of("POST", "/api/cli/datasets")[-1].body["overwrite_dataset_id"]
        == resource["id"]
    )


def test_dataset_upload_multipart_sends_every_part_etag(capsys, platform_env, workspace):
    rows = [{"user_prompt": "x" * 100, "ground_truth": str(i)} for i in range(40)]
    path = write_jsonl(workspace / "data" / "long.jsonl", rows)
    platform_env.multipart_part_size = 1024
    result = invoke(capsys, "dataset", "upload", str(path), "-y", "--json")
    assert result.code == 0, result.err
    dataset_id = result.json()["resource"]["id"]
    parts = platform_env.of("POST", f"/api/cli/datasets/{dataset_id}/complete")[0].body["parts"]
    assert [p["PartNumber"] for p in parts] == list(range(1, -(-path.stat().st_size // 1024) + 1))
    assert platform_env.objects[dataset_id] == path.read_bytes()


def test_a_failed_upload_is_aborted(capsys, platform_env, workspace):
    path = write_jsonl(workspace / "data" / "broken.jsonl")
    platform_env.fail["PUT /objects/*"] = [(400, {"message": "bad signature"})]
    result = invoke(capsys, "dataset", "upload", str(path), "-y", "--json")
    assert result.code == 1 and result.error()["error"]["code"] == "PLATFORM_ERROR"
    [dataset] = platform_env.datasets.values()
    assert platform_env.aborted == [dataset["id"]] and dataset["status"] == "cancelled"
    assert not [r for r in platform_env.requests if r.path.endswith("/complete")]


def test_completing_an_upload_is_retried_on_a_transient_failure(capsys, platform_env, workspace):
    path = write_jsonl(workspace / "data" / "retry.jsonl")
    platform_env.fail["POST /api/cli/datasets/ds_3/complete"] = [(503, {"message": "busy"})]
    result = invoke(capsys, "dataset", "upload", str(path), "-y", "--json")
    assert result.code == 0, result.err
    assert result.json()["resource"]["id"] == "ds_3"  # ids 1-2: the token and the workspace
    completes = [r for r in platform_env.requests if r.path.endswith("/complete")]
    assert len(completes) == 2 and result.json()["resource"]["status"] == "uploaded"


def test_an_invalid_dataset_never_reaches_the_platform(capsys, platform_env, workspace):
    path = write_jsonl(workspace / "data" / "short.jsonl", ROWS[:2])
    result = invoke(capsys, "dataset", "upload", str(path), "-y", "--json")
    error = result.error()["error"]
    assert error["code"] == "VALIDATION" and error["details"]["valid"] is False
    assert platform_env.of("POST", "/api/cli/datasets") == []


def test_dataset_list_info_preview_logs_and_download(capsys, platform_env, workspace, tmp_path):
    path = write_jsonl(workspace / "data" / "multiply.jsonl")
    assert invoke(capsys, "dataset", "upload", str(path), "-y", "--json").code == 0
    listed = invoke(capsys, "dataset", "list", "--json").json()
    assert [d["file_name"] for d in listed["items"]] == ["multiply"]
    assert set(listed["items"][0]) == {*records.DATASET_KEYS, "platform_url"}
    assert listed["workspace_directory"] == str(workspace)
    info = invoke(capsys, "dataset", "info", "multiply", "--json").json()["data"]
    assert info["status"] == "uploaded" and info["git"]["identity"] == IDENTITY
    preview = invoke(capsys, "dataset", "preview", "multiply", "--rows", "2", "--json").json()
    assert preview["data"]["rows"] == ROWS[:2] and preview["data"]["returned_rows"] == 2
    platform_env.logs = [
        {"timestamp": NOW_LOG, "level": "info", "step": "upload", "message": f"line {i}"}
        for i in range(5)
    ]
    logs = invoke(capsys, "dataset", "logs", "multiply", "--limit", "3", "--json").json()
    assert [e["message"] for e in logs["items"]] == ["line 0", "line 1", "line 2"]
    assert logs["has_more"] is True and logs["next_cursor"] == "3"
    rest = invoke(capsys, "dataset", "logs", "multiply", "--cursor", "3", "--json").json()
    assert [e["message"] for e in rest["items"]] == ["line 3", "line 4"] and rest[
        "has_more"
    ] is False
    out = tmp_path / "downloads"
    out.mkdir()
    down = invoke(capsys, "dataset", "download", "multiply", "-o", str(out), "--json")
    assert down.code == 0, down.err
    target = out / "multiply.jsonl"
    assert down.json()["resource"]["output_path"] == str(target)
    assert target.read_bytes() == path.read_bytes()
    exists = invoke(capsys, "dataset", "download", "multiply", "-o", str(out), "--json")
    assert exists.error()["error"]["code"] == "CONFLICT"
    assert (
        invoke(
            capsys, "dataset", "download", "multiply", "-o", str(out), "--overwrite", "--json"
        ).code
        == 0
    )
    missing = invoke(capsys, "dataset", "info", "nope", "--json").error()["error"]
    assert missing["code"] == "NOT_FOUND" and missing["details"]["status_code"] == 404


NOW_LOG = "2030-01-01T12:00:00Z"


def test_list_options_are_checked(capsys, platform_env):
    for args in (("--limit", "0"), ("--limit", "51")):
        assert invoke(capsys, "dataset", "list", *args, "--json").code == 2
    both = invoke(capsys, "dataset", "list", "--all", "--limit", "5", "--json")
    assert both.code == 1 and "mutually exclusive" in both.error()["error"]["message"]
    assert invoke(capsys, "dataset", "logs", "x", "--limit", "201", "--json").code == 2


# --- secrets ----------------------------------------------------------------------------------


def test_secret_set_list_delete_never_shows_the_value(capsys, platform_env, monkeypatch):
    monkeypatch.setenv("MY_VALUE", "s3cr3t-value")
    needs = invoke(capsys, "secret", "set", "API_KEY", "--json")
    assert needs.error()["error"]["code"] == "INTERACTIVE_REQUIRED"
    set_ = invoke(capsys, "secret", "set", "API_KEY", "--env", "MY_VALUE", "--json")
    assert set_.code == 0, set_.err
    assert set_.json()["resource"]["scope"] == "personal"
    assert platform_env.secret_values[("API_KEY", "user")] == "s3cr3t-value"
    shared = invoke(
        capsys, "secret", "set", "SHARED", "--scope", "workspace", "--env", "MY_VALUE", "--json"
    )
    assert shared.code == 0
    listed = invoke(capsys, "secret", "list", "--json")
    items = listed.json()["items"]
    assert {(s["name"], s["scope"]) for s in items} == {
        ("API_KEY", "personal"),
        ("SHARED", "workspace"),
    }
    assert set(items[0]) == set(records.SECRET_KEYS)
    personal = invoke(capsys, "secret", "list", "--scope", "personal", "--json").json()["items"]
    assert [s["name"] for s in personal] == ["API_KEY"]
    assert platform_env.of("GET", "/api/cli/environment-secrets")[-1].query["scope"] == "user"
    wrong = invoke(capsys, "secret", "delete", "SHARED", "-y", "--json").error()["error"]
    assert wrong["code"] == "NOT_FOUND" and "--scope workspace" in wrong["message"]
    deleted = invoke(capsys, "secret", "delete", "API_KEY", "-y", "--json")
    assert deleted.code == 0 and deleted.json()["resource"]["scope"] == "personal"
    for outcome in (set_, shared, listed, deleted):
        assert "s3cr3t-value" not in outcome.out + outcome.err
    bad = invoke(capsys, "secret", "set", "lower", "--env", "MY_VALUE", "--json")
    assert bad.error()["error"]["code"] == "VALIDATION"


def test_a_value_echoed_in_an_error_is_redacted(capsys, platform_env, monkeypatch):
    monkeypatch.setenv("MY_VALUE", "echo-me")
    result = invoke(capsys, "secret", "set", "API_KEY", "--env", "MY_VALUE", "--json")
    assert result.code == 1
    assert "echo-me" not in result.err and "[REDACTED]" in result.err


# --- models and rollouts ----------------------------------------------------------------------

BASE = {
    "id": "b1",
    "model_name": "Qwen3-0.6B",
    "base_model": "Qwen/Qwen3-0.6B",
    "creator_name": "Osmosis",
    "created_at": NOW_LOG,
    "updated_at": NOW_LOG,
    "parameters": 600_000_000,
}
LORA = {
    "id": "l1",
    "model_name": "multiply-step-20",
    "base_model": "Qwen/Qwen3-0.6B",
    "training_run_name": "train-run-1",
    "checkpoint_step": 20,
    "reward": 0.9,
    "deployment_status": "inactive",
    "deployed_at": None,
    "deployed_by": None,
    "created_at": NOW_LOG,
}


def test_model_list_sections_and_single_lists(capsys, platform_env):
    platform_env.base_models = [BASE]
    platform_env.lora_models = [LORA]
    both = invoke(capsys, "model", "list", "--json").json()
    assert [m["model_name"] for m in both["base_models"]["items"]] == ["Qwen3-0.6B"]
    assert set(both["base_models"]["items"][0]) == set(records.BASE_MODEL_KEYS)
    assert both["lora_models"]["items"][0]["deployment_status"] == "inactive"
    assert (both["active_deployments"], both["max_active_deployments"]) == (1, 3)
    assert both["git"]["identity"] == IDENTITY
    base = invoke(capsys, "model", "list", "--type", "base", "--json").json()
    assert base["total_count"] == 1 and "active_deployments" not in base
    lora = invoke(capsys, "model", "list", "--type", "lora", "--json").json()
    assert lora["items"][0]["model_name"] == "multiply-step-20" and lora["active_deployments"] == 1
    plain = invoke(capsys, "model", "list", "--plain")
    assert "# Base models" in plain.out and "multiply-step-20" in plain.out


def test_model_info_lora_then_base_then_missing(capsys, platform_env):
    platform_env.base_models = [BASE]
    platform_env.lora_models = [dict(LORA)]
    lora = invoke(capsys, "model", "info", "multiply-step-20", "--json").json()["data"]
    assert lora["lora_model"]["inference_model"] == "x:multiply-step-20"
    base = invoke(capsys, "model", "info", "Qwen/Qwen3-0.6B", "--json").json()["data"]
    assert base["base_model"]["parameters"] == 600_000_000
    missing = invoke(capsys, "model", "info", "nothing", "--json").error()["error"]
    assert missing["code"] == "NOT_FOUND" and "nothing" in missing["message"]
    deployed = invoke(capsys, "model", "deploy", "multiply-step-20", "--json").json()
    assert deployed["resource"]["status"] == "active"
    assert deployed["operation"] == "model.deploy"
    undeployed = invoke(capsys, "model", "undeploy", "multiply-step-20", "--json").json()
    assert undeployed["operation"] == "model.undeploy"
    assert undeployed["resource"]["status"] == "inactive"
    assert undeployed["message"] == "Model undeployed: multiply-step-20"


def test_model_info_names_a_full_checkpoint_for_what_it_is(capsys, platform_env):
    platform_env.lora_models = [{**LORA, "checkpoint_type": "full"}]
    plain = invoke(capsys, "model", "info", "multiply-step-20", "--plain").out
    assert "full weights" in plain and "LoRA" not in plain
    platform_env.lora_models = [{**LORA, "checkpoint_type": "lora"}]
    plain = invoke(capsys, "model", "info", "multiply-step-20", "--plain").out
    assert "LoRA adapter" in plain


def test_rollout_list_by_branch(capsys, platform_env):
    platform_env.rollouts = [
        {
            "id": "r1",
            "name": "multiply",
            "is_active": True,
            "branch": "main",
            "repo_full_name": IDENTITY,
        },
        {
            "id": "r2",
            "name": "draft",
            "is_active": True,
            "branch": "dev",
            "repo_full_name": IDENTITY,
        },
    ]
    every = invoke(capsys, "rollout", "list", "--json").json()
    assert [r["name"] for r in every["items"]] == ["multiply", "draft"]
    assert set(every["items"][0]) == set(records.ROLLOUT_KEYS)
    dev = invoke(capsys, "rollout", "list", "--branch", "dev", "--json").json()
    assert [r["name"] for r in dev["items"]] == ["draft"] and dev["branch"] == "dev"


def test_record_key_sets_are_pinned():
    check_golden(
        "platform_record_keys",
        {
            "dataset": list(records.DATASET_KEYS),
            "rollout": list(records.ROLLOUT_KEYS),
            "base_model": list(records.BASE_MODEL_KEYS),
            "lora_model": [*records.LORA_MODEL_KEYS, *records.LORA_DEPLOYMENT_KEYS, "created_at"],
            "secret": list(records.SECRET_KEYS),
            "log_entry": list(records.LOG_KEYS),
        },
    )


# --- submit -----------------------------------------------------------------------------------

MAIN = """\
import os
VALUE = os.environ.get("PREFLIGHT_MARK", "")
if VALUE == "fail":
    raise ValueError("backend misconfigured: no model")
if VALUE == "missing":
    import not_installed_anywhere  # noqa: F401
if __name__ == "__main__":
    raise SystemExit("the server must not start during the preflight")
"""

EVAL_CONFIG = """\
[experiment]
rollout = "demo"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "multiply"

[evaluation]
limit = 5
n = 2

[env]
MODE = "fast"

[secrets]
required = ["API_KEY"]
"""

TRAIN_CONFIG = """\
[experiment]
rollout = "demo"
entrypoint = "main.py"
model_path = "Qwen/Qwen3-0.6B"
dataset = "multiply"
commit_sha = "{sha}"

[training]
lr = 2e-6
rollout_batch_size = 8

[sampling]
rollout_temperature = 0.7
"""


@pytest.fixture
def rollout(platform_env, workspace):
    (workspace / "rollouts" / "demo").mkdir()
    (workspace / "rollouts" / "demo" / "main.py").write_text(MAIN)
    (workspace / "configs" / "eval" / "demo.toml").write_text(EVAL_CONFIG)
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "rollout")
    return workspace


def warning_codes(outcome) -> list[str]:
    return [line["warning"]["code"] for line in outcome.stderr_lines() if "warning" in line]


def test_eval_submit_posts_the_config_and_run_secrets(capsys, platform_env, rollout, tmp_path):
    secrets_file = tmp_path / "run.env"
    secrets_file.write_text('export API_KEY="sk-run-only"\n')
    submit = ("eval", "submit", "configs/eval/demo.toml", "--secrets-file", str(secrets_file))
    asked = invoke(capsys, *submit, "--json")
    error = asked.error()["error"]
    assert error["code"] == "INTERACTIVE_REQUIRED"
    summary = error["details"]["summary"]
    assert summary["Repository"] == IDENTITY and summary["env.MODE"] == "fast"
    assert summary["secret.API_KEY"] == "Run"
    assert any("commit_sha" in w for w in error["details"]["warnings"])
    assert platform_env.runs == []
    result = invoke(capsys, *submit, "-y", "--json")
    assert result.code == 0, result.err
    envelope = result.json()
    assert envelope["operation"] == "eval.submit" and envelope["resource"]["name"] == "eval-run-1"
    assert envelope["resource"]["config"]["rollout"] == "demo"
    assert envelope["resource"]["url"].endswith("/demo/eval/1")
    assert platform_env.runs[0]["body"] == {
        "experiment_config": {
            "rollout": "demo",
            "entrypoint": "main.py",
            "model_path": "openai/gpt-5-mini",
            "dataset": "multiply",
        },
        "evaluation_config": {"limit": 5, "n": 2},
        "env_config": {"MODE": "fast"},
        "secrets": {"required": ["API_KEY"], "provided": {"API_KEY": "sk-run-only"}},
    }
    assert "sk-run-only" not in result.out + result.err
    assert {"NO_UPSTREAM", "UNPINNED_COMMIT"} <= set(warning_codes(result))


def test_submit_resolves_secrets_from_env_and_the_store(capsys, platform_env, rollout, monkeypatch):
    missing = invoke(capsys, "eval", "submit", "configs/eval/demo.toml", "-y", "--json")
    error = missing.error()["error"]
    assert error["code"] == "INTERACTIVE_REQUIRED"
    assert error["details"] == {"missing": ["API_KEY"], "flags": ["--secrets-file"]}
    assert "osmosis secret set API_KEY" in error["message"]
    monkeypatch.setenv("API_KEY", "from-env")
    assert invoke(capsys, "eval", "submit", "configs/eval/demo.toml", "-y", "--json").code == 0
    assert platform_env.runs[-1]["body"]["secrets"]["provided"] == {"API_KEY": "from-env"}
    monkeypatch.delenv("API_KEY")
    monkeypatch.setenv("V", "stored")
    assert invoke(capsys, "secret", "set", "API_KEY", "--env", "V", "--json").code == 0
    stored = invoke(capsys, "eval", "submit", "configs/eval/demo.toml", "-y", "--json")
    assert stored.code == 0, stored.err
    assert platform_env.runs[-1]["body"]["secrets"] == {"required": ["API_KEY"]}


def test_submit_warns_about_uncommitted_and_unpushed_work(
    capsys, platform_env, rollout, tmp_path, monkeypatch
):
    remote = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(rollout, "remote", "set-url", "origin", str(remote))
    git(rollout, "push", "-q", "-u", "origin", "main")
    (rollout / "rollouts" / "demo" / "extra.py").write_text("X = 1\n")
    git(rollout, "add", "-A")
    git(rollout, "commit", "-q", "-m", "local only")
    (rollout / "notes.txt").write_text("dirty")
    platform_env.add_workspace(
        "tmp/remote"
    )  # origin is now <tmp>/remote.git: owner/repo = its parent/remote
    identity = f"{tmp_path.name.lower()}/remote"  # origin <tmp>/remote.git: its last two parts
    platform_env.add_workspace(identity)
    monkeypatch.setenv("API_KEY", "k")
    result = invoke(capsys, "eval", "submit", "configs/eval/demo.toml", "-y", "--json")
    assert result.code == 0, result.err
    assert {"UNCOMMITTED_CHANGES", "UNPUSHED_COMMITS"} <= set(warning_codes(result))
    assert platform_env.of("POST", "/api/cli/eval-runs")[-1].headers["x-osmosis-git"] == identity


def test_submit_preflight_imports_the_entrypoint_once(capsys, platform_env, rollout, monkeypatch):
    monkeypatch.setenv("API_KEY", "k")
    monkeypatch.setenv("PREFLIGHT_MARK", "missing")
    skipped = invoke(capsys, "eval", "submit", "configs/eval/demo.toml", "-y", "--json")
    assert skipped.code == 0 and "PREFLIGHT_SKIPPED" in warning_codes(skipped)
    monkeypatch.setenv("PREFLIGHT_MARK", "fail")
    failed = invoke(capsys, "eval", "submit", "configs/eval/demo.toml", "-y", "--json")
    error = failed.error()["error"]
    assert error["code"] == "VALIDATION"
    assert "preflight failed for rollouts/demo/main.py" in error["message"]
    assert "backend misconfigured" in error["message"]
    assert len(platform_env.runs) == 1  # the failed preflight posted nothing


def test_submit_reports_config_problems_together(capsys, platform_env, rollout):
    (rollout / "configs" / "eval" / "bad.toml").write_text(
        '[experiment]\nrollout = "nope"\n[evaluaton]\nlimit = 1\n'
    )
    error = invoke(capsys, "eval", "submit", "configs/eval/bad.toml", "-y", "--json").error()[
        "error"
    ]
    assert error["code"] == "VALIDATION"
    keys = {issue["key"] for issue in error["details"]["issues"]}
    assert {"evaluaton", "experiment.rollout", "experiment.model_path", "secrets"} <= keys
    wrong_dir = invoke(capsys, "train", "submit", "configs/eval/demo.toml", "-y", "--json")
    assert wrong_dir.error()["error"]["code"] == "VALIDATION"


def test_train_submit_pins_a_commit_and_sends_the_training_sections(capsys, platform_env, rollout):
    sha = git(rollout, "rev-parse", "HEAD")
    (rollout / "configs" / "training" / "demo.toml").write_text(TRAIN_CONFIG.format(sha=sha))
    result = invoke(capsys, "train", "submit", "configs/training/demo.toml", "-y", "--json")
    assert result.code == 0, result.err
    assert result.json()["operation"] == "train.submit"
    body = platform_env.runs[-1]["body"]
    assert body["experiment_config"]["commit_sha"] == sha
    assert body["training_config"] == {"lr": 2e-6, "rollout_batch_size": 8}
    assert body["sampling_config"] == {"rollout_temperature": 0.7}
    assert "secrets" not in body
    (rollout / "configs" / "training" / "bad.toml").write_text(TRAIN_CONFIG.format(sha="ab" * 20))
    unknown = invoke(capsys, "train", "submit", "configs/training/bad.toml", "-y", "--json")
    assert unknown.code == 0 and "COMMIT_UNVERIFIED" in warning_codes(unknown)


def test_submit_errors_are_redacted_and_explained(capsys, platform_env, rollout, monkeypatch):
    monkeypatch.setenv("API_KEY", "sk-very-secret")
    platform_env.fail["POST /api/cli/eval-runs"] = [
        (
            400,
            {
                "message": "API_KEY sk-very-secret was rejected",
                "details": {"value": "sk-very-secret"},
            },
        )
    ]
    refused = invoke(capsys, "eval", "submit", "configs/eval/demo.toml", "-y", "--json")
    assert refused.code == 1
    assert "sk-very-secret" not in refused.err and "[REDACTED]" in refused.err
    platform_env.run_routes = False
    absent = invoke(capsys, "eval", "submit", "configs/eval/demo.toml", "-y", "--json").error()[
        "error"
    ]
    assert absent["code"] == "NOT_FOUND" and "does not accept evaluation runs" in absent["message"]
    platform_env.run_routes = True
    monkeypatch.delenv("API_KEY")
    platform_env.secrets = [{"id": "s", "name": "API_KEY", "scope": "user"}]  # listed, but gone
    platform_env.fail["POST /api/cli/eval-runs"] = [
        (404, {"error": "Secret(s) not found: API_KEY", "code": "SECRET_NOT_FOUND"})
    ]
    gone = invoke(capsys, "eval", "submit", "configs/eval/demo.toml", "-y", "--json").error()[
        "error"
    ]
    assert "osmosis secret set API_KEY" in gone["message"]
