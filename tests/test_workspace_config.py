"""Eval and training TOML configs: path rules, section/key rules, value types, all issues at once."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from osmosis_ai.errors import ConfigError
from osmosis_ai.workspace import (
    ConfigIssue,
    ConfigValidationError,
    EvalConfig,
    TrainingConfig,
    Workspace,
    fix_scaffold,
    load_eval_config,
    load_training_config,
)

EXPERIMENT = """\
[experiment]
rollout = "demo"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
dataset = "multiply"
"""
EVAL_OK = EXPERIMENT + "\n[secrets]\nrequired = []\n"


@pytest.fixture
def ws(tmp_path) -> Workspace:
    fix_scaffold(tmp_path)
    rollout = tmp_path / "rollouts" / "demo"
    rollout.mkdir()
    (rollout / "main.py").write_text("print('hi')\n")
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    return Workspace(tmp_path)


def write(ws: Workspace, kind: str, text: str, name: str = "demo.toml"):
    path = ws.configs_dir / kind / name
    path.write_text(textwrap.dedent(text))
    return path


def eval_issues(ws: Workspace, text: str) -> list[ConfigIssue]:
    with pytest.raises(ConfigValidationError) as info:
        load_eval_config(write(ws, "eval", text), ws)
    assert info.value.kind == "eval"
    return info.value.issues


def training_issues(ws: Workspace, text: str) -> list[ConfigIssue]:
    with pytest.raises(ConfigValidationError) as info:
        load_training_config(write(ws, "training", text), ws)
    assert info.value.kind == "training"
    return info.value.issues


def by_key(issues: list[ConfigIssue]) -> dict[str, ConfigIssue]:
    return {issue.key: issue for issue in issues}


# --- valid configs ----------------------------------------------------------------------


def test_minimal_eval_config_uses_defaults(ws):
    path = write(ws, "eval", EVAL_OK)
    config = load_eval_config(path, ws)
    assert isinstance(config, EvalConfig)
    assert config.name == "demo"
    assert config.path == path.resolve()
    assert config.experiment.rollout == "demo"
    assert config.experiment.model_path == "openai/gpt-5-mini"
    assert config.experiment.branch is None and config.experiment.commit_sha is None
    assert config.rollout_dir == (ws.rollouts_dir / "demo").resolve()
    assert config.entrypoint_path == (ws.rollouts_dir / "demo" / "main.py").resolve()
    assert config.model_dir is None
    assert config.secrets == ()
    assert config.env == {}
    assert config.advanced == {}
    e = config.evaluation
    assert (e.limit, e.n, e.batch_size, e.pass_threshold) == (None, 1, 1, 1.0)
    assert e.agent_workflow_timeout_s is None and e.grader_timeout_s is None
    assert config.raw["experiment"]["dataset"] == "multiply"


def test_full_eval_config(ws):
    text = EXPERIMENT + textwrap.dedent(
        """\
        commit_sha = "abc1234"
        [evaluation]
        limit = 10
        n = 4
        batch_size = 2
        pass_threshold = 1
        agent_workflow_timeout_s = 450
        grader_timeout_s = 150.5
        [env]
        MODE = "fast"
        _PRIVATE = "ok"
        [secrets]
        required = ["OPENAI_API_KEY"]
        [advanced]
        anything = { goes = [1, 2] }
        """
    )
    config = load_eval_config(write(ws, "eval", text), ws)
    e = config.evaluation
    assert (e.limit, e.n, e.batch_size) == (10, 4, 2)
    assert e.pass_threshold == 1.0 and isinstance(e.pass_threshold, float)
    assert (e.agent_workflow_timeout_s, e.grader_timeout_s) == (450.0, 150.5)
    assert config.experiment.commit_sha == "abc1234"
    assert config.env == {"MODE": "fast", "_PRIVATE": "ok"}
    assert config.secrets == ("OPENAI_API_KEY",)
    assert config.advanced == {"anything": {"goes": [1, 2]}}


def test_minimal_training_config_uses_defaults(ws):
    text = EXPERIMENT.replace("openai/gpt-5-mini", "Qwen/Qwen3-0.6B")
    config = load_training_config(write(ws, "training", text), ws)
    assert isinstance(config, TrainingConfig)
    assert config.model_dir is None
    t = config.training
    assert (t.lr, t.total_epochs, t.n_samples_per_prompt, t.rollout_batch_size) == (1e-6, 1, 8, 32)
    assert (t.max_prompt_length, t.max_response_length) == (8192, 8192)
    assert (t.agent_workflow_timeout_s, t.grader_timeout_s) == (450.0, 150.0)
    assert (t.loss_type, t.kl_coef, t.seed, t.report_to) == ("dapo", 0.0, 0, ())
    assert (config.sampling.rollout_temperature, config.sampling.rollout_top_p) == (1.0, 1.0)
    assert (config.checkpoints.eval_interval, config.checkpoints.checkpoint_save_freq) == (10, 20)
    lora = config.lora
    assert (lora.enabled, lora.rank, lora.alpha, lora.dropout) == (False, 8, 16, 0.0)
    assert lora.target_modules == "all-linear"
    assert (config.warmup.sft_steps, config.warmup.lr, config.warmup.batch_size) == (0, 1e-3, 8)
    assert config.secrets == ()  # [secrets] is optional for training


def test_full_training_config(ws):
    text = EXPERIMENT + textwrap.dedent(
        """\
        branch = "feature/x"
        [training]
        lr = 1
        total_epochs = 2
        n_samples_per_prompt = 4
        rollout_batch_size = 8
        max_prompt_length = 512
        max_response_length = 256
        agent_workflow_timeout_s = 60
        grader_timeout_s = 30
        loss_type = "grpo"
        kl_coef = 0.05
        seed = 7
        report_to = ["tensorboard", "wandb"]
        [sampling]
        rollout_temperature = 0.0
        rollout_top_p = 0.9
        [checkpoints]
        eval_interval = 0
        checkpoint_save_freq = 5
        [lora]
        enabled = true
        rank = 16
        alpha = 32
        dropout = 0.05
        target_modules = ["q_proj", "v_proj"]
        [warmup]
        sft_steps = 3
        lr = 2e-4
        batch_size = 2
        """
    )
    config = load_training_config(write(ws, "training", text), ws)
    assert config.experiment.branch == "feature/x"
    t = config.training
    assert t.lr == 1.0 and isinstance(t.lr, float)
    assert (t.total_epochs, t.loss_type, t.kl_coef, t.seed) == (2, "grpo", 0.05, 7)
    assert t.report_to == ("tensorboard", "wandb")
    assert config.sampling.rollout_top_p == 0.9
    assert config.checkpoints.eval_interval == 0
    assert config.lora.enabled is True
    assert config.lora.target_modules == ("q_proj", "v_proj")
    assert (config.warmup.sft_steps, config.warmup.lr, config.warmup.batch_size) == (3, 2e-4, 2)


def test_config_objects_are_frozen(ws):
    config = load_eval_config(write(ws, "eval", EVAL_OK), ws)
    with pytest.raises(AttributeError):
        config.evaluation.n = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        config.path = ws.root  # type: ignore[misc]


# --- model_path -------------------------------------------------------------------------


@pytest.mark.parametrize("model_path", ["local:models/tiny", "./models/tiny", "models/tiny"])
def test_training_model_path_can_be_a_local_directory(ws, model_path):
    text = EXPERIMENT.replace("openai/gpt-5-mini", model_path)
    config = load_training_config(write(ws, "training", text), ws)
    assert config.model_dir == (ws.root / "models" / "tiny").resolve()


def test_training_model_path_absolute_directory(ws):
    target = (ws.root / "models" / "tiny").resolve()
    text = EXPERIMENT.replace("openai/gpt-5-mini", str(target))
    assert load_training_config(write(ws, "training", text), ws).model_dir == target


@pytest.mark.parametrize(
    ("model_path", "fragment"),
    [
        ("local:models/none", "not found"),
        ("local:", "not found"),
        ("./models/none", "not found"),
        ("bad id!", "model id"),
        ("a/b/c", "model id"),
    ],
)
def test_training_model_path_errors(ws, model_path, fragment):
    text = EXPERIMENT.replace("openai/gpt-5-mini", model_path)
    issue = by_key(training_issues(ws, text))["experiment.model_path"]
    assert fragment in issue.message
    assert repr(model_path) in issue.message


def test_eval_model_path_is_a_litellm_id_unless_local(ws):
    config = load_eval_config(write(ws, "eval", EVAL_OK.replace("openai/", "any thing/")), ws)
    assert config.model_dir is None
    local = EVAL_OK.replace("openai/gpt-5-mini", "local:models/tiny")
    assert (
        load_eval_config(write(ws, "eval", local), ws).model_dir
        == (ws.root / "models" / "tiny").resolve()
    )


# --- file and path rules ----------------------------------------------------------------


def test_eval_config_must_live_under_configs_eval(ws):
    path = write(ws, "training", EVAL_OK)
    with pytest.raises(ConfigValidationError) as info:
        load_eval_config(path, ws)
    (issue,) = info.value.issues
    assert issue.key == "file"
    assert "configs/eval" in issue.message


def test_training_config_must_live_under_configs_training(ws):
    with pytest.raises(ConfigValidationError, match="configs/training"):
        load_training_config(write(ws, "eval", EXPERIMENT), ws)


def test_config_outside_the_workspace_is_rejected(ws, tmp_path_factory):
    outside = tmp_path_factory.mktemp("elsewhere") / "x.toml"
    outside.write_text(EVAL_OK)
    with pytest.raises(ConfigValidationError, match="must be under"):
        load_eval_config(outside, ws)


def test_config_must_end_in_toml(ws):
    path = ws.eval_configs_dir / "demo.txt"
    path.write_text(EVAL_OK)
    with pytest.raises(ConfigValidationError) as info:
        load_eval_config(path, ws)
    assert [i.key for i in info.value.issues] == ["file"]
    assert ".toml" in info.value.issues[0].message


def test_missing_file_and_bad_toml(ws):
    with pytest.raises(ConfigValidationError, match="not found"):
        load_eval_config(ws.eval_configs_dir / "nope.toml", ws)
    issues = eval_issues(ws, "[experiment\nrollout = 1\n")
    assert [i.key for i in issues] == ["file"]
    assert "not valid TOML" in issues[0].message
    path = ws.eval_configs_dir / "latin1.toml"
    path.write_bytes(b'x = "\xe9"\n')
    with pytest.raises(ConfigValidationError, match="not valid TOML"):
        load_eval_config(path, ws)


def test_relative_config_path_resolves_from_cwd(ws, monkeypatch):
    write(ws, "eval", EVAL_OK)
    monkeypatch.chdir(ws.root)
    assert load_eval_config(Path("configs/eval/demo.toml"), ws).name == "demo"


# --- all issues at once, error shape ----------------------------------------------------


MANY_PROBLEMS = """\
rollout = "demo"
[experiment]
rollout = "demo"
entrypoint = "main.py"
model_path = "openai/gpt-5-mini"
datset = "multiply"
branch = "main"
commit_sha = "abc1234"
[evalution]
n = 2
[evaluation]
n = 0
bach_size = 3
pass_threshold = nan
limit = "5"
[env]
_OSMOSIS_ROLLOUT_PORT = "9"
"""


def test_every_issue_is_reported_at_once(ws):
    path = write(ws, "eval", MANY_PROBLEMS)
    with pytest.raises(ConfigValidationError) as info:
        load_eval_config(path, ws)
    error = info.value
    assert isinstance(error, ConfigError)
    assert error.path == path.resolve()
    issues = by_key(error.issues)
    assert set(issues) == {
        "rollout",
        "evalution",
        "secrets",
        "experiment.datset",
        "experiment.dataset",
        "experiment",
        "evaluation.n",
        "evaluation.bach_size",
        "evaluation.pass_threshold",
        "evaluation.limit",
        "env._OSMOSIS_ROLLOUT_PORT",
    }
    assert issues["rollout"] == ConfigIssue("rollout", "Unrecognized key", "experiment.rollout")
    assert issues["evalution"] == ConfigIssue("evalution", "Unrecognized section", "evaluation")
    assert issues["experiment.datset"].key_correction == "experiment.dataset"
    assert issues["evaluation.bach_size"] == ConfigIssue(
        "evaluation.bach_size", "Unrecognized key", "evaluation.batch_size"
    )
    assert "mutually exclusive" in issues["experiment"].message
    assert "required" in issues["experiment.dataset"].message
    assert "reserved" in issues["env._OSMOSIS_ROLLOUT_PORT"].message

    lines = str(error).splitlines()
    assert lines[0] == f"Invalid eval config {path.resolve()}:"
    assert len(lines) == 1 + len(error.issues)
    assert (
        "  - evaluation.bach_size: Unrecognized key (did you mean 'evaluation.batch_size'?)"
        in lines
    )
    assert "  - evaluation.n must be an integer ≥ 1, got 0 (integer)" in lines


def test_details_has_the_cli_shape(ws):
    with pytest.raises(ConfigValidationError) as info:
        load_eval_config(write(ws, "eval", MANY_PROBLEMS), ws)
    details = info.value.details()
    assert details["error"] == "Invalid eval config"
    assert {
        "key": "rollout",
        "message": "Unrecognized key",
        "key_correction": "experiment.rollout",
    } in details["issues"]
    no_correction = next(i for i in details["issues"] if i["key"] == "evaluation.n")
    assert set(no_correction) == {"key", "message"}


def test_unrecognized_names_without_a_close_match_get_no_correction(ws):
    issues = by_key(eval_issues(ws, EVAL_OK + "[zzzz]\nq = 1\n[evaluation]\nqqqqqq = 1\n"))
    assert issues["zzzz"].key_correction is None
    assert issues["evaluation.qqqqqq"].key_correction is None


def test_known_section_that_is_not_a_table(ws):
    issue = by_key(eval_issues(ws, "evaluation = 3\n" + EVAL_OK))["evaluation"]
    assert "must be a table" in issue.message and "3 (integer)" in issue.message


def test_training_sections_are_not_eval_sections(ws):
    issues = by_key(eval_issues(ws, EVAL_OK + "[training]\nlr = 1.0\n"))
    assert issues["training"].message == "Unrecognized section"
    issues = by_key(training_issues(ws, EXPERIMENT + "[evaluation]\nn = 1\n"))
    assert issues["evaluation"].message == "Unrecognized section"


# --- [experiment] -----------------------------------------------------------------------


def test_experiment_section_is_required(ws):
    issues = by_key(eval_issues(ws, "[secrets]\nrequired = []\n"))
    assert set(issues) == {"experiment"}


def test_experiment_values_must_be_non_empty_strings(ws):
    text = EVAL_OK.replace('dataset = "multiply"', 'dataset = ""').replace(
        '"openai/gpt-5-mini"', "3"
    )
    issues = by_key(eval_issues(ws, text))
    assert issues["experiment.dataset"].message == "experiment.dataset must not be empty"
    assert issues["experiment.model_path"].message == (
        "experiment.model_path must be a string, got 3 (integer)"
    )


@pytest.mark.parametrize("rollout", ["a/b", "..", ".", "x\\\\y"])
def test_rollout_must_be_a_single_segment(ws, rollout):
    issue = by_key(eval_issues(ws, EVAL_OK.replace('"demo"', f'"{rollout}"')))["experiment.rollout"]
    assert "single directory name" in issue.message


def test_rollout_directory_must_exist(ws):
    issues = by_key(eval_issues(ws, EVAL_OK.replace('"demo"', '"ghost"')))
    assert "not found" in issues["experiment.rollout"].message
    assert "experiment.entrypoint" not in issues  # not checked against a missing rollout


def test_rollout_symlink_escaping_rollouts_is_rejected(ws, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    (ws.rollouts_dir / "link").symlink_to(outside, target_is_directory=True)
    issues = by_key(eval_issues(ws, EVAL_OK.replace('"demo"', '"link"')))
    assert "experiment.rollout" in issues


@pytest.mark.parametrize(
    ("entrypoint", "fragment"),
    [
        ("../demo2/main.py", "inside rollouts/demo/"),
        ("/etc/hosts", "inside"),
        ("nope.py", "not found"),
    ],
)
def test_entrypoint_must_be_a_file_inside_the_rollout(ws, entrypoint, fragment):
    issue = by_key(eval_issues(ws, EVAL_OK.replace('"main.py"', f'"{entrypoint}"')))[
        "experiment.entrypoint"
    ]
    assert fragment in issue.message


def test_nested_entrypoint_is_fine(ws):
    (ws.rollouts_dir / "demo" / "pkg").mkdir()
    (ws.rollouts_dir / "demo" / "pkg" / "run.py").write_text("")
    config = load_eval_config(write(ws, "eval", EVAL_OK.replace("main.py", "pkg/run.py")), ws)
    assert config.entrypoint_path.name == "run.py"


@pytest.mark.parametrize(
    ("extra", "key", "fragment"),
    [
        ('branch = "has space"', "experiment.branch", "whitespace"),
        ('branch = ""', "experiment.branch", "must not be empty"),
        ('commit_sha = "abc12"', "experiment.commit_sha", "7-40 hex"),
        ('commit_sha = "' + "a" * 41 + '"', "experiment.commit_sha", "7-40 hex"),
        ('commit_sha = "xyz1234"', "experiment.commit_sha", "7-40 hex"),
        ('branch = "main"\ncommit_sha = "' + "f" * 40 + '"', "experiment", "mutually exclusive"),
    ],
)
def test_branch_and_commit_rules(ws, extra, key, fragment):
    text = EXPERIMENT + extra + "\n[secrets]\nrequired = []\n"
    assert fragment in by_key(eval_issues(ws, text))[key].message


# --- [env] and [secrets] ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "key", "fragment"),
    [
        ('_OSMOSIS_ROLLOUT_ARTIFACT_ROOT = "x"', "env._OSMOSIS_ROLLOUT_ARTIFACT_ROOT", "reserved"),
        ('_OSMOSIS_ANYTHING = "x"', "env._OSMOSIS_ANYTHING", "reserved"),
        ('lower = "x"', "env.lower", "must match"),
        ('"1ABC" = "x"', "env.1ABC", "must match"),
        ("NUM = 3", "env.NUM", "must be a string, got 3 (integer)"),
        ("FLAG = true", "env.FLAG", "got True (boolean)"),
    ],
)
def test_env_rules(ws, line, key, fragment):
    assert fragment in by_key(eval_issues(ws, EVAL_OK + f"[env]\n{line}\n"))[key].message


def test_secrets_section_is_required_for_eval_only(ws):
    issue = by_key(eval_issues(ws, EXPERIMENT))["secrets"]
    assert "required = []" in issue.message
    assert load_training_config(write(ws, "training", EXPERIMENT), ws).secrets == ()


@pytest.mark.parametrize(
    ("body", "key", "fragment"),
    [
        ("", "secrets.required", "is required"),
        ('required = "OPENAI_API_KEY"', "secrets.required", "must be a list"),
        ('required = ["lower"]', "secrets.required", "'lower' (string)"),
        ('required = ["_X"]', "secrets.required", "must be names matching"),
        ("required = [1]", "secrets.required", "1 (integer)"),
        ('required = ["A", "A"]', "secrets.required", "more than once"),
        ("required = []\nextra = 1", "secrets.extra", "Unrecognized key"),
    ],
)
def test_secrets_rules(ws, body, key, fragment):
    assert fragment in by_key(eval_issues(ws, EXPERIMENT + f"[secrets]\n{body}\n"))[key].message


def test_secret_may_not_also_be_an_env_var(ws):
    text = EXPERIMENT + '[env]\nTOKEN = "x"\n[secrets]\nrequired = ["TOKEN"]\n'
    assert "also set in [env]" in by_key(eval_issues(ws, text))["secrets.required"].message


# --- value types ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "line", "expected"),
    [
        ("evaluation", "n = 1.5", "evaluation.n must be an integer ≥ 1, got 1.5 (float)"),
        ("evaluation", "n = true", "evaluation.n must be an integer ≥ 1, got True (boolean)"),
        ("evaluation", "limit = 0", "evaluation.limit must be an integer ≥ 1, got 0 (integer)"),
        (
            "evaluation",
            'batch_size = "2"',
            "evaluation.batch_size must be an integer ≥ 1, got '2' (string)",
        ),
        (
            "evaluation",
            "pass_threshold = inf",
            "evaluation.pass_threshold must be a finite number, got inf (float)",
        ),
        (
            "evaluation",
            "grader_timeout_s = 0",
            "evaluation.grader_timeout_s must be a finite number > 0, got 0 (integer)",
        ),
        (
            "evaluation",
            "agent_workflow_timeout_s = -1.0",
            "must be a finite number > 0, got -1.0 (float)",
        ),
    ],
)
def test_eval_value_types(ws, section, line, expected):
    issues = eval_issues(ws, EVAL_OK + f"[{section}]\n{line}\n")
    assert [str(i) for i in issues] == [expected] or expected in issues[0].message
    assert len(issues) == 1


@pytest.mark.parametrize(
    ("section", "line", "key", "fragment"),
    [
        ("training", 'lr = "1e-6"', "training.lr", "a finite number > 0, got '1e-6' (string)"),
        ("training", "lr = 0", "training.lr", "> 0"),
        ("training", "lr = nan", "training.lr", "got nan (float)"),
        (
            "training",
            "total_epochs = 1.0",
            "training.total_epochs",
            "an integer ≥ 1, got 1.0 (float)",
        ),
        ("training", "n_samples_per_prompt = 0", "training.n_samples_per_prompt", "≥ 1"),
        (
            "training",
            "rollout_batch_size = false",
            "training.rollout_batch_size",
            "False (boolean)",
        ),
        ("training", "max_prompt_length = -5", "training.max_prompt_length", "≥ 1"),
        ("training", 'max_response_length = "8k"', "training.max_response_length", "'8k' (string)"),
        ("training", "grader_timeout_s = 0", "training.grader_timeout_s", "> 0"),
        (
            "training",
            'loss_type = "ppo"',
            "training.loss_type",
            "one of 'grpo', 'dapo', 'dr_grpo', 'bnpo', got 'ppo'",
        ),
        ("training", "kl_coef = -0.1", "training.kl_coef", "≥ 0, got -0.1"),
        ("training", "seed = -1", "training.seed", "an integer ≥ 0"),
        ("training", "seed = 1.5", "training.seed", "an integer ≥ 0"),
        (
            "training",
            'report_to = "wandb"',
            "training.report_to",
            "a list of 'tensorboard', 'wandb', 'mlflow'",
        ),
        (
            "training",
            'report_to = ["wandb", "comet"]',
            "training.report_to",
            "['wandb', 'comet'] (array)",
        ),
        ("sampling", "rollout_temperature = -1", "sampling.rollout_temperature", "≥ 0"),
        ("sampling", "rollout_top_p = 1.5", "sampling.rollout_top_p", "> 0 and ≤ 1, got 1.5"),
        ("sampling", "rollout_top_p = 0", "sampling.rollout_top_p", "> 0"),
        ("checkpoints", "eval_interval = -1", "checkpoints.eval_interval", "≥ 0"),
        (
            "checkpoints",
            'checkpoint_save_freq = "20"',
            "checkpoints.checkpoint_save_freq",
            "'20' (string)",
        ),
        ("lora", 'enabled = "yes"', "lora.enabled", "must be true or false, got 'yes' (string)"),
        ("lora", "enabled = 1", "lora.enabled", "true or false"),
        ("lora", "rank = 0", "lora.rank", "an integer ≥ 1"),
        ("lora", "alpha = 1.5", "lora.alpha", "an integer ≥ 1"),
        ("lora", "dropout = 1.0", "lora.dropout", "≥ 0 and < 1, got 1.0"),
        ("lora", "dropout = -0.1", "lora.dropout", "≥ 0 and < 1"),
        ("lora", "target_modules = []", "lora.target_modules", "'all-linear' or a non-empty list"),
        ("lora", 'target_modules = "q_proj"', "lora.target_modules", "got 'q_proj'"),
        (
            "lora",
            'target_modules = ["q", 1]',
            "lora.target_modules",
            "non-empty list of module names",
        ),
        ("warmup", "sft_steps = -1", "warmup.sft_steps", "an integer ≥ 0"),
        ("warmup", "lr = 0.0", "warmup.lr", "> 0"),
        ("warmup", "batch_size = 0", "warmup.batch_size", "an integer ≥ 1"),
    ],
)
def test_training_value_types(ws, section, line, key, fragment):
    issues = training_issues(ws, EXPERIMENT + f"[{section}]\n{line}\n")
    assert [i.key for i in issues] == [key]
    assert issues[0].message.startswith(f"{key} must be ")
    assert fragment in issues[0].message


def test_every_typed_section_rejects_unknown_keys_with_a_suggestion(ws):
    text = EXPERIMENT + textwrap.dedent(
        """\
        [training]
        learning_rate = 1e-5
        [sampling]
        temperature = 0.7
        [checkpoints]
        eval_intervall = 5
        [lora]
        ranks = 4
        [warmup]
        sft_step = 2
        """
    )
    issues = by_key(training_issues(ws, text))
    assert {key: issue.key_correction for key, issue in issues.items()} == {
        "training.learning_rate": None,
        "sampling.temperature": "sampling.rollout_temperature",
        "checkpoints.eval_intervall": "checkpoints.eval_interval",
        "lora.ranks": "lora.rank",
        "warmup.sft_step": "warmup.sft_steps",
    }
    assert all(issue.message == "Unrecognized key" for issue in issues.values())


def test_env_and_advanced_are_free_form(ws):
    text = (
        EXPERIMENT + '[env]\nANY_NAME = "v"\n[advanced]\nwhatever = 1\n[advanced.nested]\nx = "y"\n'
    )
    config = load_training_config(write(ws, "training", text), ws)
    assert config.env == {"ANY_NAME": "v"}
    assert config.advanced == {"whatever": 1, "nested": {"x": "y"}}


# --- configs parsed from tables (a platform run's sections) -----------------------------------

TRAINING_TABLES = """\
[training]
lr = 3e-4
total_epochs = 2

