"""The run directory ``<workspace>/.osmosis/training/<run>/`` and its durable writes.

``run.json`` (manifest, status), ``config.toml`` (as written; ``config.json``: the tables of
a config that came as tables), ``inputs.json`` (resolved),
``metrics.jsonl`` (one fsynced line per step), ``logs.txt`` (secrets redacted),
``checkpoints/step-NNNNNN/`` (Hugging Face format), ``warmup/`` (the model after the
supervised warm-up), ``resume/`` (the trainer's resumable state), ``rollouts/`` (artifacts).
Files are written through ``rundir/``: whole or not at all, fsynced, owner-only.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from osmosis_ai.errors import UsageError
from osmosis_ai.rundir.durable import (
    atomic_write_bytes,
    atomic_write_json,
    fsync_dir,
    open_owner_only,
    write_all,
)
from osmosis_ai.rundir.logs import LOGS_FILE, Redactor, RunLog
from osmosis_ai.rundir.timestamps import iso_utc
from osmosis_ai.train.plan import RUN_FILE, TrainPlan

SERVER_FILE = "rollout-server.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def finite(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with non-finite floats as ``None`` (strict JSON has no NaN)."""
    return {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()
    }


def save_atomically(target: Path, save: Callable[[Path], None]) -> Path:
    """Run ``save(folder)`` into a temp folder beside ``target``, then rename it there
    (replacing an older one): a reader or a kill never sees half a checkpoint."""
    temp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        save(temp)
        if target.exists():
            shutil.rmtree(target)
        os.replace(temp, target)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    fsync_dir(target.parent)
    return target


