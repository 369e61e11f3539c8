"""What ``eval submit`` and ``train submit`` check locally and send (reference §4.6).

The platform runs the pushed code of the connected repository and the config *values* of
the local TOML. Before the POST: the rollout's entrypoint is imported once, so backends
constructed at module level validate themselves (no class scanning; a missing module or
an environment without the rollout's declared dependencies only warns); a pinned commit
is looked up; the local clone is compared with what the platform will fetch.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from osmosis_ai.errors import UsageError
from osmosis_ai.platform.client import local_repo
from osmosis_ai.platform.client.api import PlatformClient, SubmitResult, segment
from osmosis_ai.platform.client.errors import PlatformClientError, SubmitRefusedError, redacted
from osmosis_ai.workspace import EvalConfig, TrainingConfig

MISSING_SECRET = re.compile(r"Secret\(s\) not found: ([A-Z0-9_, ]+)")
WIRE_PERSONAL = "user"  # the scope the platform calls a personal secret's

Advisory = tuple[str, str]  # (warning code, message): worth knowing, not worth stopping for


class PreflightError(UsageError):
    """Importing the rollout's entrypoint failed: the rollout is broken as configured."""


# --- the backend preflight ------------------------------------------------------------------


def _package_name(rollout_dir: Path) -> str:
    digest = hashlib.sha256(str(rollout_dir).encode()).hexdigest()[:16]
    return f"_osmosis_preflight_{digest}"


def _package(name: str, directory: Path) -> None:
    """Register ``directory`` as package ``name`` (running its ``__init__.py`` if any)."""
    init = directory / "__init__.py"
    spec = (
        importlib.util.spec_from_file_location(
            name, init, submodule_search_locations=[str(directory)]
        )
        if init.is_file()
        else importlib.machinery.ModuleSpec(name, None, is_package=True)
    )
    if spec is None:
        raise PreflightError(f"cannot load the package {directory}")
    spec.submodule_search_locations = [str(directory)]
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    if spec.loader is not None:
        spec.loader.exec_module(module)


