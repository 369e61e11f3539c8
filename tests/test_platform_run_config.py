"""One set of rules for a run's config sections: the platform's submit check (through the
HTTP API, against a real Git repository and database) refuses and accepts exactly what the
workspace's config loader (``osmosis eval run`` / ``osmosis train run`` on a TOML file)
refuses and accepts, with the same message at the same key, for every section, the
trainer's settings under ``[advanced]`` included."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from osmosis_ai.workspace import (
    ConfigValidationError,
    TrainingSection,
    Workspace,
    fix_scaffold,
    load_eval_config,
    load_training_config,
)
from osmosis_ai.workspace.config import parse_training_config
from osmosis_ai.workspace.sections import ADVANCED_TRAINING_KEYS
from platform_support import git, write_files
from test_platform_runs import REPO, Team, eval_body, submit, training_body

EXPERIMENT = {
    "eval": '[experiment]\nrollout = "demo"\nentrypoint = "main.py"\n'
    'model_path = "openai/gpt-5-mini"\ndataset = "multiply"\n[secrets]\nrequired = []\n',
    "training": '[experiment]\nrollout = "demo"\nentrypoint = "main.py"\n'
    'model_path = "Qwen/Qwen3-0.6B"\ndataset = "multiply"\n',
}

# (kind, section, key, the value as TOML, as JSON): each refused by both checkers
REFUSED = [
    ("eval", "evaluation", "n", "0", 0),
    ("eval", "evaluation", "limit", "1.5", 1.5),
    ("eval", "evaluation", "pass_threshold", '"high"', "high"),
    ("eval", "evaluation", "grader_timeout_s", "0", 0),
    ("training", "training", "lr", "-1", -1),
    ("training", "training", "total_epochs", "true", True),
    ("training", "sampling", "rollout_top_p", "1.5", 1.5),
    ("training", "sampling", "rollout_temperature", "-0.5", -0.5),
    ("training", "checkpoints", "eval_interval", "-1", -1),
    ("training", "advanced", "seed", "-1", -1),
    ("training", "advanced", "lr_warmup_steps", "-1", -1),
    ("training", "advanced", "no_signal_patience", "-1", -1),
    ("training", "advanced", "max_staleness", "-1", -1),
    ("training", "advanced", "max_staleness", "0.5", 0.5),
    ("training", "advanced", "importance_ratio_cap", "0.9", 0.9),
    ("training", "advanced", "loss_type", '"ppo"', "ppo"),
    ("training", "advanced", "kl_coef", "-0.5", -0.5),
    ("training", "advanced", "report_to", '["stdout"]', ["stdout"]),
    ("training", "advanced.lora", "dropout", "1.0", 1.0),
    ("training", "advanced.lora", "target_modules", "[]", []),
    ("training", "advanced.warmup", "batch_size", "0", 0),
    ("training", "advanced.ray", "max_failures", "-1", -1),
]


@pytest.fixture
def origin(tmp_path) -> Path:
    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_files(repo, {"rollouts/alpha/main.py": "print('alpha')\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "alpha")
    return repo


@pytest.fixture
def team(harness, origin, tmp_path):
    return Team(harness, origin, tmp_path)


@pytest.fixture
def ws(tmp_path) -> Workspace:
    root = tmp_path / "ws"
    fix_scaffold(root)
    write_files(root, {"rollouts/demo/main.py": "print('hi')\n"})
    return Workspace(root)


def load(ws: Workspace, kind: str, text: str):
    folder = "eval" if kind == "eval" else "training"
    path = ws.configs_dir / folder / "run.toml"
    path.write_text(EXPERIMENT[kind] + textwrap.dedent(text))
    return (load_eval_config if kind == "eval" else load_training_config)(path, ws)


def loader_issues(ws: Workspace, kind: str, text: str) -> dict[str, str]:
    """The loader's issues by the submit's key (``advanced_config.seed``), each message
    without the key it starts with."""
    with pytest.raises(ConfigValidationError) as info:
        load(ws, kind, text)
    found: dict[str, str] = {}
    for issue in info.value.issues:
        section, dot, rest = issue.key.partition(".")
        found[f"{section}_config{dot}{rest}"] = issue.message.removeprefix(f"{issue.key} ")
    return found


async def platform_issues(team, kind: str, body: dict) -> dict[str, str]:
    refused = await submit(team, kind, body, expect=400)
    assert refused["code"] == "VALIDATION"
    return {issue["key"]: issue["message"] for issue in refused["details"]["issues"]}


def body_with(kind: str, section: str, table: dict) -> dict:
    """A submit body whose ``section`` (``advanced.lora`` nests in advanced_config) is
    ``table``."""
    body = eval_body() if kind == "eval" else training_body()
    top, _, inner = section.partition(".")
    body[f"{top}_config"] = {inner: table} if inner else table
    return body


def toml_with(section: str, key: str, value: str) -> str:
    return f"[{section}]\n{key} = {value}\n"


async def test_the_platform_and_the_loader_refuse_the_same_values_saying_the_same(team, ws):
    for kind, section, key, toml_value, json_value in REFUSED:
        expected = loader_issues(ws, kind, toml_with(section, key, toml_value))
        found = await platform_issues(team, kind, body_with(kind, section, {key: json_value}))
        assert found == expected, (section, key)
        top, _, inner = section.partition(".")
        where = f"{top}_config" + (f".{inner}" if inner else "")
        assert list(found) == [f"{where}.{key}"]


@pytest.mark.parametrize("key", ["lr_warmup_steps", "seed"])
async def test_a_negative_count_under_advanced_is_refused_alike_and_0_is_taken(team, ws, key):
    expected = loader_issues(ws, "training", toml_with("advanced", key, "-1"))
    found = await platform_issues(team, "training", body_with("training", "advanced", {key: -1}))
    assert (
        found == expected == {f"advanced_config.{key}": "must be an integer ≥ 0, got -1 (integer)"}
    )

    assert getattr(load(ws, "training", toml_with("advanced", key, "0")).training, key) == 0
    await submit(team, "training", body_with("training", "advanced", {key: 0}))


async def test_the_trainer_settings_under_advanced_are_one_list(team, ws):
    known = {f.name for f in TrainingSection.__dataclass_fields__.values()}
    assert set(ADVANCED_TRAINING_KEYS) <= known
    lines = "".join(f'{key} = "?"\n' for key in ADVANCED_TRAINING_KEYS)
    expected = loader_issues(ws, "training", f"[advanced]\n{lines}")
    table = dict.fromkeys(ADVANCED_TRAINING_KEYS, "?")
    found = await platform_issues(team, "training", body_with("training", "advanced", table))
    assert found == expected
    assert set(found) == {f"advanced_config.{key}" for key in ADVANCED_TRAINING_KEYS}


async def test_checkpoint_intervals_of_0_mean_never_on_the_platform_too(team, ws):
    never = {"eval_interval": 0, "checkpoint_save_freq": 0}
    config = load(ws, "training", "[checkpoints]\neval_interval = 0\ncheckpoint_save_freq = 0\n")
    assert (config.checkpoints.eval_interval, config.checkpoints.checkpoint_save_freq) == (0, 0)
    await submit(team, "training", body_with("training", "checkpoints", never))


async def test_an_unknown_key_names_the_known_one_it_is_closest_to(team, ws):
    refused = await submit(team, "eval", body_with("eval", "evaluation", {"limt": 3}), expect=400)
    assert refused["details"]["issues"] == [
        {
            "key": "evaluation_config.limt",
            "message": "Unrecognized key",
            "key_correction": "evaluation_config.limit",
        }
    ]
    with pytest.raises(ConfigValidationError) as info:
        load(ws, "eval", "[evaluation]\nlimt = 3\n")
    assert [i.to_dict() for i in info.value.issues] == [
        {
            "key": "evaluation.limt",
            "message": "Unrecognized key",
            "key_correction": "evaluation.limit",
        }
    ]


async def test_a_null_leaves_a_trainer_setting_unset_and_passes_elsewhere(team):
    advanced = {"lora": {"enabled": True, "rank": None}, "free": {"x": None}, "seed": None}
    created = await submit(team, "training", body_with("training", "advanced", advanced))
    answer = await team.call("GET", f"/api/cli/training-runs/{created['id']}", repo=REPO)
    assert answer.status_code == 200, answer.text
    stored = answer.json()["advanced_config"]
    assert stored == {"lora": {"enabled": True}, "free": {"x": None}}
    assert json.dumps(stored)  # what a worker builds the run's config from


async def test_asynchronous_training_settings_round_trip_to_the_worker(team, ws):
    """Submitted under [advanced], kept as given, and read back by the worker's parse (the
    one ``train_job`` builds the run's config with) as the local loader reads them."""
    advanced = {"max_staleness": 2, "importance_ratio_cap": 1.5}
    created = await submit(team, "training", body_with("training", "advanced", advanced))
    answer = await team.call("GET", f"/api/cli/training-runs/{created['id']}", repo=REPO)
    assert answer.status_code == 200, answer.text
    stored = answer.json()["advanced_config"]
    assert stored == advanced
    experiment = {
        "rollout": "demo",
        "entrypoint": "main.py",
        "model_path": "Qwen/Qwen3-0.6B",
        "dataset": "multiply",
    }
    tables = {"experiment": experiment, "advanced": json.loads(json.dumps(stored))}
    path = ws.configs_dir / "training" / ".platform-run.toml"
    worker = parse_training_config(tables, path=path, workspace=ws).training
    local = load(ws, "training", "[advanced]\nmax_staleness = 2\nimportance_ratio_cap = 1.5\n")
    assert (worker.max_staleness, worker.importance_ratio_cap) == (2, 1.5)
    assert worker == local.training


async def test_asynchronous_training_settings_in_training_config_point_at_advanced(team):
    body = body_with("training", "training", {"max_staleness": 1})
    found = await platform_issues(team, "training", body)
    assert list(found) == ["training_config.max_staleness"]
    assert "set it under [advanced]" in found["training_config.max_staleness"]
