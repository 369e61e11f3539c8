"""The rollout I/O process of a training run: the rollout server child, the controller
service (policy proxy + callback listener) and the dispatcher, on an event loop of their own.
On a Ray cluster it starts no server: it balances over the fleet's servers by their
advertised capacity, follows the fleet as servers join or die, and runs a rollout whose
server died under a fresh id on another one (its lost attempt committed nothing).

The trainer's interpreter keeps only what needs its model: each model call the proxy gets
is handed over the channel (:mod:`osmosis_ai.train.channel`) as its request body, and the
trainer's local policy answers with the finished chat-completions body. Everything else a
rollout costs in Python (HTTP both ways, JSON, result polls or callbacks, token records)
runs here, beside the trainer instead of inside its GIL. Started by
:class:`~osmosis_ai.train.bridge.RolloutBridge` as ``python -m osmosis_ai.train.rollout_io``;
it ends when the trainer says ``close`` or its end of the channel closes (a trainer killed
with -9), stopping the rollout server either way.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import os
import signal
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Sequence
from typing import Any

from osmosis_ai.controller.asgi import refused
from osmosis_ai.controller.balance import LEFT_FLEET, BalancedDispatcher, ServerSlot
from osmosis_ai.controller.dispatch import Dispatcher, DispatchOutcome, DispatchRequest
from osmosis_ai.controller.errors import UpstreamRequestError
from osmosis_ai.controller.loop import new_event_loop
from osmosis_ai.controller.policy.upstream import AnsweringUpstream
from osmosis_ai.controller.proxy import PolicyProxy
from osmosis_ai.controller.rollout_process import RolloutServerProcess
from osmosis_ai.controller.service import ControllerService
from osmosis_ai.controller.upstream import Preflight, Upstream
from osmosis_ai.controller.upstreams import OpenAICompatibleUpstream
from osmosis_ai.deadlines import MODEL_CALL, ROLLOUT_IO
from osmosis_ai.errors import OsmosisError
from osmosis_ai.train.channel import FD_ENV, CallError, Channel, ServeSpec, StartSpec, unpack

_NICENESS = 10


class TrainerPolicy(AnsweringUpstream):
    """The trainer's local policy, reached over the channel."""

    def __init__(self, io: RolloutIO, model: str) -> None:
        super().__init__(model=model, target="training-policy")
        self._io = io

    async def answer(self, body: dict[str, Any], *, chunks: bool) -> Any:
        return self._answered(*await self._io.ask(body, chunks))

    async def count_tokens(self, chat: dict[str, Any]) -> int:
        """The prompt tokens of chat request ``chat`` under the policy's chat template."""
        return int(self._answered(*await self._io.ask(chat, False, kind="count")))

    def _answered(self, answer: Any, error: CallError | None) -> Any:
        if error is not None:
            raise refused(
                error.message,
                status=error.status,
                kind=error.kind,
                url=self.target,
                context="the training policy failed the request",
            )
        return answer


class RunSampling:
    """The upstream the proxy serves: the trainer's policy with the run's sampling settings.
    Every request gets the run's ``temperature`` and ``top_p`` (the trainer's
    log-probabilities assume them) and at most ``max_tokens`` new tokens, whatever the agent
    asked for."""

    def __init__(self, inner: Upstream, *, temperature: float, top_p: float, max_tokens: int):
        self.inner = inner
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens

    @property
    def model(self) -> str:
        return self.inner.model

    @property
    def target(self) -> str:
        return self.inner.target

    def impose(self, body: dict[str, Any]) -> dict[str, Any]:
        asked = body.pop("max_completion_tokens", None) or body.get("max_tokens")
        wanted = asked if isinstance(asked, int) and not isinstance(asked, bool) else None
        body["max_tokens"] = min(wanted or self.max_tokens, self.max_tokens)
        body["temperature"] = self.temperature
        body["top_p"] = self.top_p
        return body

    async def complete(self, body: dict[str, Any]) -> bytes:
        return await self.inner.complete(self.impose(body))

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        async for payload in self.inner.stream(self.impose(body)):
            yield payload

    async def count_tokens(self, chat: dict[str, Any]) -> int | None:
        """The inner upstream's count, where it can count (``None``: it cannot)."""
        counter = getattr(self.inner, "count_tokens", None)
        return None if counter is None else await counter(chat)

    async def preflight(self) -> Preflight:
        return await self.inner.preflight()

    async def aclose(self) -> None:
        await self.inner.aclose()