[checkpoints]
eval_interval = 0

[advanced]
seed = 7
note = { kept = true }

[advanced.lora]
enabled = true
rank = 4
"""


def test_a_config_parsed_from_tables_is_the_config_its_file_loads_to(ws):
    import dataclasses
    import tomllib

    from osmosis_ai.workspace.config import parse_eval_config, parse_training_config

    text = EXPERIMENT + TRAINING_TABLES
    path = write(ws, "training", text)
    loaded = load_training_config(path, ws)
    parsed = parse_training_config(tomllib.loads(text), path=path, workspace=ws)
    assert loaded.from_file and not parsed.from_file
    assert parsed == dataclasses.replace(loaded, from_file=False)
    assert (parsed.training.seed, parsed.lora.rank, parsed.checkpoints.eval_interval) == (7, 4, 0)

    path = ws.configs_dir / "eval" / "never-written.toml"
    tables = tomllib.loads(EVAL_OK + "[evaluation]\nn = 2\n")
    config = parse_eval_config(tables, path=path, workspace=ws)
    assert (config.name, config.evaluation.n, config.raw) == ("never-written", 2, tables)
    assert not path.exists()  # only named


def test_tables_are_checked_by_the_rules_a_file_is(ws):
    import tomllib

    from osmosis_ai.workspace.config import parse_training_config

    text = EXPERIMENT + "[training]\nlr = -1\n[advanced]\nseed = -1\n[advanced.ray]\nport = 1\n"
    expected = [issue.to_dict() for issue in training_issues(ws, text)]
    with pytest.raises(ConfigValidationError) as info:
        parse_training_config(
            tomllib.loads(text), path=ws.configs_dir / "training" / "x.toml", workspace=ws
        )
    assert [issue.to_dict() for issue in info.value.issues] == expected
    assert [i["key"] for i in expected] == ["training.lr", "advanced.seed", "advanced.ray.port"]
