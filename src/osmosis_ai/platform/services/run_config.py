"""What an eval or training run submit carries, checked before anything is looked up.

The CLI sends the sections of the run's TOML (reference §4.4–4.5) as they were written:
``experiment_config`` (required: ``rollout``, ``entrypoint``, ``model_path``, ``dataset``;
optionally ``branch`` or ``commit_sha``), the kind's own sections (``evaluation_config``;
or ``training_config``, ``sampling_config``, ``checkpoints_config``), ``advanced_config``
(passed through as is, but for the trainer's settings in it), ``env_config`` and
``secrets {required, provided?}``. The sections are checked by the rules of the workspace's
config loader (:func:`osmosis_ai.workspace.sections.parse_sections`), the ones a worker
applies again when it builds the run's config; what is checked here alone is the platform's
own: sizes, JSON nulls (unset), the experiment's plain values, env and secret names. Every
problem is collected and reported together as one 400 ``VALIDATION`` with
``details.issues`` (``{key, message, key_correction?}``), the way ``osmosis`` reports a bad
config. Secret values are never part of a message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from osmosis_ai.platform.errors import InvalidRequestError
from osmosis_ai.workspace.config import ENV_NAME, RESERVED_ENV_PREFIX, SECRET_NAME
from osmosis_ai.workspace.issues import ConfigIssue
from osmosis_ai.workspace.sections import (
    ADVANCED_ONLY_TABLES,
    ADVANCED_TABLES,
    ADVANCED_TRAINING_KEYS,
    parse_sections,
)

KINDS = ("eval", "training")
ROLLOUTS_DIR = "rollouts"
MAX_SECTION_BYTES = 64 * 1024
MAX_ENV_VARS = 200
MAX_ENV_VALUE_BYTES = 32 * 1024
MAX_SECRETS = 100
MAX_SECRET_VALUE_BYTES = 64 * 1024

_ROLLOUT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,254}$")
_COMMIT = re.compile(r"^[0-9a-fA-F]{7,40}$")
EXPERIMENT_KEYS = ("rollout", "entrypoint", "model_path", "dataset", "branch", "commit_sha")

Issue = dict[str, str]
# The sections each kind's submit carries besides advanced_config (the TOML's tables of the
# same names; [lora] and [warmup] travel inside advanced_config).
SECTIONS: dict[str, tuple[str, ...]] = {
    "eval": ("evaluation",),
    "training": ("training", "sampling", "checkpoints"),
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
    """The kind's sections without their null values; unknown sections, values that are not
    JSON and what the config loader's rules refuse go to ``issues``."""
    kept: dict[str, dict[str, object]] = {}
    for name, table in sections.items():
        if table is None:
            continue
        key = f"{name}_config"
        if name != "advanced" and name not in SECTIONS[kind]:
            issues.append({"key": key, "message": f"is not part of a{_article(kind)} run"})
            continue
        if (problem := _json_problem(table)) is not None:
            issues.append({"key": key, "message": problem})
            continue
        cleaned = _without_nulls(table, typed=ADVANCED_TABLES + ADVANCED_ONLY_TABLES)
        if cleaned:
            kept[name] = cleaned
    checked = dict(kept)
    if kind == "training" and "training" in kept:
        checked["training"] = _trainer_settings_out(kept["training"], issues)
    found: list[ConfigIssue] = []
    parse_sections("eval" if kind == "eval" else "training", checked, found)
    issues.extend(_issue(problem) for problem in found)
    return kept


def _without_nulls(table: Mapping[str, object], *, typed: tuple[str, ...]) -> dict[str, object]:
    """``table`` without its null values (JSON's way to leave a setting unset), nor those of
    its ``typed`` tables."""
    cleaned: dict[str, object] = {}
    for key, value in table.items():
        if isinstance(value, dict) and key in typed:
            cleaned[key] = _without_nulls(value, typed=())  # pyright: ignore[reportUnknownArgumentType]
        elif value is not None:
            cleaned[key] = value
    return cleaned


def _trainer_settings_out(training: Mapping[str, object], issues: list[Issue]) -> dict[str, object]:
    """``training_config`` without the trainer's own settings, which the platform takes in
    ``advanced_config`` only (as the hosted platform does): each one found is an issue."""
    for item in training:
        if item in ADVANCED_TRAINING_KEYS:
            issues.append(
                {
                    "key": f"training_config.{item}",
                    "message": f"set it under [advanced] ({item} = ...): the "
                    "platform reads the trainer's own settings from advanced_config",
                }
            )
    return {k: v for k, v in training.items() if k not in ADVANCED_TRAINING_KEYS}


def _issue(problem: ConfigIssue) -> Issue:
    """A config loader's issue (``advanced.lora.rank``) as the submit's (its section named
    ``advanced_config``); the message without the key it starts with."""
    issue = {
        "key": _submitted_key(problem.key),
        "message": problem.message.removeprefix(f"{problem.key} "),
    }
    if problem.key_correction is not None:
        issue["key_correction"] = _submitted_key(problem.key_correction)
    return issue


def _submitted_key(key: str) -> str:
    section, dot, rest = key.partition(".")
    return f"{section}_config{dot}{rest}"


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
        if not ENV_NAME.match(name):
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
        if not SECRET_NAME.match(name):
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
