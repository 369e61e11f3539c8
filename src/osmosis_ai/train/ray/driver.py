"""``osmosis train run --ray``, on the machine that runs the command (the driver):
:class:`DriverSession` places the run on a Ray cluster and follows it to its end, with what it
starts beside the trainer workers on GPUs (the vLLM engine).

The driver keeps the run directory's journal and manifest, does the short supervised
warm-up in one process exactly as on one machine, then places ``N`` trainer workers
(:mod:`.worker`) with Ray Train's ``TorchTrainer`` (gloo on CPU, NCCL on GPUs). Every worker
runs TRL's GRPO on its share of each step's prompts (DDP: the gradients are averaged, so a
step is the same update as on one machine), sending its rollouts through the rollout
protocol to the run's fleet of rollout servers (:mod:`.fleet`: the user's entrypoint,
started as on one machine, spread over the nodes), balanced by each server's advertised
capacity, against its own copy of the current policy. Worker 0 writes metrics, checkpoints
(Hugging Face format) and the trainer's resumable state into the run directory, which every
node must see at the same path (one machine, or a shared filesystem). Its events reach the
driver through a Ray queue, so progress renders as on one machine.

A trainer worker that dies ends the worker group; Ray Train's ``FailureConfig`` starts a new
one, which resumes from the last resumable state (logged as a restart); a node that left
takes its worker with it the same way, and the new group is placed on the nodes there are
then.

Nothing waits on placement for ever. A cluster started here declares the logical CPUs the
asked topology needs; on a cluster given by address, a request no arrangement of its nodes
can hold fails at once (:mod:`.placement`). A worker group that does not get its resources
within Ray Train's start deadline (``RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S``, 60 s by
default) ends the run, as does any other error of Ray Train's controller
(:class:`~osmosis_ai.train.errors.RayTrainError`): the controller does not retry on its own,
and the driver watches it (:mod:`.watch`) while it waits. A Ctrl-C before the first step
ends the run at once (there is nothing to save); after it, the workers finish the step and
save. Ray is imported inside functions: importing this module needs only the core package.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from osmosis_ai.deadlines import TRAIN_STEP
from osmosis_ai.distributed.cluster import LOCAL, connect, require_ray
from osmosis_ai.distributed.fleet import FleetStartCancelledError
from osmosis_ai.errors import OsmosisError
from osmosis_ai.train import engine
from osmosis_ai.train.errors import RayTrainError, TrainingError
from osmosis_ai.train.events import StepEvent, TrainEvent, ValidationEvent
from osmosis_ai.train.ray.fleet import TrainingFleet
from osmosis_ai.train.ray.placement import (
    Ask,
    alive_nodes,
    amounts,
    ask_for,
    check_fits,
    local_cpus,
)
from osmosis_ai.train.ray.worker import Finished, WorkerSpec, train_loop
from osmosis_ai.train.session import Session

_FEATURE = "osmosis train run --ray"
_POLL_SEC = 0.25
_FIT_ERROR_GRACE_SEC = 10.0  # for fit() to hand over the error its controller ended with
_ABORT_SEC = 5.0  # for the watch to answer an abort
_ACTOR_START_SEC = 60.0  # for the watch actor to start
START_TIMEOUT_ENV = "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S"
START_TIMEOUT_DEFAULT_SEC = 60.0  # Ray Train's own default for it


class DriverSession(Session):
    """The run on a Ray cluster, from the machine that runs the command; see the module
    docstring. Its status is the one worker 0 reported."""

    def _train(self) -> str:
        require_ray(_FEATURE)
        placement = self.plan.ray
        assert placement is not None
        local = (placement.address or LOCAL).strip() == LOCAL
        connection = connect(placement.address, num_cpus=local_cpus(placement) if local else None)
        try:
            ask = ask_for(self.plan, placement)
            check_fits(ask, connection.address, alive_nodes())
            self._warm_up_here()
            if self.stop.requested:
                raise _stop_early(self)
            return _place(self, ask)
        except _StoppedEarlyError:
            return _ended_early(self)
        finally:
            connection.close()

    def _warm_up_here(self) -> None:
        """The supervised warm-up in this process (so its result is the one-machine run's);
        nothing to do when it is done, skipped, or the run resumes."""
        plan, rundir = self.plan, self.rundir
        warmed = (rundir.warmup / "config.json").is_file()
        if warmed or plan.config.warmup.sft_steps == 0 or rundir.last_resume_point() is not None:
            return
        engine.quiet()
        engine.set_threads(plan.options.torch_threads)
        self._prepare_model(engine.resolve_device(plan.options.device))
        self.model = self.tokenizer = None


class _StoppedEarlyError(OsmosisError):
    """A stop request (Ctrl-C) came before the first step: the run ends at once."""


def _stop_early(run: DriverSession) -> _StoppedEarlyError:
    """Say at once that the run ends (the servers and actors stop after it)."""
    run.stage("interrupted before the first step of this run: nothing new to save")
    return _StoppedEarlyError()


def _ended_early(run: DriverSession) -> str:
    """A run stopped before its first step here: its steps are those of earlier runs."""
    _read_steps(run)
    return "interrupted"


def _read_steps(run: DriverSession) -> None:
    """The run's rewards and steps done, from the metrics worker 0 wrote."""
    records = run.rundir.read_metrics()
    run.rewards = [r.get("training_reward") for r in records]
    run.steps_done = int(records[-1]["step"]) if records else 0


def _place(run: DriverSession, ask: Ask) -> str:
    run.stage(
        f"Ray cluster: {len(alive_nodes())} node(s); {ask.workers} trainer worker(s) "
        f"({'NCCL on GPUs' if ask.gpu else 'gloo on CPU'}) over {ask.servers} rollout server(s)"
    )
    fleet = TrainingFleet(run, ask.servers)
    vllm = None
    try:
        try:
            fleet.start(should_stop=lambda: run.stop.requested)
        except FleetStartCancelledError as exc:
            raise _stop_early(run) from exc
        if run.stop.requested:
            raise _stop_early(run)
        vllm = start_vllm(run) if ask.gpu else None
        return _fit(run, ask, vllm=vllm, fleet=fleet)
    finally:
        if vllm is not None:
            with contextlib.suppress(Exception):
                vllm.close()
        fleet.close()


def _fit(run: DriverSession, ask: Ask, *, vllm: Any, fleet: TrainingFleet) -> str:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.util.queue import Queue

    from osmosis_ai.train.ray.watch import ControllerLookout, FitWatch

    plan, rundir = run.plan, run.rundir
    placement = plan.ray
    assert placement is not None
    events = Queue(actor_options={"num_cpus": 0})
    watch: Any = ray.remote(FitWatch).options(num_cpus=0).remote()  # pyright: ignore[reportAttributeAccessIssue]
    spec = WorkerSpec(
        plan=replace(plan, options=replace(plan.options, stop=None, environ=None)),
        events=events,
        id=uuid.uuid4().hex,
        vllm_url=vllm.url if vllm is not None else None,
        directory=fleet.directory,
        step_deadline_s=TRAIN_STEP.seconds(),
    )
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"spec": spec},
        torch_config=TorchConfig(backend="nccl" if ask.gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=ask.workers,
            use_gpu=ask.gpu,
            resources_per_worker=ask.worker,
            # GPUs: workers together on a node talk over NVLink; CPUs: a node each
            placement_strategy="PACK" if ask.gpu else "SPREAD",
        ),
        run_config=RunConfig(
            name=f"osmosis-{plan.run_name}",
            storage_path=str(rundir.path / "ray"),
            # a controller error (the group did not start in time, …) ends the run rather
            # than being retried for ever; trainer workers that fail restart max_failures times
            failure_config=FailureConfig(
                max_failures=placement.max_failures, controller_failure_limit=0
            ),
            callbacks=[ControllerLookout(watch)],  # pyright: ignore[reportArgumentType]
        ),
    )
    pump = _Pump(run, events, on_first_step=fleet.steps_begun.set)
    pump.start()
    try:
        _await_actor(run, watch, "the driver's watch of Ray Train's controller")
        run.stage(
            f"placing {ask.workers} trainer worker(s) × {amounts(ask.worker)} with Ray Train "
            f"(they get {_start_timeout():g}s to be placed: {START_TIMEOUT_ENV})"
        )
        result = _await_fit(run, trainer, watch, pump, ask)
    finally:
        pump.stop()
        for actor in (events.actor, watch):
            with contextlib.suppress(Exception):
                ray.kill(actor)  # pyright: ignore[reportArgumentType]
    error = getattr(result, "error", None)
    if error is not None:
        raise _ray_train_error(error, ask) from error
    _read_steps(run)
    run.validations = _latest_per_step(pump.validations, run.steps_done)
    if pump.finished is None:
        raise TrainingError("the trainer workers ended without reporting how the run ended")
    return pump.finished.status


