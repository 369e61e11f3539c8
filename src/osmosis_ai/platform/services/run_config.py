"""What an eval or training run submit carries, checked before anything is looked up.

The CLI sends the sections of the run's TOML (reference §4.4–4.5) as they were written:
``experiment_config`` (required: ``rollout``, ``entrypoint``, ``model_path``, ``dataset``;
optionally ``branch`` or ``commit_sha``), the kind's own sections (``evaluation_config``;
or ``training_config``, ``sampling_config``, ``checkpoints_config``), ``advanced_config``
(passed through as is), ``env_config`` and ``secrets {required, provided?}``. Every problem
is collected and reported together as one 400 ``VALIDATION`` with ``details.issues``
(``{key, message}``), the way ``osmosis`` reports a bad config. Secret values are never
part of a message.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from osmosis_ai.platform.errors import InvalidRequestError
from osmosis_ai.workspace.sections import LOSS_TYPES, REPORT_TARGETS

KINDS = ("eval", "training")
ROLLOUTS_DIR = "rollouts"
MAX_SECTION_BYTES = 64 * 1024
MAX_ENV_VARS = 200
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_SECRETS = 100
MAX_SECRET_VALUE_BYTES = 64 * 1024

_ROLLOUT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")
_COMMIT = re.compile(r"^[0-9a-fA-F]{7,40}$")
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
_SECRET_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
RESERVED_ENV_PREFIX = "_OSMOSIS_"
EXPERIMENT_KEYS = ("rollout", "entrypoint", "model_path", "dataset", "branch", "commit_sha")

Issue = dict[str, str]
Check = Callable[[object], str | None]  # the problem with a value, or None


def _integer(minimum: int) -> Check:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return f"must be an integer, got {_shown(value)}"
        return None if value >= minimum else f"must be {minimum} or more, got {value}"

    return check


def _number(*, low: float, low_open: bool, high: float | None = None) -> Check:
    def check(value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be a number, got {_shown(value)}"
        if not math.isfinite(value):
            return f"must be a finite number, got {value}"
        if value < low or (low_open and value == low):
            return f"must be {'more than' if low_open else 'at least'} {low:g}, got {value:g}"
        if high is not None and value > high:
            return f"must be at most {high:g}, got {value:g}"
        return None

    return check


def _any_finite(value: object) -> str | None:
    return _number(low=-math.inf, low_open=False)(value)


POSITIVE_INT = _integer(1)
POSITIVE = _number(low=0.0, low_open=True)

# The keys each kind's sections may hold, and what their values must be.
SECTIONS: dict[str, dict[str, dict[str, Check]]] = {
    "eval": {
        "evaluation": {
            "limit": POSITIVE_INT,
            "n": POSITIVE_INT,
            "batch_size": POSITIVE_INT,
            "pass_threshold": _any_finite,
            "agent_workflow_timeout_s": POSITIVE,
            "grader_timeout_s": POSITIVE,
        },
    },
    "training": {
        "training": {
            "lr": POSITIVE,
            "total_epochs": POSITIVE_INT,
            "n_samples_per_prompt": POSITIVE_INT,
            "rollout_batch_size": POSITIVE_INT,
            "max_prompt_length": POSITIVE_INT,
            "max_response_length": POSITIVE_INT,
            "agent_workflow_timeout_s": POSITIVE,
            "grader_timeout_s": POSITIVE,
        },
        "sampling": {
            "rollout_temperature": _number(low=0.0, low_open=False),
            "rollout_top_p": _number(low=0.0, low_open=True, high=1.0),
        },
        "checkpoints": {
            "eval_interval": POSITIVE_INT,
            "checkpoint_save_freq": POSITIVE_INT,
        },
    },
}


def _one_of(options: tuple[str, ...]) -> Check:
    def check(value: object) -> str | None:
        if isinstance(value, str) and value in options:
            return None
        return f"must be one of {', '.join(repr(o) for o in options)}, got {_shown(value)}"

    return check


def _subset_of(options: tuple[str, ...]) -> Check:
    def check(value: object) -> str | None:
        if isinstance(value, list) and all(isinstance(v, str) and v in options for v in value):  # pyright: ignore[reportUnknownVariableType]
            return None
        return f"must be a list of {', '.join(repr(o) for o in options)}, got {_shown(value)}"

    return check


def _boolean(value: object) -> str | None:
    return None if isinstance(value, bool) else f"must be true or false, got {_shown(value)}"


def _fraction(value: object) -> str | None:
    problem = _number(low=0.0, low_open=False, high=1.0)(value)
    if problem is None and value == 1:
        return "must be less than 1, got 1"
    return problem


def _modules(value: object) -> str | None:
    if value == "all-linear":
        return None
    if isinstance(value, list) and value and all(isinstance(v, str) and v for v in value):  # pyright: ignore[reportUnknownVariableType]
        return None
    return f"must be 'all-linear' or a non-empty list of module names, got {_shown(value)}"


def _names(value: object) -> str | None:
    if isinstance(value, list) and all(isinstance(v, str) and v for v in value):  # pyright: ignore[reportUnknownVariableType]
        return None
    return f"must be a list of module names, got {_shown(value)}"


def _string(value: object) -> str | None:
    return None if isinstance(value, str) else f"must be a string, got {_shown(value)}"


# Settings of the embedded trainer that ride in advanced_config under their own names (the
# hosted platform's CLI refuses them elsewhere but forwards [advanced] as written): keys of
# advanced_config itself, and the tables advanced_config.warmup / .lora / .ray.
ADVANCED_KEYS: dict[str, Check] = {
    "loss_type": _one_of(LOSS_TYPES),
    "kl_coef": _number(low=0.0, low_open=False),
    "seed": _integer(0),
    "report_to": _subset_of(REPORT_TARGETS),
    "lr_warmup_steps": _integer(0),
    "no_signal_patience": _integer(0),  # 0: never fail a run for lack of a learning signal
}
ADVANCED_TABLES: dict[str, dict[str, Check]] = {
    "warmup": {
        "sft_steps": _integer(0),
        "lr": POSITIVE,
        "batch_size": POSITIVE_INT,
    },
    "lora": {
        "enabled": _boolean,
        "rank": POSITIVE_INT,
        "alpha": POSITIVE_INT,
        "dropout": _fraction,
        "target_modules": _modules,
        "modules_to_save": _names,
    },
    # osmosis train run across a Ray cluster (workspace.sections.RaySection)
    "ray": {
        "address": _string,
        "trainer_workers": _integer(0),
        "rollout_servers": _integer(0),
        "max_failures": _integer(0),
    },
}


@dataclass(frozen=True)
class Experiment:
    rollout: str
    entrypoint: str  # relative to rollouts/<rollout>/, normalized (no "./")
    model_path: str
    dataset: str
    branch: str | None
    commit_sha: str | None  # lower-case hex, 7 to 40 characters

    @property
    def rollout_dir(self) -> str:
        return f"{ROLLOUTS_DIR}/{self.rollout}"

    @property
    def entrypoint_path(self) -> str:
        return f"{self.rollout_dir}/{self.entrypoint}"


@dataclass(frozen=True)
class Submission:
    """A checked submit. ``provided_secrets`` holds values: it is left out of the repr."""

    kind: str
    experiment: Experiment
    experiment_config: dict[str, object]
    sections: dict[str, dict[str, object]]  # evaluation/training/sampling/checkpoints/advanced
    env: dict[str, str]
    required_secrets: list[str]
    provided_secrets: dict[str, str] = field(default_factory=dict[str, str], repr=False)


class InvalidRunConfigError(InvalidRequestError):
    """A run submit with problems in its config; ``details.issues`` lists every one."""

    def __init__(self, kind: str, issues: list[Issue]) -> None:
        label = "eval" if kind == "eval" else "training"
        summary = "; ".join(f"{i['key']}: {i['message']}" for i in issues[:5])
        more = f" (and {len(issues) - 5} more)" if len(issues) > 5 else ""
        super().__init__(
            f"Invalid {label} config: {summary}{more}",
            field=issues[0]["key"],
            details={"error": f"Invalid {label} config", "issues": issues},
        )
        self.issues = issues


def check_submission(
    kind: str,
    *,
    experiment_config: Mapping[str, object],
    sections: Mapping[str, Mapping[str, object] | None],
    env_config: Mapping[str, object] | None,
    required_secrets: list[str] | None,
    provided_secrets: Mapping[str, str] | None,
) -> Submission:
    """The submit as a :class:`Submission`; :class:`InvalidRunConfigError` lists every problem.

    ``sections`` maps section names without ``_config`` (``evaluation``, ``advanced``, ...)
    to their tables; a section another kind uses is a problem too.
    """
    if kind not in KINDS:
        raise ValueError(f"not a run kind: {kind!r}")
    issues: list[Issue] = []
    experiment = _experiment(experiment_config, issues)
    kept = _sections(kind, sections, issues)
    env = _env(env_config, issues)
    required = _required(required_secrets, issues)
    provided = dict(provided_secrets or {})
    for name, value in provided.items():
        if name not in required:
            issues.append(
                {
                    "key": f"secrets.provided.{name}",
                    "message": "is not in secrets.required; list every secret the run uses there",
                }
            )
        elif not value:
            issues.append({"key": f"secrets.provided.{name}", "message": "the value is empty"})
        elif len(value.encode("utf-8")) > MAX_SECRET_VALUE_BYTES:
            issues.append(
                {
                    "key": f"secrets.provided.{name}",
                    "message": f"the value is longer than {MAX_SECRET_VALUE_BYTES} bytes",
                }
            )
    for name in sorted(set(env) & set(required)):
        issues.append(
            {
                "key": f"env_config.{name}",
                "message": "is also in secrets.required; each variable must come from one place",
            }
        )
    if issues:
        raise InvalidRunConfigError(kind, issues)
    assert experiment is not None
    return Submission(
        kind=kind,
        experiment=experiment,
        experiment_config=dict(experiment_config),
        sections=kept,
        env=env,
        required_secrets=required,
        provided_secrets=provided,
    )


def _sections(
    kind: str, sections: Mapping[str, Mapping[str, object] | None], issues: list[Issue]
) -> dict[str, dict[str, object]]:
    """The kind's sections without their null values; unknown sections and keys, values
    that are not JSON and values a check refuses go to ``issues``."""
    kept: dict[str, dict[str, object]] = {}
    allowed = SECTIONS[kind]
    for name, table in sections.items():
        if table is None:
            continue
        key = f"{name}_config"
        if name != "advanced" and name not in allowed:
            issues.append({"key": key, "message": f"is not part of a{_article(kind)} run"})
            continue
        if (problem := _json_problem(table)) is not None:
            issues.append({"key": key, "message": problem})
            continue
        if name == "advanced" and kind == "training":
            _advanced(table, sections, issues)
        if name != "advanced":
            for item, value in table.items():
                check = allowed[name].get(item)
                if check is None and kind == "training" and item in ADVANCED_KEYS:
                    issues.append(
                        {
                            "key": f"{key}.{item}",
                            "message": f"set it under [advanced] ({item} = ...): the "
                            "platform reads the trainer's own settings from advanced_config",
                        }
                    )
                elif check is None:
                    known = ", ".join(allowed[name])
                    issues.append(
                        {"key": f"{key}.{item}", "message": f"Unrecognized key (known: {known})"}
                    )
                elif value is not None and (problem := check(value)) is not None:
                    issues.append({"key": f"{key}.{item}", "message": problem})
        cleaned = {k: v for k, v in table.items() if v is not None}
        if cleaned:
            kept[name] = cleaned
    return kept


def _advanced(
    table: Mapping[str, object],
    sections: Mapping[str, Mapping[str, object] | None],
    issues: list[Issue],
) -> None:
    """Check the trainer settings of ``advanced_config`` (other keys pass as written); a
    setting also given in its own section is refused, naming both places."""
    training = sections.get("training") or {}
    for item, check in ADVANCED_KEYS.items():
        value = table.get(item)
        if value is None:
            continue
        if item in training:
            issues.append(
                {
                    "key": f"advanced_config.{item}",
                    "message": "is set both in training_config and in advanced_config; "
                    "keep one ([advanced])",
                }
            )
        elif (problem := check(value)) is not None:
            issues.append({"key": f"advanced_config.{item}", "message": problem})
    for name, checks in ADVANCED_TABLES.items():
        value = table.get(name)
        if value is None:
            continue
        key = f"advanced_config.{name}"
        if not isinstance(value, dict):
            issues.append({"key": key, "message": f"must be a table, got {_shown(value)}"})
            continue
        for item, inner in value.items():  # pyright: ignore[reportUnknownVariableType]
            check = checks.get(str(item))  # pyright: ignore[reportUnknownArgumentType]
            if check is None:
                known = ", ".join(checks)
                issues.append(
                    {"key": f"{key}.{item}", "message": f"Unrecognized key (known: {known})"}
                )
            elif inner is not None and (problem := check(inner)) is not None:
                issues.append({"key": f"{key}.{item}", "message": problem})


def _experiment(config: Mapping[str, object], issues: list[Issue]) -> Experiment | None:
    before = len(issues)
    values = _experiment_values(config, issues)
    rollout = values.get("rollout")
    if rollout is not None and (not _ROLLOUT.match(rollout) or rollout in (".", "..")):
        issues.append(
            {
                "key": "experiment_config.rollout",
                "message": f"{rollout!r} is not a folder name under rollouts/ (one path "
                "segment of letters, digits, '.', '_' and '-')",
            }
        )
    entrypoint = values.get("entrypoint")
    if entrypoint is not None:
        normalized = _relative_path(entrypoint)
        if normalized is None:
            issues.append(
                {
                    "key": "experiment_config.entrypoint",
                    "message": f"{entrypoint!r} must be a relative path inside "
                    "rollouts/<rollout>/ (e.g. main.py), without '..'",
                }
            )
        values["entrypoint"] = normalized
    branch = values.get("branch")
    if branch is not None and not _branch_ok(branch):
        issues.append(
            {
                "key": "experiment_config.branch",
                "message": f"{branch!r} is not a branch name (no spaces, control characters, "
                "'..', or leading '-')",
            }
        )
    commit = values.get("commit_sha")
    if commit is not None and not _COMMIT.match(commit):
        issues.append(
            {
                "key": "experiment_config.commit_sha",
                "message": f"must be a hexadecimal Git commit SHA (7-40 hex characters), got "
                f"{commit!r}",
            }
        )
    if branch is not None and commit is not None:
        issues.append(
            {
                "key": "experiment_config.commit_sha",
                "message": "Provide either branch or commit_sha, not both",
            }
        )
    if len(issues) > before:
        return None
    return Experiment(
        rollout=str(values["rollout"]),
        entrypoint=str(values["entrypoint"]),
        model_path=str(values["model_path"]),
        dataset=str(values["dataset"]),
        branch=branch,
        commit_sha=commit.lower() if commit is not None else None,
    )


def _experiment_values(config: Mapping[str, object], issues: list[Issue]) -> dict[str, str | None]:
    """``experiment_config``'s known keys, stripped (``None`` for an unset optional one);
    unknown keys and missing or non-string values go to ``issues``."""
    for key in config:
        if key not in EXPERIMENT_KEYS:
            issues.append(
                {
                    "key": f"experiment_config.{key}",
                    "message": f"Unrecognized key (known: {', '.join(EXPERIMENT_KEYS)})",
                }
            )
    values: dict[str, str | None] = {}
    for key in EXPERIMENT_KEYS:
        value = config.get(key)
        optional = key in ("branch", "commit_sha")
        if value is None and optional:
            values[key] = None
        elif not isinstance(value, str) or not value.strip():
            what = "is required" if value is None else f"must be a non-empty string, got {value!r}"
            issues.append({"key": f"experiment_config.{key}", "message": what})
        else:
            values[key] = value.strip()
    return values


def _relative_path(path: str) -> str | None:
    if "\\" in path or "\0" in path or path.startswith("/") or len(path) > 500:
        return None
    parts = [part for part in PurePosixPath(path).parts if part != "."]
    if not parts or any(part == ".." for part in parts):
        return None
    return "/".join(parts)


def _branch_ok(branch: str) -> bool:
    if len(branch) > 255 or branch.startswith(("-", "/")) or branch.endswith(("/", ".lock")):
        return False
    if ".." in branch or "@{" in branch or "//" in branch:
        return False
    return not any(c.isspace() or ord(c) < 32 or c in "~^:?*[\\\x7f" for c in branch)


def _env(config: Mapping[str, object] | None, issues: list[Issue]) -> dict[str, str]:
    env: dict[str, str] = {}
    if not config:
        return env
    if len(config) > MAX_ENV_VARS:
        issues.append({"key": "env_config", "message": f"has more than {MAX_ENV_VARS} variables"})
        return env
    for name, value in config.items():
        key = f"env_config.{name}"
        if not _ENV_NAME.match(name):
            issues.append(
                {"key": key, "message": "must be an environment variable name ([A-Z_][A-Z0-9_]*)"}
            )
        elif name.startswith(RESERVED_ENV_PREFIX):
            issues.append(
                {"key": key, "message": f"names starting {RESERVED_ENV_PREFIX} are reserved"}
            )
        elif not isinstance(value, str):
            issues.append({"key": key, "message": f"must be a string, got {_shown(value)}"})
        elif len(value.encode("utf-8")) > MAX_ENV_VALUE_BYTES:
            issues.append(
                {"key": key, "message": f"the value is longer than {MAX_ENV_VALUE_BYTES} bytes"}
            )
        else:
            env[name] = value
    return env


def _required(names: list[str] | None, issues: list[Issue]) -> list[str]:
    required: list[str] = []
    for name in names or []:
        if not _SECRET_NAME.match(name):
            issues.append(
                {
                    "key": f"secrets.required.{name}",
                    "message": "must be a secret name ([A-Z][A-Z0-9_]*, e.g. OPENAI_API_KEY)",
                }
            )
        elif name in required:
            issues.append({"key": f"secrets.required.{name}", "message": "is listed twice"})
        else:
            required.append(name)
    if len(required) > MAX_SECRETS:
        issues.append({"key": "secrets.required", "message": f"lists more than {MAX_SECRETS}"})
    return required


def _json_problem(table: Mapping[str, object]) -> str | None:
    try:
        size = len(json.dumps(table, allow_nan=False).encode("utf-8"))
    except (TypeError, ValueError):
        return "must hold JSON values only (no NaN or infinity)"
    return f"is larger than {MAX_SECTION_BYTES} bytes" if size > MAX_SECTION_BYTES else None


def _shown(value: object) -> str:
    kind = type(value).__name__
    return f"{value!r} ({kind})" if len(repr(value)) <= 40 else kind


def _article(kind: str) -> str:
    return "n eval" if kind == "eval" else " training"
