"""``JobContext``: what the code executing one run is handed, for eval and training alike.

The worker claims a run, checks out the workspace repository at the run's commit, resolves
the run's secrets and environment, and starts the run's process (its own process group) with
a context like this one. ``environ`` is the environment the rollout server must see: the
worker's own, plus the run's ``[env]`` and its secrets (never written to a log: every value is
in ``secret_values`` for redaction). ``work_dir`` is the run's own folder on the worker's
machine; it outlives a crash of the worker, so an attempt on the same machine finds what the
previous one left (an eval journal, a training run dir).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from osmosis_ai.platform.settings import PlatformSettings
from osmosis_ai.platform.store.orm import Run
from osmosis_ai.platform.worker.report import RunReporter


@dataclass
class JobContext:
    settings: PlatformSettings
    run: Run  # detached snapshot as claimed
    attempt: int
    resumed: bool
    checkout: Path  # the workspace repository at run.commit_sha
    work_dir: Path  # persistent per-run folder on this machine
    environ: Mapping[str, str]  # for the rollout process: inherited + [env] + secrets
    secret_values: tuple[str, ...]  # every value to redact from logs
    reporter: RunReporter
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def rollout_dir(self) -> Path:
        return self.checkout / "rollouts" / self.run.rollout_name