def _await_actor(run: DriverSession, actor: Any, what: str) -> None:
    """Wait until ``actor`` answers (a Ctrl-C meanwhile ends the run at once)."""
    import ray

    probe = actor.read.remote()
    deadline = time.monotonic() + _ACTOR_START_SEC
    while not ray.wait([probe], timeout=_POLL_SEC)[0]:
        if run.stop.requested:
            raise _stop_early(run)
        if time.monotonic() > deadline:
            raise TrainingError(
                f"{what} (a Ray actor of no resources) did not start within "
                f"{_ACTOR_START_SEC:g}s: the cluster's head node is overloaded or its raylet "
                "is down; see `ray status`"
            )


def _start_timeout() -> float:
    try:
        return float(os.environ.get(START_TIMEOUT_ENV, "") or START_TIMEOUT_DEFAULT_SEC)
    except ValueError:
        return START_TIMEOUT_DEFAULT_SEC


def _await_fit(run: DriverSession, trainer: Any, watch: Any, pump: _Pump, ask: Ask) -> Any:
    """``trainer.fit()`` in a thread of its own while this (main) thread waits on it and on
    the controller's watch: called from the main thread, Ray Train puts in its own SIGINT
    handler, which aborts the workers at once; here the run's own stays, so a first Ctrl-C
    finishes the step and saves (the stop reaches the workers through the fleet's
    directory; before the first step it aborts the controller and ends the run) and a
    second one quits. A controller that errored ends the run as soon as it is seen."""
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="osmosis-ray-fit", daemon=True)
    thread.start()
    reader = _WatchReader(watch)
    placed = False
    while thread.is_alive():
        thread.join(_POLL_SEC)  # (a timeout: the main thread keeps taking signals)
        if not thread.is_alive():
            break
        if run.stop.requested and not pump.stepped:
            stopped = _stop_early(run)
            _abort(watch)  # (fit() returns once its controller is gone: no need to wait)
            raise stopped
        seen = reader.latest()
        if seen is None:
            continue
        if seen.running_since and not placed:
            placed = True
            run.stage(f"trainer workers placed: {ask.workers}")
        if seen.failed is not None:
            thread.join(_FIT_ERROR_GRACE_SEC)  # fit() hands over the error itself, or:
            if thread.is_alive() and seen.stalled is not None:
                raise seen.stalled  # a worker's step deadline: the run ends with its error
            if thread.is_alive():
                raise RayTrainError(
                    _ray_train_message(seen.failed, seen.detail, ask), ray_error=seen.failed
                )
            break
    if "error" in outcome:
        error: BaseException = outcome["error"]
        if isinstance(error, TrainingError):
            raise error
        from osmosis_ai.train.ray.watch import stalled_step

        stalled = stalled_step(error)
        if stalled is not None:  # a worker's step deadline: the run ends with its error
            raise stalled from error
        raise _ray_train_error(error, ask) from error
    return outcome["result"]


