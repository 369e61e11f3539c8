"""The rollout side of a training run: the rollout server child, the controller service
(policy proxy + callback listener) and a dispatcher, on an event loop of their own thread.

The trainer is synchronous; :meth:`RolloutBridge.run` hands a batch of rollouts to that
loop and blocks until every one has an outcome. The proxy serves the trainer's own model
through :class:`TrainingUpstream`, which imposes the run's sampling settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis_ai.controller.dispatch import Dispatcher, DispatchOutcome, DispatchRequest
from osmosis_ai.controller.loop import new_event_loop
from osmosis_ai.controller.proxy import PolicyProxy
from osmosis_ai.controller.rollout_process import RolloutServerProcess
from osmosis_ai.controller.service import ControllerService
from osmosis_ai.controller.upstream import Preflight, Upstream
from osmosis_ai.errors import UsageError
from osmosis_ai.train.errors import TrainingError

if TYPE_CHECKING:
    from osmosis_ai.controller.policy import LocalPolicy

POLICY_MODEL_NAME = "osmosis-policy"


class TrainingUpstream:
    """The upstream the proxy serves during training: the trainer's policy (the local
    policy over the shared model, or a vLLM server TRL keeps in sync). Every request gets
    the run's ``temperature`` and ``top_p`` (the trainer's log-probabilities assume them)
    and at most ``max_tokens`` new tokens, whatever the agent asked for."""

    def __init__(self, *, temperature: float, top_p: float, max_tokens: int) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self._inner: Upstream | None = None
        self._local: LocalPolicy | None = None
        self._version: Callable[[], int] = lambda: 0

    def serve(self, inner: Upstream, version: Callable[[], int]) -> None:
        """Serve ``inner`` from now on; ``version()`` is the policy version it generates."""
        self._inner = inner
        self._local = None
        self._version = version

    def serve_local(self, policy: LocalPolicy) -> None:
        """Serve the local policy (sharing the trainer's model) under our model name."""
        from osmosis_ai.controller.policy import LocalPolicyUpstream

        self.serve(LocalPolicyUpstream(policy, model=POLICY_MODEL_NAME), lambda: policy.version)
        self._local = policy

    @property
    def policy_version(self) -> int:
        return self._version()

    @property
    def batches(self) -> int | None:
        """Generation batches the local policy has run so far (``None``: not served locally)."""
        return None if self._local is None else self._local.batches

    def hold(self, held: bool) -> bool:
        """Start no generation while held (requests queue); ``False`` when this upstream
        cannot hold (it is not the local policy)."""
        if self._local is None:
            return False
        self._local.hold(held)
        return True

    def expect_callers(self, count: int) -> None:
        """How many rollouts are in flight: the local policy waits for that many requests
        before it starts a batch (other upstreams batch on their own)."""
        if self._local is not None:
            self._local.expect_callers(count)

    @property
    def model(self) -> str:
        return POLICY_MODEL_NAME if self._inner is None else self._inner.model

    @property
    def target(self) -> str:
        return "training-policy" if self._inner is None else self._inner.target

    def _upstream(self) -> Upstream:
        if self._inner is None:
            raise UsageError("the training policy is not ready yet: call serve() first")
        return self._inner

    def impose(self, body: dict[str, Any]) -> dict[str, Any]:
        asked = body.pop("max_completion_tokens", None) or body.get("max_tokens")
        wanted = asked if isinstance(asked, int) and not isinstance(asked, bool) else None
        body["max_tokens"] = min(wanted or self.max_tokens, self.max_tokens)
        body["temperature"] = self.temperature
        body["top_p"] = self.top_p
        return body

    async def complete(self, body: dict[str, Any]) -> bytes:
        return await self._upstream().complete(self.impose(body))

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        async for payload in self._upstream().stream(self.impose(body)):
            yield payload

    async def preflight(self) -> Preflight:
        return await self._upstream().preflight()

    async def aclose(self) -> None:
        if self._inner is not None:
            await self._inner.aclose()


@dataclass(frozen=True)
class RolloutBatch:
    """Rollouts :meth:`RolloutBridge.launch` started; their outcomes come from
    :meth:`RolloutBridge.finish`."""

    task: asyncio.Task[list[DispatchOutcome]]


class RolloutBridge:
    """Starts and owns the rollout server process and the controller service (127.0.0.1
    only); :meth:`run` dispatches rollouts through them from the trainer's thread."""

    def __init__(
        self,
        *,
        rollout_dir: Path,
        entrypoint: Path,
        artifact_root: Path,
        upstream: TrainingUpstream,
        env: Mapping[str, str] | None = None,
        port: int | None = None,
        on_output: Callable[[str], None] | None = None,
        on_spawn: Callable[[RolloutServerProcess], None] | None = None,
    ) -> None:
        self.upstream = upstream
        self.on_spawn = on_spawn
        self.proxy = PolicyProxy(upstream, request_token_data=True)
        self.service = ControllerService(self.proxy)
        self.server = RolloutServerProcess(
            rollout_dir=rollout_dir,
            entrypoint=entrypoint,
            artifact_root=artifact_root,
            env=dict(env or {}),
            port=port,
            on_output=on_output,
        )
        self._dispatcher: Dispatcher | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pending: set[Future[Any]] = set()
        self._batches: set[asyncio.Task[list[DispatchOutcome]]] = set()
        self._finished: list[str] = []
        self._pruning: threading.Thread | None = None

    @property
    def secrets(self) -> tuple[str, ...]:
        """The run's bearer tokens, for the log redactor."""
        return (self.proxy.token, self.service.controller_token)

    @property
    def generation(self) -> str | None:
        return None if self._dispatcher is None else self._dispatcher.generation

    def alive(self) -> bool:
        return self.server.alive()

    def output_tail(self) -> str:
        return self.server.output_tail()

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> RolloutBridge:
        """Start the loop thread, the controller service and the rollout server; returns
        once the server is healthy and its protocol generation is known."""
        if self._loop is not None:
            raise UsageError("the rollout bridge is already started")
        loop = new_event_loop()  # uvloop when installed
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="osmosis-train-io")
        self._thread.daemon = True
        self._thread.start()
        try:
            self._call(self._start())
        except BaseException:
            self.close()
            raise
        return self

    async def _start(self) -> None:
        await self.service.start()
        await asyncio.to_thread(self.server.command)  # decides: this interpreter or uv
        if self.server.isolated:
            await asyncio.to_thread(self.server.sync)
        starting = asyncio.ensure_future(asyncio.to_thread(self.server.start))
        seen: int | None = None
        while not starting.done():  # report the child as soon as it exists (orphan reaping)
            process = self.server.process
            if process is not None and process.pid != seen and self.on_spawn is not None:
                seen = process.pid
                self.on_spawn(self.server)
            await asyncio.wait({starting}, timeout=0.02)
        await starting
        if self.on_spawn is not None:
            self.on_spawn(self.server)  # the final port, once healthy
        self._dispatcher = Dispatcher(self.server.url, self.service)
        await self._dispatcher.detect_generation()

    def run(self, requests: Sequence[DispatchRequest]) -> list[DispatchOutcome]:
        """Dispatch every request at once; one outcome each, in order."""
        return self.finish(self.launch(requests))

    def launch(self, requests: Sequence[DispatchRequest]) -> RolloutBatch:
        """Start dispatching every request at once and return without waiting; collect the
        outcomes with :meth:`finish` (or drop them with :meth:`abandon`)."""
        if self._dispatcher is None:
            raise UsageError("the rollout bridge is not started")
        if not self.server.alive():
            code = self.server.process.returncode if self.server.process else None
            raise TrainingError(
                f"the rollout server exited (code {code}); its last output:\n{self.output_tail()}"
            )
        dispatcher, upstream = self._dispatcher, self.upstream
        in_flight = len(requests)
        self._join_pruning()  # never rmdir beside the server's mkdirs: both slow down

        async def run_one(request: DispatchRequest) -> DispatchOutcome:
            nonlocal in_flight
            try:
                return await dispatcher.run(request)
            finally:
                in_flight -= 1
                upstream.expect_callers(in_flight)

        async def run_all() -> list[DispatchOutcome]:
            # The policy batches best when it knows how many rollouts may still ask it.
            upstream.expect_callers(in_flight)
            try:
                return list(await asyncio.gather(*(run_one(r) for r in requests)))
            finally:
                upstream.expect_callers(0)

        async def spawn() -> asyncio.Task[list[DispatchOutcome]]:
            task = asyncio.ensure_future(run_all())
            self._batches.add(task)
            task.add_done_callback(self._batches.discard)
            return task

        return RolloutBatch(self._call(spawn()))

    def finish(self, batch: RolloutBatch) -> list[DispatchOutcome]:
        """Wait for the outcomes of a :meth:`launch`, in the order of its requests."""

        async def outcomes() -> list[DispatchOutcome]:
            return await batch.task  # cancelling this wait (close) cancels the batch

        result: list[DispatchOutcome] = self._call(outcomes())
        # <artifact_root>/<rollout id>/artifacts/ exists when the rollout asked for it: drop
        # the empty ones a batch late (so late trajectory files land first), in the
        # background while the trainer updates.
        previous, self._finished = self._finished, [o.rollout_id for o in result]
        if previous:
            self._pruning = threading.Thread(
                target=self._prune, args=(previous,), name="osmosis-prune", daemon=True
            )
            self._pruning.start()
        return result

    def abandon(self, batch: RolloutBatch) -> None:
        """Cancel a :meth:`launch` nobody will collect (its remote rollouts too) and wait
        until it has wound down."""

        async def cancel() -> None:
            batch.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await batch.task

        self._call(cancel())

    def _prune(self, rollout_ids: Sequence[str]) -> None:
        root = self.server.artifact_root
        for rollout_id in rollout_ids:
            for folder in (root / rollout_id / "artifacts", root / rollout_id):
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def _join_pruning(self) -> None:
        if self._pruning is not None:
            self._pruning.join()
            self._pruning = None

    def _call(self, coroutine: Any) -> Any:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        self._pending.add(future)
        try:
            return future.result()
        finally:
            self._pending.discard(future)

    def close(self) -> None:
        """Cancel what is in flight, stop the server and the service, end the thread
        (idempotent; ends only the processes this bridge started)."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        for future in list(self._pending):
            future.cancel()
        if loop.is_running():
            closing = asyncio.run_coroutine_threadsafe(self._close(), loop)
            with contextlib.suppress(Exception):  # best effort: the server is stopped below
                closing.result(timeout=30)
        self.server.stop()
        self._join_pruning()
        self._prune(self._finished)
        self._finished = []
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        if not thread.is_alive():
            loop.close()
        self._loop = self._thread = None

    async def _close(self) -> None:
        for task in list(self._batches):  # launched and never collected
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._dispatcher is not None:
            await self._dispatcher.aclose()
        await asyncio.to_thread(self.server.stop)
        await self.service.stop()
