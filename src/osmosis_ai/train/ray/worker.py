"""The trainer workers of ``osmosis train run --ray``: Ray Train's loop on each worker
(:func:`train_loop`), which runs a :class:`WorkerSession` on the worker's share of each step's
prompts, with torch.distributed (set up by Ray Train: gloo on CPU, NCCL on GPUs) spanning the
workers. Ray and torch are imported inside the functions that run on the workers.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from osmosis_ai.rundir.durable import atomic_write_json
from osmosis_ai.train.bridge import RolloutBridge, TrainingUpstream
from osmosis_ai.train.collect import StepStats
from osmosis_ai.train.events import EventSink, TrainEvent, WarningEvent
from osmosis_ai.train.plan import TrainPlan
from osmosis_ai.train.rundir import RunDir
from osmosis_ai.train.session import Session


@dataclass(frozen=True)
class Finished:
    """Worker 0's last word: how its run ended."""

    status: str
    steps_done: int


@dataclass(frozen=True)
class WorkerSpec:
    """What each trainer worker gets: the plan (without what cannot travel), its events
    queue, and the vLLM server URL on GPUs (``None``: the local policy)."""

    plan: TrainPlan
    events: Any  # a Ray queue the driver reads
    id: str  # this invocation's (a restarted worker group counts its starts by it)
    vllm_url: str | None = None
    directory: Any = None  # the fleet's directory actor (``FleetDirectory``)
    step_deadline_s: float | None = None  # the driver's trainer step deadline


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's ``train_loop_per_worker``."""
    import ray.train

    spec: WorkerSpec = config["spec"]
    context = ray.train.get_context()
    plan = spec.plan
    if spec.vllm_url is not None:
        plan = replace(plan, options=replace(plan.options, vllm_server_url=spec.vllm_url))
    rundir = RunDir.attach(plan)
    try:
        WorkerSession(plan, rundir, spec, context.get_world_rank(), context.get_world_size()).work()
    finally:
        rundir.close()


_SUMMED = (
    "rollouts",
    "scored",
    "failed",
    "groups",
    "groups_without_signal",
    "token_segments",
    "chain_breaks",
    "dropped_calls",
    "truncated",
    "model_tokens",
    "env_tokens",
    "total_tokens",
    "stale_tokens",
    "staleness_sum",
    "stale_regenerated",
)


def summed(stats: StepStats) -> StepStats:
    """One step's rollout numbers over every worker (counts added; times and
    ``staleness_max`` the largest of the workers')."""
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    sums = torch.tensor([float(getattr(stats, n)) for n in _SUMMED], dtype=torch.float64)
    longest = torch.tensor(
        [stats.seconds, stats.wait_seconds, float(stats.staleness_max)], dtype=torch.float64
    )
    sums, longest = sums.to(device), longest.to(device)
    dist.all_reduce(sums)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    counts = {name: round(value) for name, value in zip(_SUMMED, sums.tolist(), strict=True)}
    seconds, wait, staleness = longest.tolist()
    return replace(
        stats,
        **counts,
        seconds=seconds,
        wait_seconds=wait,
        staleness_max=round(staleness),
        policy_batches=None,
    )


