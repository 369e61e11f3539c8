"""One training config for both CLIs: the embedded trainer's own settings (``loss_type``,
``kl_coef``, ``seed``, ``report_to``, ``[warmup]``, ``[lora]``) are also read from
``[advanced]`` under the same names, by ``osmosis train run`` and by the platform's submit
check, and a setting given in both places is refused naming both."""

from __future__ import annotations

import textwrap

import pytest

from osmosis_ai.platform.services.run_config import InvalidRunConfigError, check_submission
from osmosis_ai.workspace import (
    ConfigValidationError,
    Workspace,
    fix_scaffold,
    load_training_config,
)

EXPERIMENT = """\
[experiment]
rollout = "demo"
entrypoint = "main.py"
model_path = "Qwen/Qwen3-0.6B"
dataset = "multiply"
"""


@pytest.fixture
def ws(tmp_path) -> Workspace:
    fix_scaffold(tmp_path)
    rollout = tmp_path / "rollouts" / "demo"
    rollout.mkdir()
    (rollout / "main.py").write_text("print('hi')\n")
    return Workspace(tmp_path)


def load(ws: Workspace, text: str):
    path = ws.configs_dir / "training" / "demo.toml"
    path.write_text(EXPERIMENT + textwrap.dedent(text))
    return load_training_config(path, ws)


def issues(ws: Workspace, text: str) -> dict[str, str]:
    with pytest.raises(ConfigValidationError) as info:
        load(ws, text)
    return {issue.key: issue.message for issue in info.value.issues}


def test_settings_under_advanced_configure_the_local_trainer(ws):
    config = load(
        ws,
        """\
        [training]
        lr = 3e-4
        [advanced]
        loss_type = "grpo"
        kl_coef = 0.05
        seed = 7
        report_to = ["tensorboard"]
        lr_warmup_steps = 5
        other = { kept = true }
        [advanced.warmup]
        sft_steps = 12
        batch_size = 4
        [advanced.lora]
        enabled = true
        rank = 4
        target_modules = ["q_proj"]
        """,
    )
    training = config.training
    assert (training.lr, training.loss_type, training.kl_coef, training.seed) == (
        3e-4,
        "grpo",
        0.05,
        7,
    )
    assert training.report_to == ("tensorboard",)
    assert training.lr_warmup_steps == 5
    assert (config.warmup.sft_steps, config.warmup.batch_size, config.warmup.lr) == (12, 4, 1e-3)
    assert (config.lora.enabled, config.lora.rank, config.lora.target_modules) == (
        True,
        4,
        ("q_proj",),
    )
    assert config.advanced["other"] == {"kept": True}  # everything else passes as written


def test_own_sections_and_advanced_combine_when_they_set_different_keys(ws):
    config = load(
        ws,
        """\
        [warmup]
        sft_steps = 5
        [advanced.warmup]
        lr = 2e-4
        """,
    )
    assert (config.warmup.sft_steps, config.warmup.lr) == (5, 2e-4)


def test_a_setting_in_both_places_is_refused_naming_both(ws):
    found = issues(
        ws,
        """\
        [training]
        seed = 1
        [warmup]
        sft_steps = 5
        [advanced]
        seed = 2
        [advanced.warmup]
        sft_steps = 6
        """,
    )
    assert "[training]" in found["advanced.seed"] and "[advanced]" in found["advanced.seed"]
    assert "[warmup]" in found["advanced.warmup.sft_steps"]


def test_bad_values_under_advanced_are_named_where_they_are(ws):
    found = issues(
        ws,
        """\
        [advanced]
        loss_type = "ppo"
        lora = "yes"
        [advanced.warmup]
        sft_stepz = 3
        """,
    )
    assert "one of 'grpo'" in found["advanced.loss_type"]
    assert "must be a table" in found["advanced.lora"]
    assert found["advanced.warmup.sft_stepz"] == "Unrecognized key"


EXPERIMENT_CONFIG = {
    "rollout": "demo",
    "entrypoint": "main.py",
    "model_path": "tiny",
    "dataset": "multiply",
}


def submit(**sections):
    return check_submission(
        "training",
        experiment_config=EXPERIMENT_CONFIG,
        sections=sections,
        env_config=None,
        required_secrets=[],
        provided_secrets=None,
    )


