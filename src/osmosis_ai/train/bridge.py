"""The rollout side of a training run, seen from the trainer: a rollout I/O process
(:mod:`osmosis_ai.train.rollout_io`) that runs the rollout server child, the controller
service (policy proxy + callback listener) and the dispatcher, and a channel to it.

The trainer is synchronous; :meth:`RolloutBridge.run` hands a batch of rollouts over and
blocks until every one has an outcome. The model calls of those rollouts come back over the
channel and the trainer's own model answers them (:meth:`LocalPolicy.submit_chat`), so the
trainer's interpreter spends on a rollout only the generation and the answer's body; the
HTTP, JSON and protocol work runs in the I/O process, on another core.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis_ai.controller.dispatch import DispatchOutcome, DispatchRequest
from osmosis_ai.controller.policy.upstream import failure_answer
from osmosis_ai.controller.rollout_process import OutputTail, stop_if_ours
from osmosis_ai.deadlines import ROLLOUT_IO
from osmosis_ai.errors import DeadlineError, UsageError
from osmosis_ai.train.channel import FD_ENV, CallError, Channel, ServeSpec, StartSpec, unpack
from osmosis_ai.train.errors import TrainingError

if TYPE_CHECKING:
    from osmosis_ai.controller.policy import LocalPolicy

POLICY_MODEL_NAME = "osmosis-policy"
# The model request field (set through DispatchRequest.upstream_fields) that has a pinned
# policy version answer the call instead of the served policy; removed before it answers.
POLICY_PIN_FIELD = "osmosis_policy_pin"
_CLOSE_WAIT_SEC = 30.0
_FIRST_WORD_SEC = 30.0  # an I/O process may take this long to import before it first speaks


class RolloutIOStalledError(TrainingError, DeadlineError):
    """The trainer heard nothing from its rollout I/O process (which speaks at least every
    quarter of the deadline while it lives) within ``OSMOSIS_ROLLOUT_IO_STALL_S``: it is
    stopped or hung, and the step cannot finish."""


class TrainingUpstream:
    """What the run's proxy serves: the trainer's local policy (sharing the trainer's
    model) or an OpenAI-compatible server TRL keeps in sync (vLLM), and the run's sampling
    settings, which the I/O process imposes on every request: ``temperature`` and ``top_p``
    (the trainer's log-probabilities assume them) and at most ``max_tokens`` new tokens,
    whatever the agent asked for. Beside the served policy it keeps pinned local policies
    by version (:meth:`pin`): a rollout whose requests carry :data:`POLICY_PIN_FIELD` is
    answered by that one."""

    def __init__(self, *, temperature: float, top_p: float, max_tokens: int) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.max_tokens = max_tokens
        self.spec: ServeSpec | None = None
        self.local: LocalPolicy | None = None
        self._version: Callable[[], int] = lambda: 0
        self._pinned: dict[int, LocalPolicy] = {}

    def serve_local(self, policy: LocalPolicy) -> None:
        """Serve the local policy under our model name from now on."""
        self.local = policy
        self.spec = ServeSpec(POLICY_MODEL_NAME)
        self._version = lambda: policy.version

    def serve_openai(
        self, base_url: str, model: str, version: Callable[[], int], api_key: str | None = None
    ) -> None:
        """Serve the OpenAI-compatible server at ``base_url`` (``…/v1``) from now on;
        ``version()`` is the policy version it generates."""
        self.local = None
        self.spec = ServeSpec(model, base_url.rstrip("/"), api_key)
        self._version = version

    @property
    def policy_version(self) -> int:
        return self._version()

    def pin(self, policy: LocalPolicy) -> dict[str, int]:
        """Keep ``policy`` (a frozen copy) answering for its version until :meth:`unpin`;
        returns the upstream fields that route a rollout's calls to it."""
        self._pinned[policy.version] = policy
        return {POLICY_PIN_FIELD: policy.version}

    def unpin(self, version: int) -> None:
        """Forget the policy pinned at ``version`` (idempotent)."""
        self._pinned.pop(version, None)

    def policy_for(self, body: dict[str, Any]) -> LocalPolicy:
        """The local policy that answers ``body``: the one pinned at the version its
        :data:`POLICY_PIN_FIELD` names (the field is removed), else the served one."""
        pin = body.pop(POLICY_PIN_FIELD, None)
        if pin is not None:
            exact = isinstance(pin, int) and not isinstance(pin, bool)
            policy = self._pinned.get(pin) if exact else None
            if policy is None:
                pinned = ", ".join(map(str, sorted(self._pinned))) or "none"
                raise UsageError(
                    f"{POLICY_PIN_FIELD}={pin!r}: no policy is pinned at that version "
                    f"(pinned: {pinned}); a rollout may only ask for a version the run pinned"
                )
            return policy
        if self.local is None:
            raise UsageError("no local policy is served to this run")
        return self.local

    @property
    def batches(self) -> int | None:
        """Generation batches the local policy has run so far (``None``: not served locally)."""
        return None if self.local is None else self.local.batches

    def hold(self, held: bool) -> bool:
        """Start no generation while held (requests queue); ``False`` when this upstream
        cannot hold (it is not the local policy)."""
        if self.local is None:
            return False
        self.local.hold(held)
        return True

    def expect_callers(self, count: int) -> None:
        """How many rollouts are in flight: the local policy waits for that many requests
        before it starts a batch (other upstreams batch on their own)."""
        if self.local is not None:
            self.local.expect_callers(count)


@dataclass(frozen=True)
class RolloutBatch:
    """Rollouts :meth:`RolloutBridge.launch` started; their outcomes come from
    :meth:`RolloutBridge.finish`."""

    number: int
    outcomes: Future[list[DispatchOutcome]]


class RolloutBridge:
    """Starts and owns the rollout I/O process (and through it the rollout server and the
    controller service, 127.0.0.1 only); :meth:`run` dispatches rollouts through them from
    the trainer's thread. ``on_spawn(pid, port, instance_id)`` hears of the rollout server
    as soon as it exists and again once healthy (to reap it after a kill -9);
    ``on_output(line)`` gets its output and the I/O process's.

    ``servers`` (URLs): balance over rollout servers already running elsewhere (a fleet on a
    cluster) instead of starting one, with the controller service on ``host``, an address
    they can reach; :meth:`follow` changes the list; ``on_fleet(event, url, detail)`` hears
    of each server that joined, left, died or could not be reached."""

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
        on_spawn: Callable[[int, int | None, str], None] | None = None,
        servers: Sequence[str] = (),
        host: str = "127.0.0.1",
        on_fleet: Callable[[str, str, str], None] | None = None,
    ) -> None:
        self.upstream = upstream
        self.on_output = on_output
        self.on_spawn = on_spawn
        self.on_fleet = on_fleet
        self.servers = tuple(servers)
        self._spec = StartSpec(
            rollout_dir=Path(rollout_dir).resolve(),
            entrypoint=Path(entrypoint).resolve(),
            artifact_root=Path(artifact_root).resolve(),
            env=dict(env or {}),
            port=port,
            proxy_token=secrets.token_urlsafe(32),
            controller_token=secrets.token_urlsafe(32),
            temperature=upstream.temperature,
            top_p=upstream.top_p,
            max_tokens=upstream.max_tokens,
            servers=self.servers,
            host=host,
        )
        self.port: int | None = None
        self.server_pid: int | None = None
        self._instance: str | None = None
        self.generation: str | None = None
        self._channel: Channel | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._threads: list[threading.Thread] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()  # guards the futures and the fatal message
        self._futures: dict[tuple[str, int], Future[Any]] = {}
        self._fatal: str | None = None
        self._error: BaseException | None = None
        self._sent: ServeSpec | None = None
        self._tail = OutputTail()
        self._arrived: dict[int, dict[int, DispatchOutcome]] = {}  # outcomes of running batches
        self._replies: list[tuple[Any, ...]] = []  # answers for the I/O process, not yet sent
        # The I/O process speaks at least every quarter of this while it lives (a beat when
        # it has nothing else to say); a wait that hears nothing for longer ends.
        self.stall_s = ROLLOUT_IO.seconds()
        self._heard: float | None = None  # when the I/O process last sent anything
        self._spawned_at = 0.0

    @property
    def secrets(self) -> tuple[str, ...]:
        """The run's bearer tokens, for the log redactor."""
        return (self._spec.proxy_token, self._spec.controller_token)

    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def io_pid(self) -> int | None:
        """The rollout I/O process's pid, while it is started."""
        return None if self._process is None else self._process.pid

    def output_tail(self, lines: int = 25) -> str:
        return self._tail.text(lines)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> RolloutBridge:
        """Start the I/O process, the controller service and the rollout server; returns
        once the server is healthy and its protocol generation is known."""
        if self._process is not None:
            raise UsageError("the rollout bridge is already started")
        channel, theirs = Channel.pair()
        self._channel = channel
        started: Future[tuple[str, int]] = Future()
        self._futures["started", 0] = started
        try:
            self._spawned_at = time.monotonic()
            with theirs:
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "osmosis_ai.train.rollout_io"],
                    env={**os.environ, FD_ENV: str(theirs.fileno())},
                    pass_fds=(theirs.fileno(),),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                )
            # the log first: the receiver joins it for the I/O process's last words
            self._threads = [
                threading.Thread(target=self._pump, name="osmosis-io-log", daemon=True),
                threading.Thread(target=self._receive, name="osmosis-train-io", daemon=True),
            ]
            for thread in self._threads:
                thread.start()
            channel.send("start", self._spec)
            self.generation, self.port = self._wait(started, "starting the rollout server")
        except BaseException:
            self.close()
            raise
        return self

    def follow(self, servers: Sequence[str]) -> None:
        """Balance over ``servers`` from the next rollouts on (a fleet bridge only)."""
        servers = tuple(servers)
        if not self.servers or servers == self.servers or self._channel is None:
            return
        self.servers = servers
        with contextlib.suppress(OSError):
            self._channel.send("servers", list(servers))

    def run(self, requests: Sequence[DispatchRequest]) -> list[DispatchOutcome]:
        """Dispatch every request at once; one outcome each, in order."""
        return self.finish(self.launch(requests))

    def launch(self, requests: Sequence[DispatchRequest]) -> RolloutBatch:
        """Start dispatching every request at once and return without waiting; collect the
        outcomes with :meth:`finish` (or drop them with :meth:`abandon`)."""
        channel = self._channel
        if channel is None or self.generation is None:
            raise UsageError("the rollout bridge is not started")
        number = next(self._ids)
        outcomes: Future[list[DispatchOutcome]] = self._expect("outcomes", number)
        spec = self.upstream.spec
        try:
            if spec is not None and spec != self._sent:  # a change of policy
                channel.send("serve", spec)
                self._sent = spec
            channel.send("launch", number, list(requests))
        except OSError:
            self._gone()
        return RolloutBatch(number, outcomes)

    def finish(self, batch: RolloutBatch) -> list[DispatchOutcome]:
        """Wait for the outcomes of a :meth:`launch`, in the order of its requests; a
        :class:`RolloutIOStalledError` when the I/O process falls silent for ``stall_s``."""
        return self._wait(batch.outcomes, f"rollout batch {batch.number}")

    def abandon(self, batch: RolloutBatch) -> None:
        """Cancel a :meth:`launch` nobody will collect (its remote rollouts too) and wait
        until it has wound down."""
        if self._channel is None:
            return
        with self._lock:
            self._futures.pop(("outcomes", batch.number), None)
            self._arrived.pop(batch.number, None)
        done: Future[None] = self._expect("abandoned", batch.number)
        try:
            self._channel.send("abandon", batch.number)
            self._wait(done, f"cancelling rollout batch {batch.number}")
        except Exception:  # (OSError, or the I/O process's failure)
            pass  # the I/O process is gone: nothing runs any more

    def close(self) -> None:
        """Cancel what is in flight, stop the server and the service, end the I/O process
        (idempotent; ends only the processes this bridge started)."""
        process, channel = self._process, self._channel
        if channel is None:
            return
        with contextlib.suppress(OSError):
            channel.send("close")
        if process is not None:
            try:
                process.wait(timeout=_CLOSE_WAIT_SEC)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            pid, port, instance = self.server_pid, self.port, self._instance
            if process.returncode != 0 and pid and port and instance:
                stop_if_ours(pid, port, instance)  # it died without stopping its server
        channel.close()
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads = []
        self._gone("the rollout bridge is closed")
        self._process = self._channel = None
        self.generation = None

    # -- the channel -----------------------------------------------------------------------

    def _wait(self, future: Future[Any], doing: str) -> Any:
        """``future``'s result, or :class:`RolloutIOStalledError` once the I/O process has
        been silent for ``stall_s`` (before its first word, for at least 30 s): it is then
        killed, and every other wait on it ends with the same error."""
        while True:
            try:
                return future.result(timeout=min(1.0, self.stall_s / 4))
            except FutureTimeout:
                pass
            heard = self._heard
            allowed = self.stall_s if heard is not None else max(self.stall_s, _FIRST_WORD_SEC)
            since = heard if heard is not None else self._spawned_at
            silent = time.monotonic() - since
            if silent <= allowed:
                continue
            process = self._process
            pid = process.pid if process is not None else None
            error = ROLLOUT_IO.error(
                RolloutIOStalledError,
                f"the rollout I/O process (pid {pid}) sent nothing for {silent:.1f}s while "
                f"{doing}: it is stopped or hung, so it was killed",
                allowed,
            )
            if process is not None:
                with contextlib.suppress(OSError):
                    process.kill()
            self._gone(str(error), error)
            raise error

    def _expect(self, kind: str, number: int) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._fatal is not None:
                failure = self._error or TrainingError(self._fatal)
                future.set_exception(failure)
            else:
                self._futures[kind, number] = future
        return future

    def _resolve(self, key: tuple[str, int], value: Any) -> None:
        with self._lock:
            future = self._futures.pop(key, None)
        if future is None or future.done():
            return
        if isinstance(value, BaseException):
            future.set_exception(value)
        else:
            future.set_result(value)

    def _receive(self) -> None:
        channel = self._channel
        assert channel is not None
        try:
            while True:
                received = channel.recv()
                self._heard = time.monotonic()
                for message in unpack(received):
                    self._handle(message)
        except (EOFError, OSError):
            pass
        except Exception as exc:  # a message it could not read or act on: fail every wait now
            self._gone(f"the rollout I/O channel failed: {exc!r}", exc)
        finally:
            process = self._process
            if process is not None:  # its exit code and last words, for the message
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
                self._threads[0].join(timeout=2)  # the log
            self._gone()

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind in ("chat", "count"):  # the policy answers a model call, or counts tokens
            (self._chat if kind == "chat" else self._count)(message[1], message[2], message[3])
        elif kind == "callers":
            self.upstream.expect_callers(message[1])
        elif kind == "outcome":
            _, number, index, outcome = message
            with self._lock:
                self._arrived.setdefault(number, {})[index] = outcome
        elif kind == "done":
            number = message[1]
            with self._lock:
                arrived = self._arrived.pop(number, {})
            self._resolve(("outcomes", number), [arrived[i] for i in range(len(arrived))])
        elif kind == "failed":
            with self._lock:
                self._arrived.pop(message[1], None)
            self._resolve(("outcomes", message[1]), TrainingError(message[2]))
        elif kind == "abandoned":
            with self._lock:  # (outcomes that arrived before the batch was cancelled)
                self._arrived.pop(message[1], None)
            self._resolve(("abandoned", message[1]), None)
        elif kind == "spawned":
            _, pid, port, instance = message
            self.server_pid, self.port, self._instance = pid, port, instance
            if self.on_spawn is not None:
                self.on_spawn(pid, port, instance)
        elif kind == "fleet":
            if self.on_fleet is not None:
                self.on_fleet(message[1], message[2], message[3])
        elif kind == "started":
            self._resolve(("started", 0), (message[1], message[2]))
        elif kind == "fatal":
            self._gone(message[1], message[2])

    def _chat(self, call: int, body: dict[str, Any], chunks: bool) -> None:
        def reply(answer: Any, error: BaseException | None) -> None:
            failure = None if error is None else CallError(*failure_answer(error))
            with self._lock:
                self._replies.append(("answer", call, answer, failure))

        try:
            policy = self.upstream.policy_for(body)
            policy.submit_chat(body, reply, chunks=chunks, flush=self._send_replies)
        except Exception as exc:
            reply(None, exc)
            # Not from this thread: the I/O process may be sending to us at this moment.
            threading.Thread(target=self._send_replies, daemon=True).start()

    def _count(self, call: int, chat: dict[str, Any], chunks: bool) -> None:
        """Answer with the prompt tokens of ``chat`` under the local policy's chat template
        (Messages token counting); rendered on this thread, as chat prompts are."""
        del chunks  # (a count is one answer)
        count: int | None = None
        failure: CallError | None = None
        try:
            policy = self.upstream.policy_for(chat)
            extra = chat.get("chat_template_kwargs")
            kwargs: dict[str, Any] = dict(extra) if isinstance(extra, dict) else {}
            count = len(policy.encode(policy.render(chat["messages"], chat.get("tools"), **kwargs)))
        except Exception as exc:
            failure = CallError(*failure_answer(exc))
        with self._lock:
            self._replies.append(("answer", call, count, failure))
        # Not from this thread: the I/O process may be sending to us at this moment.
        threading.Thread(target=self._send_replies, daemon=True).start()

    def _send_replies(self) -> None:
        """Send the answers made so far, in one burst (called once per generation batch)."""
        channel = self._channel
        with self._lock:
            replies, self._replies = self._replies, []
        if channel is not None and replies:
            with contextlib.suppress(OSError):
                channel.send("many", replies)

    def _pump(self) -> None:
        process = self._process
        assert process is not None and process.stderr is not None
        self._tail.pump(process.stderr, self.on_output)

    def _gone(self, reason: str | None = None, error: BaseException | None = None) -> None:
        """The I/O process failed or ended: every wait ends with ``error`` (the I/O
        process's own, such as a rollout server that would not start), or a
        :class:`TrainingError` with the reason."""
        with self._lock:
            if self._fatal is None:
                code = self._process.poll() if self._process is not None else None
                self._fatal = reason or (
                    f"the rollout I/O process exited (code {code}); its last output:\n"
                    f"{self.output_tail()}"
                )
                self._error = error
            pending, self._futures = list(self._futures.values()), {}
            fatal, error = self._fatal, self._error
        for future in pending:
            if not future.done():
                future.set_exception(error if error is not None else TrainingError(fatal))
