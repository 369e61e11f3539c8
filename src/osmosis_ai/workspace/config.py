"""Loading and validating eval and training TOML configs (``configs/eval|training/*.toml``).

Every problem in a file is collected first and raised together as one
:class:`ConfigValidationError`, so a user fixes a config in one pass.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from osmosis_ai.workspace.issues import (
    ConfigIssue,
    ConfigKind,
    ConfigValidationError,
    closest,
    describe_value,
)
from osmosis_ai.workspace.layout import Workspace
from osmosis_ai.workspace.sections import (
    ADVANCED_TABLES,  # noqa: F401  # pyright: ignore[reportUnusedImport]
    ADVANCED_TRAINING_KEYS,  # noqa: F401  # pyright: ignore[reportUnusedImport]
    TYPED_SECTIONS,
    CheckpointsSection,
    EvaluationSection,
    LoraSection,
    RaySection,
    SamplingSection,
    TrainingSection,
    WarmupSection,
    parse_sections,
    unknown_key,
)

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
SECRET_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
RESERVED_ENV_PREFIX = "_OSMOSIS_"
_COMMIT_SHA = re.compile(r"^[0-9a-fA-F]{7,40}$")
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
_LOCAL_PREFIX = "local:"
_EXPERIMENT_REQUIRED = ("rollout", "entrypoint", "model_path", "dataset")
_EXPERIMENT_KEYS = (*_EXPERIMENT_REQUIRED, "branch", "commit_sha")
_FREE_SECTIONS = ("env", "advanced")


@dataclass(frozen=True)
class Experiment:
    """``[experiment]``: what runs (rollout + entrypoint), against which model and dataset."""

    rollout: str
    entrypoint: str
    model_path: str
    dataset: str
    branch: str | None = None
    commit_sha: str | None = None


@dataclass(frozen=True)
class _RunConfig:
    path: Path  # the file it was read from, or (parsed from tables) the file it stands for
    from_file: bool  # False: parsed from tables, nothing was read from path
    workspace: Workspace
    experiment: Experiment
    env: dict[str, str]
    secrets: tuple[str, ...]
    advanced: dict[str, object]
    raw: dict[str, object]  # the parsed TOML as written, for the run manifest
    rollout_dir: Path
    entrypoint_path: Path
    model_dir: Path | None  # set when model_path names a local directory

    @property
    def name(self) -> str:
        """The config file's stem (``configs/eval/multiply.toml`` → ``multiply``)."""
        return self.path.stem


@dataclass(frozen=True)
class EvalConfig(_RunConfig):
    """A validated ``configs/eval/*.toml``."""

    evaluation: EvaluationSection


@dataclass(frozen=True)
class TrainingConfig(_RunConfig):
    """A validated ``configs/training/*.toml``."""

    training: TrainingSection
    sampling: SamplingSection
    checkpoints: CheckpointsSection
    lora: LoraSection
    warmup: WarmupSection
    ray: RaySection = field(default_factory=RaySection)


def load_eval_config(path: Path, workspace: Workspace) -> EvalConfig:
    """Load ``path`` (under ``configs/eval/``) or raise :class:`ConfigValidationError`."""
    return _eval_config(_Loader("eval", path, workspace))


def load_training_config(path: Path, workspace: Workspace) -> TrainingConfig:
    """Load ``path`` (under ``configs/training/``) or raise :class:`ConfigValidationError`."""
    return _training_config(_Loader("training", path, workspace))


def parse_eval_config(
    tables: Mapping[str, object], *, path: Path, workspace: Workspace
) -> EvalConfig:
    """The eval config ``tables`` hold (what TOML parses a config file to), checked by the
    rules :func:`load_eval_config` applies; ``path`` only names it (no file is read)."""
    return _eval_config(_Loader("eval", path, workspace, tables))


def parse_training_config(
    tables: Mapping[str, object], *, path: Path, workspace: Workspace
) -> TrainingConfig:
    """The training config ``tables`` hold, checked by the rules of
    :func:`load_training_config`; ``path`` only names it (no file is read)."""
    return _training_config(_Loader("training", path, workspace, tables))


def _eval_config(loader: _Loader) -> EvalConfig:
    common = loader.common()
    sections = parse_sections("eval", loader.raw, loader.issues)
    loader.raise_if_issues()
    return EvalConfig(**common, **sections)


def _training_config(loader: _Loader) -> TrainingConfig:
    common = loader.common()
    sections = parse_sections("training", loader.raw, loader.issues)
    loader.raise_if_issues()
    return TrainingConfig(**common, **sections)