class RolloutIO:
    """Serves the trainer's messages until ``close`` or the end of the channel."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._ids = itertools.count()
        self._calls: dict[int, asyncio.Future[tuple[Any, CallError | None]]] = {}
        self._batches: dict[int, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._done = asyncio.Event()
        self._served: RunSampling | None = None
        self._spec: StartSpec | None = None
        self._proxy: PolicyProxy | None = None
        self._service: ControllerService | None = None
        self._server: RolloutServerProcess | None = None
        self._dispatcher: Dispatcher | BalancedDispatcher | None = None
        self._fleet: BalancedDispatcher | None = None
        self._finished: list[str] = []
        self._outbox: list[tuple[Any, ...]] = []
        self._callers: int | None = None
        self._in_flight: dict[int, int] = {}  # rollouts still running, by batch
        self._pruning: threading.Thread | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        loop.add_reader(self.channel.fileno(), self._readable)
        beat = asyncio.ensure_future(self._beat(ROLLOUT_IO.seconds() / 4))
        try:
            await self._done.wait()
        finally:
            beat.cancel()
            loop.remove_reader(self.channel.fileno())
            await self._close()

    async def _beat(self, every: float) -> None:
        """Say something at least every ``every`` seconds: the trainer takes a silence of
        four times that for a stopped or hung process (:class:`RolloutIOStalledError`)."""
        self._send("beat")
        while True:
            await asyncio.sleep(every)
            self._send("beat")

    # -- messages --------------------------------------------------------------------------

    def _readable(self) -> None:
        try:
            received = self.channel.drain()
        except (EOFError, OSError):  # the trainer is gone: wind down
            self._done.set()
            return
        for message in received:
            for one in unpack(message):
                self._handle(one)

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "answer":
            _, call, answer, error = message
            future = self._calls.pop(call, None)
            if future is not None and not future.done():
                future.set_result((answer, error))
        elif kind == "launch":
            _, batch, requests = message
            self._batches[batch] = self._spawn(self._run_batch(batch, requests))
        elif kind == "abandon":
            self._spawn(self._abandon(message[1]))
        elif kind == "serve":
            self._serve(message[1])
        elif kind == "servers":
            self._spawn(self._follow_fleet(message[1]))
        elif kind == "start":
            self._prepare(message[1])  # (at once: a "serve" may follow in the same burst)
            self._spawn(self._start())
        elif kind == "close":
            self._done.set()

    def _spawn(self, coroutine: Any) -> asyncio.Task[None]:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _send(self, *message: Any) -> None:
        """Queue a message: what this turn of the loop queues goes as one burst."""
        self._outbox.append(message)
        if len(self._outbox) == 1 and self._callers is None:
            asyncio.get_running_loop().call_soon(self._flush)

    def _set_callers(self, count: int) -> None:
        """How many rollouts are in flight; only the latest count of a turn is sent."""
        if not self._outbox and self._callers is None:
            asyncio.get_running_loop().call_soon(self._flush)
        self._callers = count

    def _flush(self) -> None:
        messages, self._outbox = self._outbox, []
        if self._callers is not None:
            messages.append(("callers", self._callers))
            self._callers = None
        try:
            if len(messages) == 1:
                self.channel.send(*messages[0])
            elif messages:
                self.channel.send("many", messages)
        except OSError:
            self._done.set()

    async def ask(
        self, body: dict[str, Any], chunks: bool, *, kind: str = "chat"
    ) -> tuple[Any, CallError | None]:
        """Have the trainer's policy answer ``body`` (``kind`` ``count``: count its prompt's
        tokens); ``(answer, None)`` or ``(None, why)``."""
        call = next(self._ids)
        future: asyncio.Future[tuple[Any, CallError | None]] = (
            asyncio.get_running_loop().create_future()
        )
        self._calls[call] = future
        try:
            self._send(kind, call, body, chunks)
            return await future
        finally:
            self._calls.pop(call, None)

    # -- start, serve, batches -------------------------------------------------------------

    def _serve(self, spec: ServeSpec) -> None:
        start = self._spec
        assert start is not None, "serve before start"
        inner: Upstream
        if spec.base_url is None:
            inner = TrainerPolicy(self, spec.model)
        else:
            inner = OpenAICompatibleUpstream(
                spec.base_url, spec.api_key, spec.model, timeout=MODEL_CALL.seconds()
            )
        served = RunSampling(
            inner,
            temperature=start.temperature,
            top_p=start.top_p,
            max_tokens=start.max_tokens,
        )
        previous, self._served = self._served, served
        assert self._proxy is not None
        self._proxy.upstream = served
        if previous is not None:
            self._spawn(previous.aclose())

    def _prepare(self, spec: StartSpec) -> None:
        self._spec = spec
        self._proxy = PolicyProxy(_NotServing(), token=spec.proxy_token, request_token_data=True)
        self._service = ControllerService(
            self._proxy, controller_token=spec.controller_token, host=spec.host
        )
        if spec.servers:
            return
        self._server = RolloutServerProcess(
            rollout_dir=spec.rollout_dir,
            entrypoint=spec.entrypoint,
            artifact_root=spec.artifact_root,
            env=spec.env,
            port=spec.port,
            on_output=_echo,
        )

    async def _start(self) -> None:
        if self._spec is not None and self._spec.servers:
            await self._start_fleet(self._spec.servers)
            return
        service, server = self._service, self._server
        assert service is not None and server is not None
        try:
            await service.start()
            await asyncio.to_thread(server.command)  # decides: this interpreter or uv
            if server.isolated:
                await asyncio.to_thread(server.sync)
            starting = asyncio.ensure_future(asyncio.to_thread(server.start))
            seen: int | None = None
            while not starting.done():  # report the child as soon as it exists
                process = server.process
                if process is not None and process.pid != seen:
                    seen = process.pid
                    self._send("spawned", process.pid, server.port, server.instance_id)
                await asyncio.wait({starting}, timeout=0.02)
            await starting
            assert server.process is not None
            self._send("spawned", server.process.pid, server.port, server.instance_id)
            self._dispatcher = Dispatcher(server.url, service)
            await self._dispatcher.detect_generation()
        except Exception as exc:  # our own errors travel whole, to be raised as they are
            self._send("fatal", _describe(exc), exc if isinstance(exc, OsmosisError) else None)
            return
        # What start-up built lives as long as the process: keep it out of full collections
        # (each one would stall every rollout in flight).
        gc.collect()
        gc.freeze()
        self._send("started", self._dispatcher.generation, server.port)

    async def _start_fleet(self, urls: Sequence[str]) -> None:
        service = self._service
        assert service is not None
        fleet = BalancedDispatcher(service, on_dead=self._slot_died)
        self._fleet = self._dispatcher = fleet
        try:
            await service.start()
            first = await fleet.slot_for(urls[0])
            fleet.pin(await first.dispatcher.detect_generation())
            self._send("fleet", "joined", first.name, f"capacity {first.capacity}")
            await self._follow_fleet(urls)
        except Exception as exc:
            self._send("fatal", _describe(exc), exc if isinstance(exc, OsmosisError) else None)
            return
        gc.collect()
        gc.freeze()
        self._send("started", fleet.generation, None)

    async def _follow_fleet(self, urls: Sequence[str]) -> None:
        """Balance over exactly ``urls`` from now on (:meth:`BalancedDispatcher.follow`)."""
        if self._fleet is None:
            return
        joined, unreachable = await self._fleet.follow(urls)
        for url, exc in unreachable:  # not reachable from here (yet): the next list retries
            self._send("fleet", "unreachable", url, _describe(exc))
        for slot in joined:
            self._send("fleet", "joined", slot.name, f"capacity {slot.capacity}")

    def _slot_died(self, slot: ServerSlot) -> None:
        event = "left" if slot.death == LEFT_FLEET else "died"
        self._send("fleet", event, slot.name, slot.death)

    async def _run_batch(self, batch: int, requests: Sequence[DispatchRequest]) -> None:
        """Each outcome goes to the trainer as soon as it is known (it unpickles them while
        the rest finish), then ``done``."""
        try:
            outcomes = await self._outcomes(batch, requests)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._send("failed", batch, _describe(exc))
            return
        finally:
            self._batches.pop(batch, None)
        self._send("done", batch)
        # <artifact_root>/<rollout id>/artifacts/ exists when the rollout asked for it: drop
        # the empty ones a batch late (so late trajectory files land first), in the
        # background while the next batch is prepared.
        previous, self._finished = self._finished, [o.rollout_id for o in outcomes]
        if previous:
            self._pruning = threading.Thread(
                target=self._prune, args=(previous,), name="osmosis-prune", daemon=True
            )
            self._pruning.start()

    async def _outcomes(
        self, batch: int, requests: Sequence[DispatchRequest]
    ) -> list[DispatchOutcome]:
        server, dispatcher = self._server, self._dispatcher
        if dispatcher is None:
            raise RuntimeError("the rollout I/O process is not started")
        if server is not None and not server.alive():
            code = server.process.returncode if server.process else None
            raise RuntimeError(
                f"the rollout server exited (code {code}); its last output:\n{server.output_tail()}"
            )
        self._join_pruning()  # never rmdir beside the server's mkdirs: both slow down
        in_flight = self._in_flight

        async def run_one(index: int, request: DispatchRequest) -> DispatchOutcome:
            try:
                outcome = await dispatcher.run(request)
                # its server died before a result was committed: again, elsewhere, new id
                while outcome.lost_in_transit and self._fleet is not None and self._fleet.live():
                    outcome = await dispatcher.run(request)
            finally:
                if not request.upstream_fields:
                    in_flight[batch] -= 1
                    self._set_callers(sum(in_flight.values()))
            self._send("outcome", batch, index, outcome)
            return outcome

        # The policy batches best when it knows how many rollouts may still ask it (those
        # of every batch running: the next steps' ones run beside a step's own when training
        # is asynchronous); a rollout routed elsewhere (a pinned policy) does not ask it.
        in_flight[batch] = sum(1 for request in requests if not request.upstream_fields)
        self._set_callers(sum(in_flight.values()))
        try:
            return list(await asyncio.gather(*(run_one(i, r) for i, r in enumerate(requests))))
        finally:
            del in_flight[batch]
            self._set_callers(sum(in_flight.values()))

    async def _abandon(self, batch: int) -> None:
        task = self._batches.pop(batch, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._send("abandoned", batch)

    def _prune(self, rollout_ids: Sequence[str]) -> None:
        if self._spec is None:
            return
        root = self._spec.artifact_root
        for rollout_id in rollout_ids:
            for folder in (root / rollout_id / "artifacts", root / rollout_id):
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def _join_pruning(self) -> None:
        if self._pruning is not None:
            self._pruning.join()
            self._pruning = None

    async def _close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for future in self._calls.values():
            if not future.done():
                future.set_result((None, CallError(503, "the run is stopping", "server_error")))
        if self._dispatcher is not None:
            with contextlib.suppress(Exception):
                await self._dispatcher.aclose()
        if self._server is not None:
            await asyncio.to_thread(self._server.stop)
        if self._served is not None:
            with contextlib.suppress(Exception):
                await self._served.aclose()
        if self._service is not None:
            await self._service.stop()
        self._join_pruning()
        self._prune(self._finished)


class _NotServing:
    """The proxy's upstream until the trainer says which policy to serve."""

    model = "osmosis-policy"
    target = "training-policy"

    async def complete(self, body: dict[str, Any]) -> bytes:
        raise self._error()

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        raise self._error()
        yield b""  # (an async generator)

    async def preflight(self) -> Preflight:
        raise self._error()

    async def aclose(self) -> None:
        return None

    def _error(self) -> UpstreamRequestError:
        message = "the training policy is not being served yet"
        return refused(message, status=503, kind="server_error", url=self.target)


def _echo(line: str) -> None:
    """The rollout server's output, onto our stderr: the trainer logs it."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(line + "\n")


def _describe(exc: BaseException) -> str:
    message = str(exc) or type(exc).__name__
    if isinstance(exc, (RuntimeError, OSError)) or type(exc).__module__.startswith("osmosis_ai"):
        return message
    return f"{type(exc).__name__}: {message}\n{''.join(traceback.format_exception(exc))}"


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the trainer decides when to stop
    # A SIGTERM to the trainer's process group (a platform worker stopping the run) too: the
    # trainer finishes its step with this process, saves, then closes it. A handler, not
    # SIG_IGN, so the rollout server started from here gets the default action back.
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    # Below the trainer (the rollout server inherits it): when both want the CPU, the
    # trainer's step goes first; the rollouts dispatched during it have until it ends.
    os.nice(_NICENESS)
    channel = Channel.from_fd(int(os.environ.pop(FD_ENV)))  # (not the rollout server's)
    loop = new_event_loop()
    try:
        loop.run_until_complete(RolloutIO(channel).run())
    finally:
        loop.close()
        channel.close()


if __name__ == "__main__":
    main()