class _WatchReader:
    """Reads the controller's watch without waiting on it: one read in flight at a time,
    its answer taken once it came (a watch that is still starting delays nothing)."""

    def __init__(self, watch: Any) -> None:
        self.watch = watch
        self.pending: Any = None

    def latest(self) -> Any:
        """The sighting that came since the last call, or ``None``."""
        import ray

        if self.pending is None:
            self.pending = self.watch.read.remote()
        ready, _ = ray.wait([self.pending], timeout=0)
        if not ready:
            return None
        pending, self.pending = self.pending, None
        try:
            return ray.get(pending)
        except Exception:  # the watch is gone (the run is ending)
            return None


def _abort(watch: Any) -> None:
    """End Ray Train's controller and, with it, the worker group it owns: killed, not asked
    (while it waits for the group's resources it answers no call); one that has not started
    yet ends itself as it starts (:class:`~osmosis_ai.train.ray.watch.RunAbortedError`)."""
    import ray

    try:
        controller: Any = ray.get(watch.abort.remote(), timeout=_ABORT_SEC)
    except Exception:
        return
    if controller is not None:
        with contextlib.suppress(Exception):
            ray.kill(controller, no_restart=True)


def _ray_train_error(error: BaseException, ask: Ask) -> RayTrainError:
    from osmosis_ai.train.ray.watch import ray_error_of

    cause = ray_error_of(error)
    name = type(cause).__name__
    return RayTrainError(_ray_train_message(name, str(cause), ask), ray_error=name)


def _ray_train_message(name: str, detail: str, ask: Ask) -> str:
    lines = detail.strip().splitlines()
    shown = "\n".join(lines[:12]) + ("\n…" if len(lines) > 12 else "")
    message = f"Ray Train ended the run with {name}: {shown}"
    if name == "WorkerGroupStartupTimeoutError":
        message += (
            f"\nThe {ask.workers} trainer worker(s) × {amounts(ask.worker)} did not get their "
            f"resources within {_start_timeout():g}s ({START_TIMEOUT_ENV}): other work holds "
            "the cluster's resources. Free them, add nodes, or ask for fewer trainer workers "
            "(--trainer-workers)"
        )
    return message


def _latest_per_step(summaries: list[Any], last: int) -> list[Any]:
    """Validations in step order, the latest of each step (a restarted group repeats the
    steps after its checkpoint), none past the last step kept."""
    latest = {s.step: s for s in summaries if s.step <= last}
    return [latest[step] for step in sorted(latest)]


class _Pump:
    """Relays worker 0's events to the driver's sink, in a thread while ``fit`` runs;
    ``stepped``: a step's event came (from then on, a stop request finishes a step)."""

    def __init__(
        self, run: DriverSession, events: Any, on_first_step: Callable[[], object] | None = None
    ) -> None:
        self.run = run
        self.events = events
        self.validations: list[Any] = []
        self.finished: Finished | None = None
        self.stepped = False
        self._on_first_step = on_first_step
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
        if isinstance(event, StepEvent) and not self.stepped:
            self.stepped = True
            if self._on_first_step is not None:
                self._on_first_step()
        if isinstance(event, ValidationEvent):
            self.validations.append(event.summary)
        self.run.emit(event)


# -- what the driver starts beside the workers ------------------------------------------------


_VLLM_START_SEC = 900.0


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


def start_vllm(run: DriverSession) -> VllmEngine:
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