def import_entrypoint(rollout_dir: Path, entrypoint: Path) -> types.ModuleType:
    """Import ``entrypoint`` as a module of a package rooted at ``rollout_dir``.

    Not as ``__main__``: a ``if __name__ == "__main__"`` block (the server start) stays
    unrun. The rollout directory joins ``sys.path`` for the entrypoint's absolute imports.
    """
    rollout_dir, entrypoint = rollout_dir.resolve(), entrypoint.resolve()
    relative = entrypoint.relative_to(rollout_dir).with_suffix("")
    root = _package_name(rollout_dir)
    for module_name in [m for m in sys.modules if m == root or m.startswith(f"{root}.")]:
        del sys.modules[module_name]
    if str(rollout_dir) not in sys.path:
        sys.path.insert(0, str(rollout_dir))
    _package(root, rollout_dir)
    package, directory = root, rollout_dir
    for part in relative.parts[:-1]:
        package, directory = f"{package}.{part}", directory / part
        _package(package, directory)
    name = ".".join((root, *relative.parts))
    spec = importlib.util.spec_from_file_location(name, entrypoint)
    if spec is None or spec.loader is None:
        raise PreflightError(f"cannot load the entrypoint {entrypoint}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def backend_preflight(config: EvalConfig | TrainingConfig, label: str) -> list[Advisory]:
    """Import the entrypoint when this environment can; the warnings of what was skipped.

    Raises :class:`PreflightError` when the import fails for any reason but a missing
    module.
    """
    from osmosis_ai.controller.rollout_process import RolloutServerError, check_dependencies

    rollout = config.experiment.rollout
    entrypoint = config.experiment.entrypoint
    where = f"rollouts/{rollout}/{entrypoint}"
    try:
        deps = check_dependencies(config.rollout_dir)
    except RolloutServerError as exc:
        return [("PREFLIGHT_SKIPPED", f"Local preflight skipped for rollouts/{rollout}: {exc}")]
    if not deps.satisfied:
        missing = ", ".join(deps.missing)
        return [
            (
                "PREFLIGHT_SKIPPED",
                f"Local preflight skipped for rollouts/{rollout}: this Python environment "
                f"lacks its declared dependencies ({missing}). To enable it: "
                f"{sys.executable} -m pip install -e rollouts/{rollout}",
            )
        ]
    try:
        import_entrypoint(config.rollout_dir, config.entrypoint_path)
    except ModuleNotFoundError as exc:
        return [
            (
                "PREFLIGHT_SKIPPED",
                f"Local preflight skipped for rollouts/{rollout}: importing {where} needs a "
                f"module this environment lacks ({exc}). Install it here to enable the "
                "preflight.",
            )
        ]
    except Exception as exc:  # the user's code may raise anything; report it, do not crash
        detail = (
            str(exc)
            if isinstance(exc, ImportError | TypeError | ValueError | UsageError)
            else (f"{type(exc).__name__}: {exc}")
        )
        raise PreflightError(f"{label} preflight failed for {where}:\n  {detail}") from exc
    return []


# --- the source the platform will fetch -----------------------------------------------------


@dataclass
class CommitCheck:
    """A pinned commit: ``error`` when it surely does not exist, else ``warnings``."""

    error: str | None = None
    warnings: list[Advisory] = field(default_factory=list[Advisory])


def check_pinned_commit(root: Path, sha: str) -> CommitCheck:
    """Look ``sha`` up in the clone, then in ``origin`` when that is on this machine."""
    local = local_repo.commit_exists(root, sha)
    url = local_repo.origin_url(root)
    remote = local_repo.local_remote_path(url, root) if url else None
    if remote is not None:
        found = local_repo.commit_exists(remote, sha)
        if found is False:
            return CommitCheck(
                error=f"experiment.commit_sha {sha} is not in the repository at origin ({url}). "
                "Push it, or pin a commit that is."
            )
        if found:
            return CommitCheck()
    if local is False:
        return CommitCheck(
            warnings=[
                (
                    "COMMIT_UNVERIFIED",
                    f"Commit {sha} is not in this clone; make sure it exists in the connected "
                    "repository.",
                )
            ]
        )
    if local is None:
        return CommitCheck(
            warnings=[("COMMIT_UNVERIFIED", f"Commit {sha} could not be checked locally.")]
        )
    if remote is None:
        return CommitCheck(
            warnings=[("COMMIT_UNVERIFIED", f"Commit {sha} exists here; make sure it is pushed.")]
        )
    return CommitCheck()


def remote_fetch_notice(
    root: Path, *, branch: str | None, commit_sha: str | None
) -> tuple[list[str], list[Advisory]]:
    """``(notes, warnings)``: where the code comes from, and what in the clone it lacks."""
    state = local_repo.local_state(root)
    warnings: list[Advisory] = []
    if state is not None:
        if state.dirty:
            warnings.append(
                (
                    "UNCOMMITTED_CHANGES",
                    "Uncommitted changes: code edits will not be picked up (only the config "
                    "file is read locally).",
                )
            )
        if state.has_upstream and state.ahead > 0:
            commits = "commit" if state.ahead == 1 else "commits"
            warnings.append(
                (
                    "UNPUSHED_COMMITS",
                    f"{state.ahead} unpushed {commits} ahead of upstream: push before submitting.",
                )
            )
        elif state.branch is not None and not state.has_upstream:
            warnings.append(
                (
                    "NO_UPSTREAM",
                    f"Branch '{state.branch}' has no upstream: push it and set tracking "
                    "before submitting.",
                )
            )
    notes: list[str] = []
    if commit_sha:
        notes.append(f"The platform will fetch commit {commit_sha} of the connected repository.")
    elif branch:
        notes.append(f"The platform will fetch branch {branch} of the connected repository.")
    else:
        notes.append("The platform will fetch the default branch of the connected repository.")
        if state is not None and state.branch and state.head_sha:
            notes.append(f"Local: {state.branch} @ {state.head_sha[:8]}")
        warnings.append(
            (
                "UNPINNED_COMMIT",
                "No commit_sha is pinned: the platform may run a different commit than your "
                'local branch. To pin one, push it and set commit_sha = "<full SHA>" (git '
                "rev-parse HEAD) under [experiment] in the config.",
            )
        )
    notes.append("Config values come from your local TOML file as it is now, committed or not.")
    return notes, warnings


# --- what is sent ---------------------------------------------------------------------------


def experiment_config(config: EvalConfig | TrainingConfig) -> dict[str, object]:
    experiment = config.experiment
    data: dict[str, object] = {
        "rollout": experiment.rollout,
        "entrypoint": experiment.entrypoint,
        "model_path": experiment.model_path,
        "dataset": experiment.dataset,
    }
    if experiment.branch is not None:
        data["branch"] = experiment.branch
    if experiment.commit_sha is not None:
        data["commit_sha"] = experiment.commit_sha
    return data


def _table(config: EvalConfig | TrainingConfig, section: str) -> dict[str, object]:
    value = config.raw.get(section)
    return dict(value) if isinstance(value, dict) else {}


def _fold_into_advanced(config: TrainingConfig, tables: dict[str, dict[str, object]]) -> None:
    """Send our own training settings the way the platform (like the original CLI) takes
    them: ``[training]`` keys such as ``loss_type`` and the ``[warmup]``/``[lora]`` tables go
    under ``[advanced]`` by the same names (the config loader refused any given twice)."""
    from osmosis_ai.workspace.config import ADVANCED_TABLES, ADVANCED_TRAINING_KEYS

    advanced = tables["advanced"]
    training = tables["training"]
    for key in ADVANCED_TRAINING_KEYS:
        if key in training:
            advanced[key] = training.pop(key)
    for name in ADVANCED_TABLES:
        table = _table(config, name)
        if table:
            advanced[name] = table


def run_payload(
    config: EvalConfig | TrainingConfig, provided_secrets: dict[str, str]
) -> dict[str, object]:
    """The body of ``POST /api/cli/eval-runs`` or ``/api/cli/training-runs``.

    Sections are sent as written in the TOML; empty ones are left out. ``secrets`` names
    the required records and carries the values supplied for this run only.
    """
    sections = (
        ("evaluation",)
        if isinstance(config, EvalConfig)
        else ("training", "sampling", "checkpoints")
    )
    body: dict[str, object] = {"experiment_config": experiment_config(config)}
    tables = {section: _table(config, section) for section in (*sections, "advanced")}
    if isinstance(config, TrainingConfig):
        _fold_into_advanced(config, tables)
    for section, table in tables.items():
        if table:
            body[f"{section}_config"] = table
    if config.env:
        body["env_config"] = dict(config.env)
    if config.secrets or provided_secrets:
        secrets: dict[str, object] = {"required": list(config.secrets)}
        if provided_secrets:
            secrets["provided"] = dict(provided_secrets)
        body["secrets"] = secrets
    return body


# --- the submit -----------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitKind:
    """What differs between the two submits."""

    verb: str  # "eval" | "train"
    label: str  # "Evaluation" | "Training"
    config_dir: str  # "configs/eval"
    endpoint: str  # "/api/cli/eval-runs"

    @property
    def operation(self) -> str:
        return f"{self.verb}.submit"


EVAL = SubmitKind("eval", "Evaluation", "configs/eval", "/api/cli/eval-runs")
TRAIN = SubmitKind("train", "Training", "configs/training", "/api/cli/training-runs")


@dataclass(frozen=True)
class SubmitPlan:
    """A submit checked locally: the config, what is worth a warning, the rows a managed
    eval evaluates (``None`` for training) and the notes on what the platform fetches."""

    config: EvalConfig | TrainingConfig
    advisories: list[Advisory]
    rows: dict[str, object] | None
    notes: list[str]


def prepare_submit(
    client: PlatformClient, kind: SubmitKind, config_path: Path, root: Path
) -> SubmitPlan:
    """Load and check the config (relative to the working directory, else to the workspace
    directory ``root``), import its entrypoint, look a pinned commit up and compare the
    clone with what the platform will fetch."""
    config = _load(kind, _config_path(config_path, root), root)
    advisories = backend_preflight(config, f"osmosis {kind.verb} submit")
    experiment = config.experiment
    if experiment.commit_sha:
        commit = check_pinned_commit(root, experiment.commit_sha)
        if commit.error:
            raise SubmitRefusedError(commit.error)
        advisories += commit.warnings
    rows = eval_rows(client, config) if isinstance(config, EvalConfig) else None
    notes, fetch_warnings = remote_fetch_notice(
        root, branch=experiment.branch, commit_sha=experiment.commit_sha
    )
    return SubmitPlan(config, advisories + fetch_warnings, rows, notes)


def _config_path(path: Path, root: Path) -> Path:
    path = path.expanduser()
    if path.is_absolute() or path.exists():
        return path.resolve()
    return (root / path).resolve()


def _load(kind: SubmitKind, path: Path, root: Path) -> EvalConfig | TrainingConfig:
    from osmosis_ai.workspace import Workspace, load_eval_config, load_training_config

    workspace = Workspace(root)
    config = (
        load_eval_config(path, workspace) if kind is EVAL else load_training_config(path, workspace)
    )
    if config.model_dir is not None:
        raise SubmitRefusedError(
            f"experiment.model_path {config.experiment.model_path!r} is a local directory, "
            "which the platform cannot read: name a model the platform serves (see `osmosis "
            "model list`).",
            {"key": "experiment.model_path"},
        )
    return config


def eval_rows(client: PlatformClient, config: EvalConfig) -> dict[str, object]:
    """The rows a managed eval evaluates: ``limit`` (``None``: every row) and, when the
    platform names it, the dataset's row count and so the count evaluated."""
    limit = config.evaluation.limit
    total: int | None = None
    with contextlib.suppress(PlatformClientError):  # the platform checks the dataset at submit
        found = client.call("GET", f"/api/cli/datasets/{segment(config.experiment.dataset)}")
        count = found.get("row_count")
        total = count if isinstance(count, int) and not isinstance(count, bool) else None
    rows = None if total is None else total if limit is None else min(limit, total)
    return {"limit": limit, "dataset_rows": total, "rows": rows}


def stored_secret_scopes(client: PlatformClient) -> dict[str, str] | None:
    """Stored secret names and the scope a run would use (personal wins); ``None`` when
    they cannot be listed (``SECRETS_LOOKUP_FAILED`` warns: the platform checks at submit)."""
    try:
        page = client.fetch(
            "/api/cli/environment-secrets",
            "environment_secrets",
            fetch_all=True,
            params={"scope": "all"},
        )
    except PlatformClientError as exc:
        if exc.code == "AUTH_REQUIRED":
            raise
        if client.warn is not None:
            client.warn(
                "SECRETS_LOOKUP_FAILED",
                f"Could not list the platform's stored secrets ({exc.message}); the platform "
                "will check them at submit.",
            )
        return None
    workspace = {str(s.get("name")) for s in page.items if s.get("scope") == "workspace"}
    personal = {str(s.get("name")) for s in page.items if s.get("scope") == WIRE_PERSONAL}
    scopes = {name: "Workspace" for name in workspace}
    for name in personal:
        scopes[name] = "Personal (overrides workspace)" if name in workspace else "Personal"
    return scopes


def post_run(
    client: PlatformClient,
    kind: SubmitKind,
    config: EvalConfig | TrainingConfig,
    provided: dict[str, str],
) -> SubmitResult:
    """``POST`` the run with the secret values ``provided`` for it; an error the platform
    answers with never repeats them, and says how to add secrets it lacks."""
    try:
        answer = client.call("POST", kind.endpoint, json=run_payload(config, provided))
    except PlatformClientError as exc:
        clean = redacted(exc, provided.values()) if provided else exc
        error_text = clean.details.get("error")
        haystack = f"{clean.message}\n{error_text if isinstance(error_text, str) else ''}"
        found = MISSING_SECRET.search(haystack) if clean.status_code == 404 else None
        if found is not None:
            names = [n.strip() for n in found.group(1).split(",") if n.strip()]
            hints = "\n".join(f"  osmosis secret set {name}" for name in names)
            clean.message = (
                f"{clean.message}\n\nAdd them with:\n{hints}\n\nSecrets default to personal "
                "scope; use --scope workspace for secrets shared across the workspace."
            )
        elif clean.status_code in (404, 405, 501) and "platform_code" not in clean.details:
            clean.message = (
                f"This platform does not accept {kind.label.lower()} runs: POST {kind.endpoint} "
                f"answered HTTP {clean.status_code}."
            )
        clean.args = (clean.message,)
        raise clean from None
    return client.model(SubmitResult, answer, f"POST {kind.endpoint}")
