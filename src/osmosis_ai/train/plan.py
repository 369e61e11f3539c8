"""What one ``osmosis train run`` will do, resolved before anything starts: the config, the
dataset rows and their fixed order, the batch shape and step count, and the run directory.

The data order is a pure function of the dataset, ``seed``, ``total_epochs`` and the batch
shape (one seeded permutation per epoch, concatenated), so a resumed run sees exactly the
rows the first invocation would have. Every problem is raised here, naming the value.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from osmosis_ai.errors import ConfigError, UsageError
from osmosis_ai.rundir.datasets import resolve_dataset
from osmosis_ai.workspace import (
    DatasetError,
    DatasetRow,
    TrainingConfig,
    Workspace,
    dataset_sha256,
    find_workspace,
    generate_run_name,
    load_training_config,
    normalize_row,
    read_rows,
    validate_run_name,
)

DEFAULT_EVAL_ROWS = 32
RUN_FILE = "run.json"
NO_SIGNAL_PATIENCE = 25  # the most steps without a learning signal a run waits by default


@dataclass(frozen=True)
class TrainRunOptions:
    """The inputs of one invocation; paths resolve against ``cwd`` (default: the process's).

    ``resume`` continues the run ``name`` (default: this config's latest run) from its last
    saved step. ``max_steps`` caps the steps of the config. ``micro_batch_size`` splits each
    step's completions into gradient-accumulation chunks (memory). ``resume_every`` saves
    the resumable trainer state every N steps (1: a kill loses at most the current step).
    ``strict_token_chain`` fails the run when an agent's calls do not extend one another.
    ``eval_rows``/``eval_samples`` size the validation set (first rows of the dataset).
    ``ray_address`` (or ``[advanced.ray] address``) runs the steps on a Ray cluster with
    ``trainer_workers`` trainer workers and ``rollout_servers`` rollout servers. The config
    is ``config_path`` (a TOML file, loaded with the plan) or ``config``, one already parsed
    (a platform run's, :func:`~osmosis_ai.workspace.config.parse_training_config`).
    """

    config_path: Path | None = None
    cwd: Path | None = None
    name: str | None = None
    output: Path | None = None
    dataset_file: Path | None = None
    resume: bool = False
    max_steps: int | None = None
    rollout_port: int | None = None
    micro_batch_size: int | None = None
    resume_every: int = 1
    strict_token_chain: bool = False
    eval_rows: int | None = None
    eval_samples: int = 1
    torch_threads: int | None = None
    device: str | None = None
    vllm_server_url: str | None = None
    ray_address: str | None = None  # on a Ray cluster: "auto", "local" or host:port
    trainer_workers: int | None = None  # on Ray (0: one per node)
    rollout_servers: int | None = None  # on Ray (0: one per node)
    environ: Mapping[str, str] | None = None
    handle_signals: bool = True
    stop: threading.Event | None = None  # set: finish the step, save, and stop
    verbose: bool = False
    config: TrainingConfig | None = None

    def __post_init__(self) -> None:
        if (self.config_path is None) == (self.config is None):
            raise UsageError("give the run's config as config_path or as config, not both")


@dataclass(frozen=True)
class RayPlacement:
    """Where a run on Ray goes: the cluster's address and how many trainer workers and
    rollout servers it places (``0``: one per node, counted once connected)."""

    address: str
    trainer_workers: int
    rollout_servers: int
    max_failures: int


@dataclass(frozen=True)
class TrainPlan:
    """The resolved run: ``order`` holds a row index per position, ``batch`` rows (each
    sampled ``group`` times) make one of ``steps`` optimizer steps."""

    options: TrainRunOptions
    config: TrainingConfig
    run_name: str
    run_dir: Path
    resumed: bool
    dataset_path: Path
    dataset_sha256: str
    rows: list[DatasetRow]
    order: list[int]
    batch: int
    group: int
    steps: int
    eval_indices: list[int]
    model_ref: str
    secrets: dict[str, str] = field(default_factory=dict[str, str])
    warnings: tuple[tuple[str, str], ...] = ()
    ray: RayPlacement | None = None

    @property
    def workspace(self) -> Workspace:
        return self.config.workspace

    @property
    def no_signal_patience(self) -> int:
        """Consecutive steps without a learning signal that fail the run (0: never):
        ``[training] no_signal_patience``, else the smaller of 25 and 20 % of the steps."""
        configured = self.config.training.no_signal_patience
        if configured is not None:
            return configured
        return max(1, min(NO_SIGNAL_PATIENCE, self.steps // 5))

    def order_key(self) -> dict[str, object]:
        """What fixes the data order; a resume must find the same values."""
        training = self.config.training
        return {
            "dataset_sha256": self.dataset_sha256,
            "seed": training.seed,
            "total_epochs": training.total_epochs,
            "rollout_batch_size": self.batch,
            "n_samples_per_prompt": self.group,
        }


def build_plan(options: TrainRunOptions) -> TrainPlan:
    """Load and check everything the run needs; raise naming the value and the fix."""
    cwd = (options.cwd or Path.cwd()).resolve()
    config = options.config
    if config is None:
        assert options.config_path is not None
        config_path = (cwd / options.config_path.expanduser()).resolve()
        config = load_training_config(config_path, find_workspace(config_path.parent))
    workspace = config.workspace
    training = config.training
    warnings: list[tuple[str, str]] = []
    if options.resume_every < 1:
        raise UsageError(f"resume_every={options.resume_every}: save the state every N ≥ 1 steps")
    if training.n_samples_per_prompt < 2:
        raise ConfigError(
            f"training.n_samples_per_prompt = {training.n_samples_per_prompt}: GRPO scores each "
            "sample against the other samples of its prompt, so it needs at least 2 (8 is usual)"
        )
    dataset_path, _ = resolve_dataset(
        config.experiment.dataset,
        root=config.workspace.root,
        data_dir=config.workspace.data_dir,
        dataset_file=options.dataset_file,
        cwd=cwd,
    )
    rows = load_rows(dataset_path, needs_labels=config.warmup.sft_steps > 0, warnings=warnings)
    batch, group = training.rollout_batch_size, training.n_samples_per_prompt
    order = data_order(len(rows), training.total_epochs, training.seed)
    steps = len(order) // batch
    if options.max_steps is not None:
        if options.max_steps < 1:
            raise UsageError(f"max_steps={options.max_steps}: give a step count ≥ 1")
        steps = min(steps, options.max_steps)
    if steps < 1:
        raise ConfigError(
            f"training.rollout_batch_size = {batch} but {dataset_path.name} has {len(rows)} rows "
            f"× training.total_epochs = {training.total_epochs}: not enough for one step; lower "
            "rollout_batch_size or raise total_epochs"
        )
    micro = options.micro_batch_size
    if micro is not None and (micro < 1 or (batch * group) % micro):
        raise UsageError(
            f"micro_batch_size={micro} must divide the {batch * group} completions of a step "
            f"(rollout_batch_size {batch} × n_samples_per_prompt {group})"
        )
    ray = _placement(options, config, batch * group)
    model_ref = _model_ref(config)
    secrets = _secrets(config, options.environ if options.environ is not None else os.environ)
    sha = dataset_sha256(dataset_path)
    output = _output_dir(options.output, workspace, cwd)
    run_name, resumed = _run_name(options, config, output, sha)
    eval_count = min(len(rows), options.eval_rows or DEFAULT_EVAL_ROWS)
    if options.eval_samples < 1:
        raise UsageError(f"eval_samples={options.eval_samples}: sample each row at least once")
    return TrainPlan(
        options=options,
        config=config,
        run_name=run_name,
        run_dir=output / run_name,
        resumed=resumed,
        dataset_path=dataset_path,
        dataset_sha256=sha,
        rows=rows,
        order=order[: steps * batch],
        batch=batch,
        group=group,
        steps=steps,
        eval_indices=list(range(eval_count)),
        model_ref=model_ref,
        secrets=secrets,
        warnings=tuple(warnings),
        ray=ray,
    )


def _placement(
    options: TrainRunOptions, config: TrainingConfig, completions: int
) -> RayPlacement | None:
    section = config.ray
    address = options.ray_address or section.address or None
    if address is None:
        for flag, value in (
            ("--trainer-workers", options.trainer_workers),
            ("--rollout-servers", options.rollout_servers),
        ):
            if value is not None:
                raise UsageError(
                    f"{flag} {value} places work on a Ray cluster: add --ray [ADDRESS] (or set "
                    "[advanced.ray] address)"
                )
        return None
    if options.vllm_server_url:
        raise UsageError(
            "a vLLM server URL and a Ray cluster are two ways to serve the policy: on Ray the "
            "trainer workers start their own vLLM engines on the cluster's GPUs; drop one"
        )
    workers = (
        options.trainer_workers if options.trainer_workers is not None else section.trainer_workers
    )
    servers = (
        options.rollout_servers if options.rollout_servers is not None else section.rollout_servers
    )
    for name, value in (("trainer_workers", workers), ("rollout_servers", servers)):
        if value < 0:
            raise UsageError(f"{name} = {value}: give a count ≥ 1 (0: one per node)")
    check_split(completions, workers)
    return RayPlacement(address, workers, servers, section.max_failures)


def check_split(completions: int, workers: int) -> None:
    """Each trainer worker takes an equal share of a step's completions."""
    if workers and completions % workers:
        raise ConfigError(
            f"{workers} trainer workers cannot share the {completions} completions of a step "
            "(rollout_batch_size × n_samples_per_prompt) equally: choose a worker count that "
            f"divides {completions}, or change the batch"
        )


def data_order(rows: int, epochs: int, seed: int) -> list[int]:
    """One seeded permutation of ``range(rows)`` per epoch, concatenated."""
    order: list[int] = []
    for epoch in range(epochs):
        permutation = list(range(rows))
        random.Random(f"osmosis-train:{seed}:{epoch}").shuffle(permutation)
        order.extend(permutation)
    return order


def load_rows(
    path: Path, *, needs_labels: bool, warnings: list[tuple[str, str]] | None = None
) -> list[DatasetRow]:
    """Normalised rows; a dataset without labels (or metadata) cannot be graded."""
    rows = [normalize_row(raw, row_index=i) for i, raw in enumerate(read_rows(path))]
    if not rows:
        raise DatasetError("the dataset has no rows", path=path)
    unlabeled = [i for i, row in enumerate(rows) if row.label is None]
    if len(unlabeled) == len(rows) and all(row.metadata is None for row in rows):
        raise DatasetError(
            "no row has a label: the grader compares each rollout against the row's "
            "'ground_truth' (or 'label') column; add one",
            path=path,
        )
    if unlabeled and needs_labels:
        shown = ", ".join(str(i) for i in unlabeled[:5]) + (" …" if len(unlabeled) > 5 else "")
        raise DatasetError(
            f"warmup.sft_steps > 0 trains on the rows' ground truth, but rows {shown} have no "
            "'ground_truth'/'label': add labels, or set [warmup] sft_steps = 0",
            path=path,
        )
    if unlabeled and warnings is not None:
        warnings.append(
            (
                "ROWS_WITHOUT_LABEL",
                f"{len(unlabeled)} of {len(rows)} rows of {path.name} have no label: their "
                "grader gets label None",
            )
        )
    return rows


def _model_ref(config: TrainingConfig) -> str:
    if config.model_dir is not None:
        return str(config.model_dir)
    return config.experiment.model_path


def _secrets(config: TrainingConfig, environ: Mapping[str, str]) -> dict[str, str]:
    missing = [name for name in config.secrets if not environ.get(name)]
    if missing:
        raise ConfigError(
            f"[secrets] required = {list(config.secrets)}: {', '.join(missing)} not set; "
            "export them in the environment of osmosis train run"
        )
    return {name: environ[name] for name in config.secrets}


def _output_dir(output: Path | None, workspace: Workspace, cwd: Path) -> Path:
    if output is not None:
        return (cwd / output.expanduser()).resolve()
    return workspace.output_dir / "training"


def _run_name(
    options: TrainRunOptions, config: TrainingConfig, output: Path, sha: str
) -> tuple[str, bool]:
    if options.name is not None:
        name = validate_run_name(options.name)
        exists = (output / name / RUN_FILE).is_file()
        if exists and not options.resume:
            raise UsageError(
                f"training run {name!r} already exists in {output}: pass --resume to continue "
                "it, or choose another --name"
            )
        if options.resume and not exists:
            raise UsageError(f"no training run {name!r} in {output} to resume")
        return name, exists
    if options.resume:
        latest = latest_run(output, config.path)
        if latest is None:
            raise UsageError(
                f"no earlier run of {config.path.name} in {output} to resume: drop --resume, "
                "or pass --name RUN"
            )
        return latest, True
    digest = hashlib.sha256(f"{config.path}\0{sha}".encode()).hexdigest()
    return generate_run_name(config.name, digest), False


def latest_run(output: Path, config_path: Path) -> str | None:
    """The most recently started run of ``config_path`` under ``output``."""
    found: list[tuple[str, str]] = []
    if not output.is_dir():
        return None
    for entry in output.iterdir():
        try:
            manifest = json.loads((entry / RUN_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("config_path") == str(config_path):
            found.append((str(manifest.get("created_at", "")), entry.name))
    return max(found)[1] if found else None