class RunDir:
    """Creates (or reopens, for ``--resume``) the run directory of ``plan``."""

    def __init__(self, plan: TrainPlan) -> None:
        self._paths(plan)
        if plan.resumed:
            self._check_resumable()
        else:
            self.path.mkdir(parents=True, exist_ok=True)
        for folder in (self.checkpoints, self.rollouts):
            folder.mkdir(exist_ok=True)
        self.journal = _run_log(self.path, plan)
        self.manifest: dict[str, Any] = self._manifest()
        if plan.config.from_file:
            atomic_write_bytes(self.path / "config.toml", plan.config.path.read_bytes())
        else:  # parsed from tables (a platform run's sections): they are the config as written
            atomic_write_json(self.path / "config.json", plan.config.raw)
        atomic_write_json(self.path / "inputs.json", self._inputs())
        self.set_status("running")

    def _paths(self, plan: TrainPlan) -> None:
        self.plan = plan
        self.path = plan.run_dir
        self.checkpoints = self.path / "checkpoints"
        self.warmup = self.path / "warmup"
        self.resume_dir = self.path / "resume"
        self.rollouts = self.path / "rollouts"
        self.metrics_path = self.path / "metrics.jsonl"
        self.plot_path = self.path / "reward.png"

    @classmethod
    def attach(cls, plan: TrainPlan) -> RunDir:
        """The run directory as another process of the same invocation sees it (a trainer
        worker on a cluster): its paths and journal; the manifest stays the driver's."""
        attached = cls.__new__(cls)
        attached._paths(plan)
        attached.journal = _run_log(attached.path, plan)
        attached.manifest = {}
        return attached

    def _check_resumable(self) -> None:
        stored = json.loads((self.path / RUN_FILE).read_text(encoding="utf-8"))
        changed = {
            key: (stored.get("order", {}).get(key), value)
            for key, value in self.plan.order_key().items()
            if stored.get("order", {}).get(key) != value
        }
        if changed:
            what = ", ".join(f"{k} {old!r} → {new!r}" for k, (old, new) in changed.items())
            raise UsageError(
                f"cannot resume {self.plan.run_name}: {what} changed since it started, which "
                "changes the data order; restore them, or start a new run without --resume"
            )

    def _manifest(self) -> dict[str, Any]:
        previous: dict[str, Any] = {}
        if self.plan.resumed:
            previous = json.loads((self.path / RUN_FILE).read_text(encoding="utf-8"))
        plan = self.plan
        return {
            "name": plan.run_name,
            "created_at": previous.get("created_at", iso_utc()),
            "config_path": str(plan.config.path),
            "model": plan.model_ref,
            "dataset": str(plan.dataset_path),
            "order": plan.order_key(),
            "steps": plan.steps,
            "invocations": int(previous.get("invocations", 0)) + 1,
        }

    def _inputs(self) -> dict[str, object]:
        from dataclasses import asdict

        plan, config = self.plan, self.plan.config
        return {
            "run_name": plan.run_name,
            "config": str(config.path),
            "model": plan.model_ref,
            "rollout": str(config.rollout_dir),
            "entrypoint": str(config.entrypoint_path),
            "dataset": {"path": str(plan.dataset_path), "sha256": plan.dataset_sha256},
            "rows": len(plan.rows),
            "steps": plan.steps,
            "rollout_batch_size": plan.batch,
            "n_samples_per_prompt": plan.group,
            "validation_rows": len(plan.eval_indices),
            "training": asdict(config.training),
            "sampling": asdict(config.sampling),
            "checkpoints": asdict(config.checkpoints),
            "lora": asdict(config.lora),
            "warmup": asdict(config.warmup),
            "env_names": sorted(config.env),
            "secret_names": sorted(plan.secrets),
            "options": {
                "max_steps": plan.options.max_steps,
                "micro_batch_size": plan.options.micro_batch_size,
                "resume_every": plan.options.resume_every,
                "strict_token_chain": plan.options.strict_token_chain,
                "eval_samples": plan.options.eval_samples,
            },
        }

    def set_status(self, status: str, **extra: object) -> None:
        self.manifest.update({"status": status, "updated_at": iso_utc(), **extra})
        atomic_write_json(self.path / RUN_FILE, self.manifest)

    # -- metrics ---------------------------------------------------------------------------

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics_path.is_file():
            return []
        records: list[dict[str, Any]] = []
        for line in self.metrics_path.read_text(encoding="utf-8").splitlines():
            try:
                value = json.loads(line)
            except ValueError:
                continue  # a torn last line from a kill
            if isinstance(value, dict):
                records.append(value)
        return records

    def keep_metrics_until(self, step: int) -> list[dict[str, Any]]:
        """Drop records after ``step`` (steps a killed invocation did not checkpoint)."""
        kept = [r for r in self.read_metrics() if int(r.get("step", 0)) <= step]
        text = "".join(json.dumps(r, allow_nan=False) + "\n" for r in kept)
        atomic_write_bytes(self.metrics_path, text.encode("utf-8"))
        return kept

    def append_metrics(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(finite(record), allow_nan=False) + "\n"
        fd = open_owner_only(self.metrics_path, os.O_WRONLY | os.O_APPEND)
        try:
            write_all(fd, line.encode("utf-8"))
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- checkpoints -----------------------------------------------------------------------

    def last_resume_point(self) -> Path | None:
        """The newest complete trainer checkpoint (its ``trainer_state.json`` is written
        last, so a checkpoint cut short by a kill is skipped)."""
        if not self.resume_dir.is_dir():
            return None
        found = [
            (int(match.group(1)), entry)
            for entry in self.resume_dir.iterdir()
            if (match := _CHECKPOINT.match(entry.name)) and (entry / "trainer_state.json").is_file()
        ]
        return max(found)[1] if found else None

    def export(self, name: str, save: Callable[[Path], None]) -> Path:
        """``save`` a checkpoint into ``checkpoints/<name>`` (whole or absent, see
        :func:`save_atomically`)."""
        return save_atomically(self.checkpoints / name, save)

    def list_checkpoints(self) -> list[Path]:
        return sorted(p for p in self.checkpoints.iterdir() if p.name.startswith("step-"))

    # -- the rollout server child ------------------------------------------------------------

    def record_server(self, pid: int, port: int | None, instance_id: str) -> None:
        """Remember the running rollout server, so a run killed with -9 can reap it."""
        atomic_write_json(
            self.path / SERVER_FILE, {"pid": pid, "port": port, "instance_id": instance_id}
        )

    def forget_server(self) -> None:
        (self.path / SERVER_FILE).unlink(missing_ok=True)

    def reap_orphan(self) -> int | None:
        """Stop the rollout server an earlier, killed invocation left running (only when it
        still answers ``/health`` with that invocation's instance id); returns its pid."""
        from osmosis_ai.controller.rollout_process import stop_if_ours

        try:
            record = json.loads((self.path / SERVER_FILE).read_text(encoding="utf-8"))
            pid, port, instance = (
                int(record["pid"]),
                int(record["port"]),
                str(record["instance_id"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
        stopped = stop_if_ours(pid, port, instance)
        self.forget_server()
        return pid if stopped else None

    def close(self) -> None:
        self.journal.close()


def _run_log(folder: Path, plan: TrainPlan) -> RunLog:
    """The run's ``logs.txt``, redacting the plan's secret values."""
    return RunLog(folder / LOGS_FILE, Redactor(plan.secrets.values()))