class WorkerSession(Session):
    """One trainer worker's part of a run on Ray: the run on its share of each step's
    prompts, with torch.distributed (set up by Ray Train) spanning the workers. Worker 0
    leads: it validates, writes metrics and checkpoints, and relays the run's events to the
    driver; each step's rollout counts are summed over the workers."""

    def __init__(
        self, plan: TrainPlan, rundir: RunDir, spec: WorkerSpec, rank: int, world: int
    ) -> None:
        sink: EventSink = self._relay
        super().__init__(plan, rundir, sink)
        self.spec = spec
        self.rank = rank
        self.world = world
        self.leads = rank == 0
        self.attempt = 1
        self.bridge: RolloutBridge | None = None

    def step_deadline_s(self) -> float:
        """The driver's trainer step deadline (a worker's own environment may differ)."""
        deadline = self.spec.step_deadline_s
        return super().step_deadline_s() if deadline is None else float(deadline)

    def _relay(self, event: TrainEvent) -> None:
        if self.leads:
            self.spec.events.put(event)

    def stage(self, message: str, **details: object) -> None:
        if self.leads:
            super().stage(message, **details)
        else:
            self.journal.info(f"worker-{self.rank}", message, **details)

    def work(self) -> None:
        import ray

        self.journal.info(
            "ray",
            f"trainer worker {self.rank} of {self.world} started",
            rank=self.rank,
            node=ray.util.get_node_ip_address(),
            pid=os.getpid(),
        )
        if self.leads:
            self.attempt = self._count_attempt()
        status = self._train()
        if self.leads:
            self.spec.events.put(Finished(status, self.steps_done))

    def _count_attempt(self) -> int:
        """Which start of the worker group this is, within this invocation."""
        folder = self.rundir.path / "ray"
        folder.mkdir(exist_ok=True)
        path = folder / "attempts.json"
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            record = {}
        attempt = int(record.get("attempts", 0)) + 1 if record.get("id") == self.spec.id else 1
        atomic_write_json(path, {"id": self.spec.id, "attempts": attempt})
        return attempt

    def _resume_from(self) -> Path | None:
        point = self.rundir.last_resume_point()
        if self.leads and self.attempt > 1:
            where = (
                f"resuming after step {point.name.rpartition('-')[2]} ({point.name})"
                if point is not None
                else "starting over (no resumable state was saved yet)"
            )
            message = (
                f"the trainer workers restarted after a failure (start {self.attempt} of this "
                f"invocation): {where}"
            )
            self.journal.warning("ray", message, attempt=self.attempt)
            self.emit_warning("TRAINER_RESTARTED", message)
            if point is None:
                self.rundir.keep_metrics_until(0)
        return point

    def emit_warning(self, code: str, message: str) -> None:
        self.warnings.append(message)
        self.emit(WarningEvent(code, self.journal.redact(message)))

    def _bridge(self, upstream: TrainingUpstream) -> RolloutBridge:
        import ray

        config = self.plan.config
        assert config.rollout_dir is not None and config.entrypoint_path is not None
        servers, _stopping = ray.get(self.spec.directory.poll.remote())
        host = str(ray.util.get_node_ip_address())
        self.stage(f"controller on {host}, balancing over rollout servers: {len(servers)}")
        self.bridge = RolloutBridge(
            rollout_dir=config.rollout_dir,
            entrypoint=config.entrypoint_path,
            artifact_root=self.rundir.rollouts,
            upstream=upstream,
            env=self.server_env(),
            on_output=self._server_output,
            servers=servers,
            host=host,
            on_fleet=self._fleet_event,
        )
        return self.bridge

    def after_step(self, step: int) -> bool:
        """The step's end as on one machine; then, in one call to the fleet's directory, the
        rollout servers the next steps use (as the driver last published them) and whether
        to stop: the driver's stop request, agreed by every worker (so all stop after the
        same step, as DDP needs)."""
        import ray
        import torch
        import torch.distributed as dist

        super().after_step(step)
        servers, asked = ray.get(self.spec.directory.poll.remote(), timeout=60)
        if self.bridge is not None:
            self.bridge.follow(servers)
        flag = torch.tensor([1.0 if asked else 0.0])
        if dist.is_initialized() and self.world > 1:
            flag = flag.to("cuda" if dist.get_backend() == "nccl" else "cpu")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() > 0:
            self.stop.request()
        return self.stop.requested

    def _next_rows(self, step: int) -> list[int] | None:
        """This worker's share of ``step``'s prompts: the data loader gives worker ``r`` the
        ``r``-th equal slice of the step's prompts in TRL's order (a wrong guess costs only
        the rollouts dispatched ahead: the collector cancels them and stops guessing)."""
        rows = super()._next_rows(step)
        if rows is None:
            return None
        share = len(rows) // self.world
        return rows[self.rank * share : (self.rank + 1) * share]

    def _fleet_event(self, event: str, url: str, detail: str) -> None:
        message = f"rollout server {url} {event}: {detail}"
        if event in ("died", "unreachable"):
            self.journal.warning(f"worker-{self.rank}", message)
        else:
            self.journal.info(f"worker-{self.rank}", message)

    def record_step(self, step: int, logs: dict[str, Any]) -> bool:
        accelerator = self.trainer.accelerator
        if accelerator.num_processes != self.world:  # TRL would train each worker alone
            raise RuntimeError(
                f"trainer worker {self.rank}: the trainer sees {accelerator.num_processes} "
                f"processes (rank {accelerator.process_index}), Ray Train placed {self.world}"
            )
        collector = self.collector
        if collector is not None and collector.last is not None and self.world > 1:
            collector.last = summed(collector.last)
        # the lead records (not ray.train.report: it waits for Ray Train's controller, up to
        # 2 s a step; the run dir holds the metrics and the resumable state); every worker
        # watches the learning signal, so all stop after the same step
        return super().record_step(step, logs)
