"""``osmosis train run --ray``: the same run, its steps on a Ray cluster. Both sides live
here: the driver's (:func:`train_on_ray`) and the workers' entry point (:func:`train_loop`,
which runs ``runner.WorkerRun``), with what the driver starts beside the workers on GPUs
(the vLLM engine).

The machine that runs the command (the driver) keeps the run directory's journal and
manifest, does the short supervised warm-up in one process exactly as on one machine, then
places ``N`` trainer workers with Ray Train's ``TorchTrainer`` (gloo on CPU, NCCL on GPUs).
Every worker runs TRL's GRPO on its share of each step's prompts (DDP: the gradients are
averaged, so a step is the same update as on one machine), sending its rollouts through the
rollout protocol to the run's fleet of rollout servers (:mod:`osmosis_ai.train.ray_fleet`:
the user's entrypoint, started as on one machine, spread over the nodes), balanced by each
server's advertised capacity, against its own copy of the current policy.
Worker 0 writes metrics, checkpoints (Hugging Face format) and the trainer's resumable
state into the run directory, which every node must see at the same path (one machine, or a
shared filesystem). Its events reach the driver through a Ray queue, so progress renders as
on one machine.

A trainer worker that dies ends the worker group; Ray Train's ``FailureConfig`` starts a new
one, which resumes from the last resumable state (logged as a restart); a node that left
takes its worker with it the same way, and the new group is placed on the nodes there are
then (Ray waits for room when there is none).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from osmosis_ai.train import engine
from osmosis_ai.train.collect import StepStats
from osmosis_ai.train.errors import TrainingError
from osmosis_ai.train.events import TrainEvent, ValidationEvent
from osmosis_ai.train.plan import RayPlacement, TrainPlan, check_split
from osmosis_ai.train.ray_fleet import FleetOwner, TrainingFleet
from osmosis_ai.train.rundir import RunDir

if TYPE_CHECKING:
    from osmosis_ai.train.events import EvalSummary


class Session(FleetOwner, Protocol):
    """What the driver uses of the run (``runner._Run``): what its fleet uses, and more."""

    rewards: list[float | None]
    validations: list[EvalSummary]
    steps_done: int
    model: Any
    tokenizer: Any

    def emit(self, event: TrainEvent) -> None: ...

    def _prepare_model(self, device: str) -> None: ...


_FEATURE = "osmosis train run --ray"
_POLL_SEC = 0.25


@dataclass(frozen=True)
class Finished:
    """Worker 0's last word: how its run ended."""

    status: str
    steps_done: int


@dataclass(frozen=True)
class WorkerSpec:
    """What each trainer worker gets: the plan (without what cannot travel), its events
    queue, and
    the vLLM server URL on GPUs (``None``: the local policy)."""

    plan: TrainPlan
    events: Any
    worker: Any  # the class each worker runs (``runner.WorkerRun``)
    id: str  # this invocation's (a restarted worker group counts its starts by it)
    vllm_url: str | None = None
    directory: Any = None  # the fleet's directory actor (``FleetDirectory``)


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [node for node in ray.nodes() if node.get("Alive")]


def resolve_workers(placement: RayPlacement, completions: int) -> int:
    """The trainer workers to place; ``0`` asks for one per alive node (the most, up to
    that, that share a step's completions equally)."""
    nodes = max(1, len(alive_nodes()))
    workers = placement.trainer_workers or _largest_divisor(completions, nodes)
    check_split(completions, workers)
    return workers


def _largest_divisor(completions: int, at_most: int) -> int:
    return next(n for n in range(at_most, 0, -1) if completions % n == 0)


def cluster_has_gpus() -> bool:
    import ray

    return float(ray.cluster_resources().get("GPU", 0)) > 0


def train_on_ray(run: Session, worker: type[Any]) -> str:
    """The driver's side of a run on Ray; returns its status as ``runner._Run._train`` does."""
    from osmosis_ai.distributed.cluster import connect, require_ray

    require_ray(_FEATURE)
    plan = run.plan
    placement = plan.ray
    assert placement is not None
    _warm_up_here(run)
    connection = connect(placement.address)
    try:
        return _place(run, worker, placement)
    finally:
        connection.close()


