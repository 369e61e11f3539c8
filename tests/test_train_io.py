"""The trainer's rollout I/O process and the channel to it, without a model: message framing,
the protocol path through a real rollout server, start-up failures, and a trainer that
disappears without a word (kill -9)."""

from __future__ import annotations

import os
import socket
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from osmosis_ai.controller.dispatch import DispatchRequest
from osmosis_ai.controller.errors import UpstreamError
from osmosis_ai.controller.rollout_process import RolloutServerError
from osmosis_ai.errors import MissingExtraError
from osmosis_ai.train.bridge import RolloutBridge, TrainingUpstream
from osmosis_ai.train.channel import Channel, unpack
from osmosis_ai.train.errors import TrainingError

NO_MODEL_ROLLOUT = '''
"""Answers 42 without calling a model (after metadata["sleep"] seconds); the grader
rewards metadata["reward"]."""
import asyncio

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server


class Echo(AgentWorkflow):
    async def run(self, ctx):
        await asyncio.sleep(float((ctx.metadata or {}).get("sleep", 0)))
        answer = {"role": "assistant", "content": "42"}
        return AgentWorkflowOutput(messages=[*ctx.prompt, answer])


class FromMetadata(Grader):
    async def grade(self, ctx):
        ctx.set_reward(float((ctx.metadata or {})["reward"]))


app = create_rollout_server(
    backend=LocalBackend(workflow=Echo, grader=FromMetadata), configure_logging=False,
    save_trajectories=False,
)

if __name__ == "__main__":
    print("echo server starting", flush=True)
    run_rollout_server(app, log_level="warning")
'''


def test_our_errors_cross_the_channel_whole():
    # what the I/O process sends when start-up fails: constructors with their own arguments
    ours, theirs = Channel.pair()
    other = Channel(theirs)
    missing = MissingExtraError("server", "the rollout server", "fastapi")
    upstream = UpstreamError("no answer", url="http://127.0.0.1:9/v1", status_code=502)
    ours.send("fatal", "start-up failed", missing)
    ours.send("fatal", "start-up failed", upstream)
    (_, _, got_missing), (_, _, got_upstream) = other.recv(), other.recv()
    assert type(got_missing) is MissingExtraError and str(got_missing) == str(missing)
    assert (got_missing.extra, got_missing.missing) == ("server", "fastapi")
    assert type(got_upstream) is UpstreamError and str(got_upstream) == "no answer"
    assert (got_upstream.url, got_upstream.status_code) == ("http://127.0.0.1:9/v1", 502)
    ours.close()
    other.close()


def test_messages_keep_their_order_size_and_bursts():
    ours, theirs = Channel.pair()
    other = Channel(theirs)
    big = os.urandom(3 << 20)  # several reads' worth
    ours.send("chat", 1, {"messages": []}, False)
    ours.send("many", [("answer", 1, {"id": "x"}, None), ("callers", 3)])
    blob = threading.Thread(target=ours.send, args=("blob", big))  # more than a socket holds
    blob.start()
    received = [other.recv() for _ in range(3)]
    blob.join()
    assert received[0] == ("chat", 1, {"messages": []}, False)
    assert unpack(received[1]) == [("answer", 1, {"id": "x"}, None), ("callers", 3)]
    assert unpack(received[0]) == [received[0]]
    assert received[2] == ("blob", big)
    assert other.drain() == []  # nothing waiting: returns at once
    sender = threading.Thread(target=lambda: [ours.send("n", i) for i in range(200)])
    sender.start()
    got: list[tuple[object, ...]] = []
    deadline = time.monotonic() + 10
    while len(got) < 200 and time.monotonic() < deadline:
        got += other.drain()
    sender.join()
    assert got == [("n", i) for i in range(200)]
    ours.close()
    with pytest.raises(EOFError):
        other.recv()
    other.close()


