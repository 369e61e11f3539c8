"""What ``osmosis eval run`` will do, worked out before anything starts: the plan.

Loads the config, resolves the dataset (``--dataset-file`` or ``data/<name>.*`` in the
workspace), selects and normalises rows, pins the resolved-input lock and names the run;
resolves ``[secrets]``. Building a plan only reads files.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import JsonValue

from osmosis_ai.errors import UsageError
from osmosis_ai.eval.inputs import (
    PROTOCOL_VERSIONS,
    DatasetLock,
    Manifest,
    Provenance,
    RolloutLock,
    RunInputs,
    TimeoutsLock,
    VersionsLock,
    rollout_source_digest,
)
from osmosis_ai.eval.report_targets import USED_ADVANCED_KEYS, EvalReporting, reporting_of
from osmosis_ai.eval.rundir import MANIFEST_FILE
from osmosis_ai.eval.workitems import WorkItem, build_work_items
from osmosis_ai.rundir.datasets import resolve_dataset
from osmosis_ai.rundir.durable import atomic_write_json
from osmosis_ai.workspace import (
    DatasetError,
    DatasetRow,
    EvalConfig,
    Workspace,
    WorkspaceNotFoundError,
    dataset_sha256,
    find_workspace,
    generate_run_name,
    load_eval_config,
    normalize_row,
    read_rows,
    select_rows,
    validate_dataset,
    validate_run_name,
)

if TYPE_CHECKING:
    from osmosis_ai.rollout.protocol import Generation

GenerationChoice = Literal["auto", "polling", "callback"]
DatasetSource = Literal["explicit", "workspace"]
_PROTOCOL_GENERATION: dict[str, Generation] = {v: g for g, v in PROTOCOL_VERSIONS.items()}


class MissingSecretsError(UsageError):
    """Secrets the config requires have no value in the secrets file, the env or a prompt."""

    def __init__(self, missing: tuple[str, ...]) -> None:
        self.missing = missing
        super().__init__(
            f"missing values for required secrets: {', '.join(missing)}. Pass them with "
            "--secrets-file PATH (dotenv lines NAME=value; '-' reads stdin) or set them in "
            "the environment"
        )


@dataclass(frozen=True)
class Confirmation:
    """What the cost confirmation asks before rollouts start."""

    prompt: str
    pending: int
    model_path: str
    summary: dict[str, object]

    @classmethod
    def of(cls, plan: EvalPlan, pending: int) -> Confirmation:
        return cls(
            prompt=f"{pending} rollouts x model {plan.model_path} — continue?",
            pending=pending,
            model_path=plan.model_path,
            summary={"run": plan.run_name, "pending": pending},
        )


@dataclass(frozen=True)
class EvalRunOptions:
    """Everything ``osmosis eval run`` accepts; the CLI fills it from its flags.

    The config is ``config_path`` (a TOML file, loaded with the plan) or ``config``, one
    already parsed (a platform run's, :func:`~osmosis_ai.workspace.config.parse_eval_config`).
    ``rows`` picks the dataset rows: a ``--rows`` spec (``"3,7,10-20"``) or the offsets.
    ``secrets_file_values`` are the parsed ``--secrets-file``; ``prompt_secret`` asks a human
    for one secret (``None``: never ask); ``confirm`` raises to decline the run (``None``:
    go ahead). ``handle_signals`` makes the first SIGINT/SIGTERM drain and the second abort.
    """

    config_path: Path | None = None
    cwd: Path | None = None
    name: str | None = None
    output_dir: Path | None = None
    dataset_file: Path | None = None
    rows: str | Sequence[int] | None = None
    fresh: bool = False
    retry_failed: bool = False
    max_in_flight: int | None = None
    rollout_port: int | None = None
    generation: GenerationChoice = "auto"
    verbose: bool = False
    secrets_file_values: Mapping[str, str] = field(default_factory=dict[str, str])
    prompt_secret: Callable[[str], str | None] | None = None
    confirm: Callable[[Confirmation], None] | None = None
    handle_signals: bool = False
    environ: Mapping[str, str] | None = None
    ray: str | None = None
    """``--ray``: run the rollout servers on this Ray cluster (``auto``, ``HOST:PORT``,
    ``local``); ``None`` runs one here. The journal stays here either way."""
    rollout_servers: int | None = None
    """``--rollout-servers``: how many servers the Ray fleet runs (default 2)."""
    config: EvalConfig | None = None

    def __post_init__(self) -> None:
        if (self.config_path is None) == (self.config is None):
            raise UsageError("give the run's config as config_path or as config, not both")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise UsageError(f"--max-in-flight must be at least 1, got {self.max_in_flight}")
        if self.rollout_servers is not None and self.ray is None:
            raise UsageError("--rollout-servers needs --ray: the fleet runs on a Ray cluster")
        if self.rollout_servers is not None and self.rollout_servers < 1:
            raise UsageError(f"--rollout-servers must be at least 1, got {self.rollout_servers}")
        if self.ray is not None and self.rollout_port is not None:
            raise UsageError(
                "--rollout-port does not combine with --ray: each server of the fleet takes a "
                "free port on its node; drop --rollout-port"
            )
        port = self.rollout_port
        if port is not None and not 1 <= port <= 65535:
            raise UsageError(f"--rollout-port must be a port number 1-65535, got {port}")
        if self.generation not in ("auto", "polling", "callback"):
            raise UsageError(f"--generation must be auto, polling or callback: {self.generation}")


@dataclass(frozen=True)
class EvalPlan:
    """The resolved run: inputs, rows, work items and where results go."""

    config: EvalConfig
    run_name: str
    output_dir: Path
    dataset_name: str
    dataset_path: Path
    dataset_source: DatasetSource
    total_rows: int
    rows: tuple[DatasetRow, ...]
    items: tuple[WorkItem, ...]
    inputs: RunInputs
    provenance: Provenance
    generation: Generation
    generation_forced: bool
    """False when ``--generation auto`` picked a default that the server may still change."""
    max_in_flight: int | None
    batch_size: int | None
    """``evaluation.batch_size`` when the config sets it (the default is not a choice)."""
    warnings: tuple[tuple[str, str], ...] = ()
    reporting: EvalReporting = field(default_factory=EvalReporting)
    """The trackers ``[advanced] report_to`` names, for the final metrics."""

    @property
    def run_dir(self) -> Path:
        return self.output_dir / self.run_name

    @property
    def workspace(self) -> Workspace:
        return self.config.workspace

    @property
    def rollout_name(self) -> str:
        return self.config.experiment.rollout

    @property
    def entrypoint(self) -> str:
        return self.config.experiment.entrypoint

    @property
    def model_path(self) -> str:
        return self.config.experiment.model_path

    @property
    def n(self) -> int:
        return self.config.evaluation.n

    @property
    def git(self) -> dict[str, JsonValue] | None:
        prov = self.provenance
        if prov.git_head is None:
            return None
        return {"head": prov.git_head, "branch": prov.git_branch, "dirty": prov.git_dirty}


def build_plan(options: EvalRunOptions) -> EvalPlan:
    """Resolve ``options`` into a plan, or raise the error that names what to fix."""
    cwd = (options.cwd or Path.cwd()).resolve()
    config = options.config
    if config is None:
        assert options.config_path is not None
        config_path = (cwd / options.config_path.expanduser()).resolve()
        config = load_eval_config(config_path, _workspace(cwd, config_path))
    workspace = config.workspace
    warnings: list[tuple[str, str]] = []
    reporting = reporting_of(config, options.environ if options.environ is not None else os.environ)
    ignored = [key for key in config.advanced if key not in USED_ADVANCED_KEYS]
    if ignored:
        listed = ", ".join(ignored)
        warnings.append(
            (
                "ADVANCED_IGNORED",
                f"{config.path.name}: [advanced] {listed} is recorded but not used locally "
                "(a local run uses only report_to and mlflow_tracking_uri there)",
            )
        )
    pinned = config.experiment.branch or config.experiment.commit_sha
    if pinned:
        warnings.append(
            (
                "PINNED_REVISION_IGNORED",
                f"the config pins {pinned!r}; a local run uses the working tree as it is",
            )
        )
    path, name = resolve_dataset(
        config.experiment.dataset,
        root=config.workspace.root,
        data_dir=config.workspace.data_dir,
        dataset_file=options.dataset_file,
        cwd=cwd,
    )
    source: DatasetSource = "explicit" if options.dataset_file is not None else "workspace"
    validation = validate_dataset(path)
    warnings.extend((w.code, w.message) for w in validation.warnings)
    if not validation.valid:
        problems = "\n".join(f"  - {error}" for error in validation.errors)
        raise DatasetError(f"{path} is not a valid dataset:\n{problems}")
    raw_rows = read_rows(path)
    selected = select_rows(len(raw_rows), options.rows, config.evaluation.limit)
    rows = tuple(normalize_row(raw_rows[i], row_index=i) for i in selected)
    output_dir = _output_dir(options.output_dir, workspace, cwd)
    generation, forced = _generation(options, output_dir)
    evaluation = config.evaluation
    inputs = RunInputs(
        model_path=config.experiment.model_path,
        dataset=DatasetLock(sha256=dataset_sha256(path), selected_source_rows=tuple(selected)),
        n=evaluation.n,
        rollout=RolloutLock(
            name=config.experiment.rollout,
            entrypoint=config.experiment.entrypoint,
            source_digest=rollout_source_digest(config.rollout_dir or "", [output_dir]),
        ),
        env=dict(config.env),
        secret_names=config.secrets,
        timeouts=TimeoutsLock(
            agent_timeout_sec=evaluation.agent_workflow_timeout_s,
            grader_timeout_sec=evaluation.grader_timeout_s,
        ),
        versions=VersionsLock.for_generation(generation),
    )
    run_name = (
        validate_run_name(options.name)
        if options.name is not None
        else generate_run_name(config.name, inputs.digest())
    )
    head, branch, dirty = git_state(workspace.root)
    raw_eval = config.raw.get("evaluation")
    batch_set = isinstance(raw_eval, dict) and "batch_size" in raw_eval
    return EvalPlan(
        config=config,
        run_name=run_name,
        output_dir=output_dir,
        dataset_name=name,
        dataset_path=path,
        dataset_source=source,
        total_rows=len(raw_rows),
        rows=rows,
        items=tuple(build_work_items(selected, evaluation.n)),
        inputs=inputs,
        provenance=Provenance(
            git_head=head,
            git_branch=branch,
            git_dirty=dirty,
            config_branch=config.experiment.branch,
            config_commit_sha=config.experiment.commit_sha,
            advanced=_json_safe(config.advanced) if config.advanced else None,
        ),
        generation=generation,
        generation_forced=forced,
        max_in_flight=options.max_in_flight,
        batch_size=evaluation.batch_size if batch_set else None,
        warnings=tuple(warnings),
        reporting=reporting,
    )


def repin_generation(
    run_dir: Path, manifest: Manifest, inputs: RunInputs, generation: Generation
) -> None:
    """Rewrite a new run's manifest for the generation its server turned out to speak."""
    update = {"versions": VersionsLock.for_generation(generation)}
    manifest.inputs = inputs.model_copy(update=update).to_json()
    atomic_write_json(run_dir / MANIFEST_FILE, manifest.model_dump(mode="json"))


def resolve_secrets(
    names: tuple[str, ...],
    file_values: Mapping[str, str],
    environ: Mapping[str, str],
    prompt: Callable[[str], str | None] | None,
) -> dict[str, str]:
    """Each required secret from the secrets file, else the env, else the prompt.

    Raises :class:`MissingSecretsError` naming every secret left without a value.
    """
    values: dict[str, str] = {}
    missing: list[str] = []
    for name in names:
        value = file_values.get(name) or environ.get(name) or None
        if value is None and prompt is not None:
            value = prompt(name) or None
        if value is None:
            missing.append(name)
        else:
            values[name] = value
    if missing:
        raise MissingSecretsError(tuple(missing))
    return values


def git_state(root: Path) -> tuple[str | None, str | None, bool | None]:
    """``(head, branch, dirty)`` of the Git checkout at ``root``; Nones outside one."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain=v2", "--branch"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, None, None
    if done.returncode != 0:
        return None, None, None
    head = branch = None
    dirty = False
    for line in done.stdout.splitlines():
        if line.startswith("# branch.oid "):
            head = line.removeprefix("# branch.oid ").strip()
        elif line.startswith("# branch.head "):
            branch = line.removeprefix("# branch.head ").strip()
        elif not line.startswith("#"):
            dirty = True
    if head in (None, "(initial)"):
        return None, branch, dirty
    return head, None if branch == "(detached)" else branch, dirty


def _workspace(cwd: Path, config_path: Path) -> Workspace:
    try:
        return find_workspace(cwd)
    except WorkspaceNotFoundError:
        return find_workspace(config_path.parent)  # run from outside: the config's workspace


def _output_dir(output: Path | None, workspace: Workspace, cwd: Path) -> Path:
    if output is None:
        return workspace.output_dir / "evals"
    return (cwd / output.expanduser()).resolve()


def _generation(options: EvalRunOptions, output_dir: Path) -> tuple[Generation, bool]:
    """The generation to pin: forced by the flag, else the stored run's, else polling."""
    if options.generation != "auto":
        return options.generation, True
    if options.fresh:
        return "polling", False
    name = options.name
    if name is None:
        return "polling", False
    stored = stored_protocol(output_dir / name)
    if stored in _PROTOCOL_GENERATION:
        return _PROTOCOL_GENERATION[stored], True
    return "polling", False


def stored_protocol(run_dir: Path) -> str | None:
    """``inputs.versions.rollout_protocol`` of the manifest in ``run_dir``, if readable."""
    try:
        manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
        version = manifest["inputs"]["versions"]["rollout_protocol"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return version if isinstance(version, str) else None


def _json_safe(table: Mapping[str, object]) -> JsonValue:
    # TOML dates and times have no JSON form: they are recorded as their text.
    return json.loads(json.dumps(table, default=str))


_MODEL_VAR_SUFFIXES = ("API_KEY", "API_BASE", "BASE_URL", "ORG_ID", "ORGANIZATION", "PROJECT_ID")


def model_credential_vars(plan: EvalPlan, environ: Mapping[str, str]) -> list[str]:
    """Model credentials set in ``environ`` that the rollout server must not inherit.

    The ``OPENAI_*`` connection variables and the same ``<PROVIDER>_*`` ones of the model's
    provider, unless the config hands them over on purpose through ``[env]`` or ``[secrets]``.
    """
    provider = plan.model_path.partition("/")[0].upper().replace("-", "_")
    wanted = {f"{p}_{suffix}" for p in ("OPENAI", provider) for suffix in _MODEL_VAR_SUFFIXES}
    declared = set(plan.config.env) | set(plan.config.secrets)
    return sorted(name for name in wanted if environ.get(name) and name not in declared)


def is_credential(name: str) -> bool:
    """Whether an env var's value is secret (a key or token, not a URL or an id)."""
    return name.endswith(("_KEY", "_TOKEN", "_SECRET"))