def _place(run: Session, worker: type[Any], placement: RayPlacement) -> str:
    plan = run.plan
    completions = plan.batch * plan.group
    workers = resolve_workers(placement, completions)
    gpu = cluster_has_gpus() and (plan.options.device or "cuda").startswith("cuda")
    servers = placement.rollout_servers or len(alive_nodes())
    run.stage(
        f"Ray cluster: {len(alive_nodes())} node(s); {workers} trainer worker(s) "
        f"({'NCCL on GPUs' if gpu else 'gloo on CPU'}) over {servers} rollout server(s)"
    )
    fleet = TrainingFleet(run, servers)
    vllm = None
    try:
        fleet.start()
        vllm = start_vllm(run) if gpu else None
        return _fit(run, worker, workers, gpu, vllm=vllm, fleet=fleet)
    finally:
        if vllm is not None:
            with contextlib.suppress(Exception):
                vllm.close()
        fleet.close()


def _warm_up_here(run: Session) -> None:
    """The supervised warm-up in this process (so its result is the one-machine run's);
    nothing to do when it is done, skipped, or the run resumes."""
    plan, rundir = run.plan, run.rundir
    warmed = (rundir.warmup / "config.json").is_file()
    if warmed or plan.config.warmup.sft_steps == 0 or rundir.last_resume_point() is not None:
        return
    engine.quiet()
    engine.set_threads(plan.options.torch_threads)
    run._prepare_model(engine.resolve_device(plan.options.device))  # pyright: ignore[reportPrivateUsage]
    run.model = run.tokenizer = None


def _fit(run: Session, worker: type[Any], workers: int, gpu: bool, *, vllm: Any, fleet: Any) -> str:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Queue

    plan, rundir = run.plan, run.rundir
    placement = plan.ray
    assert placement is not None
    events = Queue(actor_options={"num_cpus": 0})
    spec = WorkerSpec(
        plan=replace(plan, options=replace(plan.options, stop=None, environ=None)),
        events=events,
        worker=worker,
        id=uuid.uuid4().hex,
        vllm_url=vllm.url if vllm is not None else None,
        directory=fleet.directory,
    )
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"spec": spec},
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=workers,
            use_gpu=gpu,
            resources_per_worker=_worker_resources(gpu),
            # GPUs: workers together on a node talk over NVLink; CPUs: a node each
            placement_strategy="PACK" if gpu else "SPREAD",
        ),
        run_config=RunConfig(
            name=f"osmosis-{plan.run_name}",
            storage_path=str(rundir.path / "ray"),
            failure_config=FailureConfig(max_failures=placement.max_failures),
        ),
    )
    pump = _Pump(run, events)
    pump.start()
    try:
        result = _fit_aside(trainer)
    finally:
        pump.stop()
        with contextlib.suppress(Exception):
            ray.kill(events.actor)  # pyright: ignore[reportArgumentType]
    error = getattr(result, "error", None)
    if error is not None:
        raise TrainingError(f"the trainer workers failed: {error}") from error
    records = rundir.read_metrics()
    run.rewards = [r.get("training_reward") for r in records]
    run.steps_done = int(records[-1]["step"]) if records else 0
    run.validations = _latest_per_step(pump.validations, run.steps_done)
    if pump.finished is None:
        raise TrainingError("the trainer workers ended without reporting how the run ended")
    return pump.finished.status


def _fit_aside(trainer: Any) -> Any:
    """``trainer.fit()`` in a thread of its own while this (main) thread waits: called from
    the main thread, Ray Train puts in its own SIGINT handler, which aborts the workers at
    once; here the run's own stays, so a first Ctrl-C finishes the step and saves (the
    stop reaches the workers through the fleet's directory) and a second one quits."""
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="osmosis-ray-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        thread.join(_POLL_SEC)  # (a timeout: the main thread keeps taking signals)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _worker_resources(gpu: bool) -> dict[str, float]:
    return {"CPU": 1.0, **({"GPU": 1.0} if gpu else {})}


def _latest_per_step(summaries: list[Any], last: int) -> list[Any]:
    """Validations in step order, the latest of each step (a restarted group repeats the
    steps after its checkpoint), none past the last step kept."""
    latest = {s.step: s for s in summaries if s.step <= last}
    return [latest[step] for step in sorted(latest)]