def submit_issues(**sections) -> dict[str, str]:
    with pytest.raises(InvalidRunConfigError) as info:
        submit(**sections)
    return {issue["key"]: issue["message"] for issue in info.value.issues}


def test_the_platform_takes_the_trainer_settings_under_advanced():
    advanced = {
        "loss_type": "dr_grpo",
        "kl_coef": 0.0,
        "seed": 3,
        "warmup": {"sft_steps": 10, "lr": 1e-3, "batch_size": 8},
        "lora": {"enabled": False, "rank": 8, "dropout": 0.1, "target_modules": "all-linear"},
        "nested": {"a": [1, 2]},
    }
    checked = submit(training={"lr": 1e-4}, advanced=advanced)
    assert checked.sections["advanced"] == advanced


def test_the_platform_refuses_bad_trainer_settings_and_points_at_advanced():
    found = submit_issues(
        training={"loss_type": "grpo", "seed": 1},
        advanced={
            "seed": 1,
            "kl_coef": -1,
            "warmup": {"sft_steps": -1, "epochs": 2},
            "lora": {"dropout": 1.0},
        },
    )
    assert "[advanced]" in found["training_config.loss_type"]
    assert "[advanced]" in found["training_config.seed"]
    assert "advanced_config.seed" not in found  # said once, where it was misplaced
    assert found["advanced_config.kl_coef"] == "must be a finite number ≥ 0, got -1 (integer)"
    assert found["advanced_config.warmup.sft_steps"].startswith("must be an integer ≥ 0")
    assert found["advanced_config.warmup.epochs"] == "Unrecognized key"
    assert "< 1" in found["advanced_config.lora.dropout"]


def test_our_submit_sends_our_own_settings_under_advanced_so_the_platform_takes_them(ws):
    from osmosis_ai.platform.client.submit import run_payload

    config = load(
        ws,
        """
        [training]
        lr = 3e-4
        loss_type = "dapo"
        seed = 0

        [advanced]
        kl_coef = 0.0
        custom = "kept"

        [warmup]
        sft_steps = 5

        [lora]
        enabled = false
        """,
    )
    body = run_payload(config, {})
    assert body["training_config"] == {"lr": 3e-4}
    assert body["advanced_config"] == {
        "kl_coef": 0.0,
        "custom": "kept",
        "loss_type": "dapo",
        "seed": 0,
        "warmup": {"sft_steps": 5},
        "lora": {"enabled": False},
    }
    sections = {k.removesuffix("_config"): v for k, v in body.items() if k != "experiment_config"}
    checked = submit(**sections)  # the platform's own check accepts what our CLI sends
    assert checked.sections["advanced"]["loss_type"] == "dapo"


def test_asynchronous_training_settings_default_to_the_synchronous_loop(ws):
    training = load(ws, "").training
    assert (training.max_staleness, training.importance_ratio_cap) == (0, 2.0)


@pytest.mark.parametrize("section", ["training", "advanced"])
def test_asynchronous_training_settings_are_read_from_either_section(ws, section):
    training = load(ws, f"[{section}]\nmax_staleness = 2\nimportance_ratio_cap = 1.5\n").training
    assert (training.max_staleness, training.importance_ratio_cap) == (2, 1.5)
    assert type(training.importance_ratio_cap) is float
    assert load(ws, f"[{section}]\nimportance_ratio_cap = 1\n").training.importance_ratio_cap == 1.0


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("max_staleness", "-1", "must be an integer ≥ 0, got -1 (integer)"),
        ("max_staleness", "1.5", "must be an integer ≥ 0, got 1.5 (float)"),
        ("max_staleness", '"2"', "must be an integer ≥ 0, got '2' (string)"),
        ("importance_ratio_cap", "0.5", "must be a finite number ≥ 1, got 0.5 (float)"),
        ("importance_ratio_cap", "inf", "must be a finite number ≥ 1, got inf (float)"),
    ],
)
def test_bad_asynchronous_training_settings_are_named_with_the_rule(ws, key, value, message):
    for section in ("training", "advanced"):
        found = issues(ws, f"[{section}]\n{key} = {value}\n")
        assert found == {f"{section}.{key}": f"{section}.{key} {message}"}


def test_an_asynchronous_setting_in_both_places_is_refused(ws):
    found = issues(ws, "[training]\nmax_staleness = 1\n[advanced]\nmax_staleness = 1\n")
    assert "set both in [training] and in [advanced]" in found["advanced.max_staleness"]