class _Loader:
    """One validation pass over one file; ``issues`` grows as checks run."""

    def __init__(
        self,
        kind: ConfigKind,
        path: Path,
        workspace: Workspace,
        tables: Mapping[str, object] | None = None,
    ) -> None:
        self.kind: ConfigKind = kind
        self.path = Path(path).expanduser().resolve()
        self.workspace = workspace
        self.issues: list[ConfigIssue] = []
        self.from_file = tables is None
        self.raw = self._read() if tables is None else dict(tables)

    def fail(self, key: str, message: str, correction: str | None = None) -> None:
        self.issues.append(ConfigIssue(key, message, correction))

    def raise_if_issues(self) -> None:
        if self.issues:
            raise self.error()

    def error(self) -> ConfigValidationError:
        return ConfigValidationError(self.kind, self.path, self.issues)

    def _read(self) -> dict[str, object]:
        home = self.workspace.root / "configs" / self.kind
        if not self.path.is_relative_to(home.resolve()):
            self.fail(
                "file", f"file must be under {home}/ for {self.kind} configs, got {self.path}"
            )
        if self.path.suffix != ".toml":
            self.fail("file", f"file must end in .toml, got {self.path.name!r}")
        if not self.path.is_file():
            self.fail("file", f"file not found: {self.path}")
            raise self.error()
        try:
            return tomllib.loads(self.path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            self.fail("file", f"file is not valid TOML: {exc}")
        except OSError as exc:
            self.fail("file", f"file cannot be read: {exc.strerror or exc}")
        raise self.error()

    def table(self, section: str) -> dict[str, object]:
        """The section's table, or ``{}`` when absent or not a table (an issue is recorded)."""
        value = self.raw.get(section, {})
        return value if isinstance(value, dict) else {}

    def common(self) -> dict[str, Any]:
        """Check the sections shared by both kinds; the fields of :class:`_RunConfig`."""
        self._check_sections()
        experiment, rollout_dir, entrypoint_path, model_dir = self._experiment()
        env = self._env()
        secrets = self._secrets(env)
        return {
            "path": self.path,
            "from_file": self.from_file,
            "workspace": self.workspace,
            "experiment": experiment,
            "env": env,
            "secrets": secrets,
            "advanced": self.table("advanced"),
            "raw": self.raw,
            "rollout_dir": rollout_dir,
            "entrypoint_path": entrypoint_path,
            "model_dir": model_dir,
        }

    def _check_sections(self) -> None:
        typed = TYPED_SECTIONS[self.kind]
        known = ("experiment", *typed, "secrets", *_FREE_SECTIONS)
        keys_of = {"experiment": _EXPERIMENT_KEYS, "secrets": ("required",)}
        keys_of |= {name: tuple(f.name for f in fields(cls)) for name, cls in typed.items()}
        for name, value in self.raw.items():
            if name in known:
                if not isinstance(value, dict):
                    self.fail(
                        name, f"{name} must be a table ([{name}]), got {describe_value(value)}"
                    )
            elif isinstance(value, dict):
                self.fail(name, "Unrecognized section", closest(name, known))
            else:
                home = next((s for s, keys in keys_of.items() if name in keys), None)
                self.fail(name, "Unrecognized key", f"{home}.{name}" if home else None)
        if "experiment" not in self.raw:
            self.fail("experiment", "experiment section is required ([experiment])")
        if self.kind == "eval" and "secrets" not in self.raw:
            self.fail(
                "secrets",
                "secrets section is required in eval configs: add [secrets] with "
                "required = [] when the rollout needs none",
            )

    def _experiment(self) -> tuple[Experiment | None, Path | None, Path | None, Path | None]:
        table = self.table("experiment")
        values: dict[str, str] = {}
        for key, value in table.items():
            if key not in _EXPERIMENT_KEYS:
                self.issues.append(unknown_key("experiment", key, _EXPERIMENT_KEYS))
            elif not isinstance(value, str):
                self.fail(
                    f"experiment.{key}",
                    f"experiment.{key} must be a string, got {describe_value(value)}",
                )
            elif not value.strip():
                self.fail(f"experiment.{key}", f"experiment.{key} must not be empty")
            else:
                values[key] = value
        if isinstance(self.raw.get("experiment"), dict):
            for key in _EXPERIMENT_REQUIRED:
                if key not in table:
                    self.fail(f"experiment.{key}", f"experiment.{key} is required")
        branch, sha = values.get("branch"), values.get("commit_sha")
        if branch is not None and re.search(r"\s", branch):
            self.fail(
                "experiment.branch",
                f"experiment.branch must not contain whitespace, got {branch!r}",
            )
        if sha is not None and not _COMMIT_SHA.match(sha):
            self.fail(
                "experiment.commit_sha",
                f"experiment.commit_sha must be 7-40 hex characters, got {sha!r}",
            )
        if "branch" in table and "commit_sha" in table:
            self.fail(
                "experiment",
                "experiment.branch and experiment.commit_sha are mutually exclusive: keep one",
            )
        rollout_dir = self._rollout_dir(values.get("rollout"))
        entrypoint = self._entrypoint(rollout_dir, values.get("entrypoint"))
        model_path = values.get("model_path")
        model_dir = self._model_dir(model_path) if model_path is not None else None
        if any(key not in values for key in _EXPERIMENT_REQUIRED):
            return None, rollout_dir, entrypoint, model_dir
        return Experiment(**values), rollout_dir, entrypoint, model_dir

    def _rollout_dir(self, rollout: str | None) -> Path | None:
        if rollout is None:
            return None
        key = "experiment.rollout"
        if rollout in (".", "..") or "/" in rollout or "\\" in rollout:
            self.fail(
                key, f"{key} must be a single directory name under rollouts/, got {rollout!r}"
            )
            return None
        rollouts = self.workspace.rollouts_dir.resolve()
        resolved = (rollouts / rollout).resolve()
        if not resolved.is_relative_to(rollouts) or not resolved.is_dir():
            self.fail(
                key,
                f"{key} {rollout!r}: directory {self.workspace.rollouts_dir / rollout} not found",
            )
            return None
        return resolved

    def _entrypoint(self, rollout_dir: Path | None, entrypoint: str | None) -> Path | None:
        if rollout_dir is None or entrypoint is None:
            return None
        key = "experiment.entrypoint"
        resolved = (rollout_dir / entrypoint).resolve()
        if Path(entrypoint).is_absolute() or not resolved.is_relative_to(rollout_dir):
            self.fail(
                key, f"{key} must be a path inside rollouts/{rollout_dir.name}/, got {entrypoint!r}"
            )
            return None
        if not resolved.is_file():
            self.fail(key, f"{key} {entrypoint!r}: file {rollout_dir / entrypoint} not found")
            return None
        return resolved

    def _model_dir(self, model_path: str) -> Path | None:
        """Resolve a local model directory (``local:<dir>``; for training also a plain path)."""
        key = "experiment.model_path"
        target: str | None = None
        if model_path.startswith(_LOCAL_PREFIX):
            target = model_path[len(_LOCAL_PREFIX) :]
        elif self.kind == "training":
            looks_like_path = model_path.startswith(("/", ".", "~")) or "\\" in model_path
            if looks_like_path or (self.workspace.root / model_path).is_dir():
                target = model_path
            elif not _HUB_ID.match(model_path):
                self.fail(
                    key,
                    f"{key} must be a local directory (local:<dir> or a path) or a model id "
                    f"like 'Qwen/Qwen3-0.6B', got {model_path!r}",
                )
        if target is None:
            return None
        resolved = (self.workspace.root / Path(target).expanduser()).resolve()
        if not target or not resolved.is_dir():
            self.fail(key, f"{key} {model_path!r}: local model directory {resolved} not found")
            return None
        return resolved

    def _env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        for name, value in self.table("env").items():
            key = f"env.{name}"
            if name.startswith(RESERVED_ENV_PREFIX):
                self.fail(
                    key,
                    f"{key} is reserved: names starting with {RESERVED_ENV_PREFIX} "
                    "are set by the supervisor",
                )
            elif not ENV_NAME.match(name):
                self.fail(key, f"{key}: env var names must match {ENV_NAME.pattern}, got {name!r}")
            elif not isinstance(value, str):
                self.fail(key, f"{key} must be a string, got {describe_value(value)}")
            else:
                env[name] = value
        return env

    def _secrets(self, env: dict[str, str]) -> tuple[str, ...]:
        table = self.table("secrets")
        for key in table:
            if key != "required":
                self.issues.append(unknown_key("secrets", key, ("required",)))
        if "secrets" in self.raw and "required" not in table:
            self.fail(
                "secrets.required", "secrets.required is required (use required = [] for none)"
            )
        required = table.get("required", [])
        key = "secrets.required"
        if not isinstance(required, list):
            self.fail(key, f"{key} must be a list of secret names, got {describe_value(required)}")
            return ()
        names: list[str] = []
        for name in required:
            if not isinstance(name, str) or not SECRET_NAME.match(name):
                self.fail(
                    key,
                    f"{key} entries must be names matching {SECRET_NAME.pattern}, "
                    f"got {describe_value(name)}",
                )
            elif name in names:
                self.fail(key, f"{key} lists {name!r} more than once")
            elif name in env:
                self.fail(
                    key,
                    f"{key}: {name!r} is also set in [env]; "
                    "a name is either a secret or an env var, not both",
                )
            else:
                names.append(name)
        return tuple(names)