class Watched(Channel):
    """A channel that says when it had to wait for its socket."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        self.waited = threading.Event()

    def _wait(self, event: int) -> None:
        self.waited.set()
        super()._wait(event)


def test_whole_messages_over_sockets_an_event_loop_made_non_blocking():
    # uvloop's add_reader leaves the I/O process's end non-blocking: a message bigger than the
    # socket holds must wait for room (and a read for the rest), not fail halfway through.
    ours, theirs = Channel.pair()
    other = Watched(theirs)
    for end in (ours, other):
        os.set_blocking(end.fileno(), False)
    big = os.urandom(3 << 20)
    failures: list[BaseException] = []

    def send() -> None:
        try:
            other.send("blob", big)
        except BaseException as exc:
            failures.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    # Read only once the sender is stuck on a full socket (or has failed).
    while sender.is_alive() and not other.waited.wait(0.01):
        pass
    assert not failures, failures
    assert ours.recv() == ("blob", big)
    sender.join()
    ours.close()
    other.close()


def stopped(pid: int, timeout: float = 10.0) -> bool:
    """Whether ``pid`` ends within ``timeout`` (a zombie has ended: it only awaits reaping
    by the process that adopted it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def rollout_dir(root: Path, source: str) -> Path:
    folder = root / "rollouts" / "echo"
    folder.mkdir(parents=True)
    (folder / "main.py").write_text(textwrap.dedent(source))
    return folder


def bridge_for(
    root: Path, folder: Path, lines: list[str] | None = None, spawned: list[int] | None = None
) -> RolloutBridge:
    return RolloutBridge(
        rollout_dir=folder,
        entrypoint=folder / "main.py",
        artifact_root=root / "artifacts",
        upstream=TrainingUpstream(temperature=1.0, top_p=1.0, max_tokens=8),
        on_output=None if lines is None else lines.append,
        on_spawn=None if spawned is None else (lambda pid, port, instance: spawned.append(pid)),
    )


def request(reward: float) -> DispatchRequest:
    return DispatchRequest(
        initial_messages=[{"role": "user", "content": "echo"}],
        label="42",
        metadata={"reward": reward},
        agent_timeout_sec=30,
        grader_timeout_sec=30,
    )


def test_rollouts_run_through_the_io_process_and_come_back_in_order(tmp_path: Path):
    lines: list[str] = []
    spawned: list[int] = []
    folder = rollout_dir(tmp_path, NO_MODEL_ROLLOUT)
    bridge = bridge_for(tmp_path, folder, lines, spawned).start()
    try:
        assert bridge.generation == "polling" and bridge.port is not None
        assert bridge.server_pid in spawned  # as soon as it exists, and once healthy
        # the rollout side yields the CPU to the trainer when both want it
        io_nice = psutil.Process(bridge._process.pid).nice()  # type: ignore[union-attr]  # pyright: ignore[reportPrivateUsage]
        assert io_nice == min(os.nice(0) + 10, 19)
        assert psutil.Process(bridge.server_pid).nice() == io_nice
        outcomes = bridge.run([request(r) for r in (0.0, 0.5, 1.0, 0.25)])
        assert [o.sample.reward if o.sample else None for o in outcomes] == [0.0, 0.5, 1.0, 0.25]
        assert all(
            o.kind == "result" and o.sample.messages[-1]["content"] == "42" for o in outcomes
        )  # type: ignore[union-attr]
        # a launched batch nobody collects is cancelled; the next one still runs
        bridge.abandon(bridge.launch([request(1.0)] * 3))
        assert [o.sample.reward for o in bridge.run([request(0.75)])] == [0.75]  # type: ignore[union-attr]
        assert "echo server starting" in lines  # the server's output reaches the run's log
    finally:
        bridge.close()
    assert not bridge.alive() and not psutil.pid_exists(bridge.server_pid or 0)


def test_a_rollout_server_that_cannot_start_raises_its_own_error(tmp_path: Path):
    broken = rollout_dir(tmp_path, 'raise SystemExit("no GPU here, says the rollout")\n')
    bridge = bridge_for(tmp_path, broken)
    with pytest.raises(RolloutServerError, match="no GPU here, says the rollout"):
        bridge.start()
    assert not bridge.alive()


def test_a_vanished_trainer_takes_the_rollout_server_down_with_it(tmp_path: Path):
    bridge = bridge_for(tmp_path, rollout_dir(tmp_path, NO_MODEL_ROLLOUT)).start()
    io_pid, server_pid = bridge._process.pid, bridge.server_pid  # type: ignore[union-attr]  # pyright: ignore[reportPrivateUsage]
    assert server_pid is not None and psutil.pid_exists(server_pid)
    try:
        bridge._channel.close()  # pyright: ignore[reportOptionalMemberAccess, reportPrivateUsage]  # as a kill -9 would
        gone, _alive = psutil.wait_procs([psutil.Process(io_pid)], timeout=20)
        assert gone, "the I/O process outlived its trainer"
        assert stopped(server_pid)
    finally:
        bridge.close()


def test_an_openai_compatible_policy_is_served_with_the_runs_sampling(tmp_path: Path):
    from osmosis_ai.testing.model_server import ScriptedModelServer
    from osmosis_ai.workspace.templates import templates_root

    folder = tmp_path / "rollouts" / "copy-digit"
    source = templates_root() / "copy-digit" / "rollouts" / "copy-digit" / "main.py"
    folder.mkdir(parents=True)
    (folder / "main.py").write_text(source.read_text())
    upstream = TrainingUpstream(temperature=0.7, top_p=0.9, max_tokens=3)
    bridge = RolloutBridge(
        rollout_dir=folder,
        entrypoint=folder / "main.py",
        artifact_root=tmp_path / "artifacts",
        upstream=upstream,
    )
    with ScriptedModelServer(["7"], record_requests=True) as model:
        # what the vLLM tier does: the proxy serves a server that TRL keeps in sync
        upstream.serve_openai(model.base_url, "trained-model", lambda: 5)
        bridge.start()
        try:
            rows = [
                DispatchRequest(
                    initial_messages=[{"role": "user", "content": f"Copy: {label}"}],
                    label=label,
                    agent_timeout_sec=30,
                    grader_timeout_sec=30,
                )
                for label in ("7", "3")
            ]
            outcomes = bridge.run(rows)
        finally:
            bridge.close()
    assert [o.sample.reward for o in outcomes] == [1.0, 0.0]  # type: ignore[union-attr]
    assert upstream.policy_version == 5 and upstream.batches is None
    assert not upstream.hold(True)  # only the local policy can hold its calls
    assert len(model.requests) == 2
    for recorded, outcome in zip(model.requests, outcomes, strict=True):
        body = recorded.body
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (0.7, 0.9, 3)
        assert body["model"] == "trained-model" and body["logprobs"] is True
        assert [c.status_code for c in outcome.calls] == [200]


def test_a_dead_io_process_fails_the_wait_with_what_it_said(tmp_path: Path):
    bridge = bridge_for(tmp_path, rollout_dir(tmp_path, NO_MODEL_ROLLOUT)).start()
    try:
        slow = DispatchRequest(
            initial_messages=[{"role": "user", "content": "echo"}],
            label="42",
            metadata={"reward": 1.0, "sleep": 30},
            agent_timeout_sec=60,
            grader_timeout_sec=30,
        )
        batch = bridge.launch([slow] * 4)
        psutil.Process(bridge._process.pid).kill()  # type: ignore[union-attr]  # pyright: ignore[reportPrivateUsage]
        with pytest.raises(TrainingError, match=r"rollout I/O process exited \(code -9\)"):
            bridge.finish(batch)
        with pytest.raises(TrainingError, match="exited"):  # and every later call, at once
            bridge.run([slow])
        server = bridge.server_pid
        assert server is not None and psutil.pid_exists(server)
    finally:
        bridge.close()
    # the server it could not stop is stopped by the trainer (it is still ours: /health says so)
    assert stopped(server)


def test_a_fleet_bridge_balances_follows_and_reruns_what_a_dead_server_held(tmp_path: Path):
    from osmosis_ai.controller.rollout_process import RolloutServerProcess

    folder = rollout_dir(tmp_path, NO_MODEL_ROLLOUT)

    def server() -> RolloutServerProcess:
        return RolloutServerProcess(
            rollout_dir=folder, entrypoint=folder / "main.py", artifact_root=tmp_path / "a"
        ).start()

    servers = [server(), server()]
    events: list[tuple[str, str]] = []
    bridge = RolloutBridge(
        rollout_dir=folder,
        entrypoint=folder / "main.py",
        artifact_root=tmp_path / "artifacts",
        upstream=TrainingUpstream(temperature=1.0, top_p=1.0, max_tokens=8),
        servers=[s.url for s in servers],
        on_fleet=lambda event, url, detail: events.append((event, url)),
    ).start()
    try:
        assert bridge.generation == "polling" and bridge.port is None
        assert bridge.server_pid is None  # it started no server of its own
        joined = {url for event, url in events if event == "joined"}
        assert joined == {s.url for s in servers}
        # both servers busy for a second each; one dies under its rollouts
        slow = [
            replace(request(r / 10), metadata={"reward": r / 10, "sleep": 1.0}) for r in range(8)
        ]
        batch = bridge.launch(slow)
        time.sleep(0.4)
        assert servers[0].process is not None
        servers[0].process.kill()
        outcomes = bridge.finish(batch)
        # every rollout has its own result once: the dead server's ran again on the other
        assert [o.sample.reward if o.sample else None for o in outcomes] == [
            r / 10 for r in range(8)
        ]
        assert len({o.rollout_id for o in outcomes}) == 8
        assert ("died", servers[0].url) in events
        # the fleet changes between batches: a third server joins, the second leaves
        servers.append(server())
        bridge.follow([servers[2].url])
        assert [o.sample.reward for o in bridge.run([request(0.5)] * 4)] == [0.5] * 4  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while ("left", servers[1].url) not in events and time.monotonic() < deadline:
            time.sleep(0.05)  # (the change is applied beside the batch, not before it)
        assert ("joined", servers[2].url) in events and ("left", servers[1].url) in events
    finally:
        bridge.close()
        for one in servers:
            one.stop()