class _Pump:
    """Relays worker 0's events to the driver's sink, in a thread while ``fit`` runs."""

    def __init__(self, run: Session, events: Any) -> None:
        self.run = run
        self.events = events
        self.validations: list[Any] = []
        self.finished: Finished | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="osmosis-ray-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._drain()

    def _loop(self) -> None:
        from ray.util.queue import Empty

        while not self._stop.is_set():
            try:
                item = self.events.get(timeout=_POLL_SEC)
            except Empty:
                continue
            except Exception:  # the queue actor is gone (the run is ending)
                return
            self._handle(item)

    def _drain(self) -> None:
        with contextlib.suppress(Exception):
            while not self.events.empty():
                self._handle(self.events.get_nowait())

    def _handle(self, item: Any) -> None:
        if isinstance(item, Finished):
            self.finished = item
            return
        event: TrainEvent = item
        if isinstance(event, ValidationEvent):
            self.validations.append(event.summary)
        self.run.emit(event)


# -- the trainer workers' side -------------------------------------------------------------


_SUMMED = (
    "rollouts",
    "scored",
    "failed",
    "groups",
    "groups_without_signal",
    "chain_breaks",
    "dropped_calls",
    "truncated",
    "model_tokens",
    "env_tokens",
    "total_tokens",
)
_VLLM_START_SEC = 900.0


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
        spec.worker(plan, rundir, spec, context.get_world_rank(), context.get_world_size()).work()
    finally:
        rundir.close()


def summed(stats: StepStats) -> StepStats:
    """One step's rollout numbers over every worker (counts added, times the longest)."""
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    sums = torch.tensor([float(getattr(stats, n)) for n in _SUMMED], dtype=torch.float64)
    longest = torch.tensor([stats.seconds, stats.wait_seconds], dtype=torch.float64)
    sums, longest = sums.to(device), longest.to(device)
    dist.all_reduce(sums)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    counts = {name: round(value) for name, value in zip(_SUMMED, sums.tolist(), strict=True)}
    seconds, wait = longest.tolist()
    return replace(stats, **counts, seconds=seconds, wait_seconds=wait, policy_batches=None)


# -- what the driver starts beside the workers ------------------------------------------------


@dataclass
class VllmEngine:
    """A vLLM server on the cluster (a Ray actor holding a GPU) that every worker's
    rollouts reach over HTTP; worker 0's TRL pushes the weights to it over NCCL after each
    update (TRL's vLLM server mode)."""

    actor: Any
    url: str

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            ray.get(self.actor.stop.remote(), timeout=30)
        ray.kill(self.actor)


def start_vllm(run: Session) -> VllmEngine:
    """Place TRL's vLLM server on one GPU of the cluster and wait until it answers."""
    import ray

    plan = run.plan
    if not float(ray.cluster_resources().get("GPU", 0)):
        raise TrainingError("the vLLM engine needs a GPU, and this Ray cluster has none")
    actor: Any = ray.remote(num_gpus=1, num_cpus=1)(VllmServer).remote()  # pyright: ignore[reportFunctionMemberAccess]
    run.stage(f"starting a vLLM engine for {plan.model_ref} on a cluster GPU")
    url = str(ray.get(actor.start.remote(plan.model_ref, plan.config.training.seed)))
    run.stage(f"vLLM engine ready at {url}")
    return VllmEngine(actor, url)


class VllmServer:
    """The actor's body: ``trl vllm-serve`` on this node's address and a free port."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, model: str, seed: int) -> str:
        import socket

        import httpx
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((host, 0))
            port = probe.getsockname()[1]
        command = [sys.executable, "-m", "trl.scripts.vllm_serve", "--model", model]
        command += ["--host", host, "--port", str(port), "--seed", str(seed)]
        self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL)
        url = f"http://{host}:{port}"
        deadline = time.monotonic() + _VLLM_START_SEC
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TrainingError(f"trl vllm-serve exited with code {self.process.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health/", timeout=5).status_code == 200:
                    return url
            time.sleep(2)
        raise TrainingError(f"trl vllm-serve did not answer at {url} in {_VLLM_START_SEC:.0f}s")

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
