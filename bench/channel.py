"""The trainer <-> rollout I/O process wire: ours (:mod:`osmosis_ai.train.channel`, framed
pickles over a Unix socket pair) against ``multiprocessing.connection`` on the same messages,
in one run.

The messages are the real ones: a short ``osmosis train run`` of the copy-digit template on
the tiny model (64 rollouts a step, the trainer's local policy answering every model call over
the channel) is run in a child process with both ends of its channel recorded. Each transport
then carries that trace between two processes in three ways:

* ``replay``: the trace in its recorded order, each side sending its own messages and
  waiting for the other's, the I/O side reading as the I/O process does (on readiness, all
  that has arrived), the trainer side with a blocking read;
* ``trainer->io`` and ``io->trainer``: one side sends all of its messages at once, the other
  reads them (throughput of one direction).

Rounds alternate the transports; the figures are medians, printed beside the
``multiprocessing.connection`` baseline with the ratio ours / baseline (below 1: ours is
faster). Last, each transport replays the trace with the I/O side's end non-blocking, as it is
in the I/O process (uvloop's ``add_reader`` makes the fd it watches non-blocking), and the
rounds that failed are counted. ``python bench/channel.py [--rounds 7] [--steps 3] [--trace FILE]``
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.connection
import os
import pickle
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

Trace = list[tuple[str, tuple[Any, ...]]]  # ("out": trainer -> I/O, "in": I/O -> trainer)
TO_IO, TO_TRAINER = "out", "in"


# -- recording a real run ---------------------------------------------------------------------


def capture(path: Path, steps: int) -> None:
    """Run ``steps`` GRPO steps of the copy-digit demo and pickle the channel's traffic."""
    from osmosis_ai.train.channel import Channel
    from osmosis_ai.train.demo import setup_workspace
    from osmosis_ai.train.plan import TrainRunOptions
    from osmosis_ai.train.runner import run_training
    from osmosis_ai.train.tiny_model import build_tiny_model

    trace: Trace = []
    lock = threading.Lock()
    send, recv = Channel.send, Channel.recv

    def recording_send(self: Channel, *message: Any) -> None:
        with lock:
            trace.append((TO_IO, message))
        send(self, *message)

    def recording_recv(self: Channel) -> tuple[Any, ...]:
        message = recv(self)
        with lock:
            trace.append((TO_TRAINER, message))
        return message

    Channel.send = recording_send  # type: ignore[method-assign]
    Channel.recv = recording_recv  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        setup_workspace(root)
        build_tiny_model(root / "models" / "tiny")
        config = root / "configs" / "training" / "copy-digit.toml"
        config.write_text(config.read_text().replace("sft_steps = 60", "sft_steps = 5"))
        options = TrainRunOptions(
            config_path=config,
            cwd=root,
            name="trace",
            max_steps=steps,
            eval_rows=4,
            torch_threads=1,
            resume_every=1000,
            handle_signals=False,
        )
        run_training(options)
    path.write_bytes(pickle.dumps(trace, protocol=pickle.HIGHEST_PROTOCOL))


# -- the two transports, behind one small interface --------------------------------------------


class Ours:
    name = "osmosis channel"

    def __init__(self, sock: socket.socket) -> None:
        from osmosis_ai.train.channel import Channel

        self.channel = Channel(sock)

    @staticmethod
    def pair() -> tuple[Any, Any]:
        return socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    def send(self, message: tuple[Any, ...]) -> None:
        self.channel.send(*message)

    def recv(self) -> tuple[Any, ...]:
        return self.channel.recv()

    def drain(self) -> list[tuple[Any, ...]]:
        return self.channel.drain()

    def fileno(self) -> int:
        return self.channel.fileno()


class Baseline:
    """``multiprocessing.connection`` as the channel would use it: a lock around ``send``
    (several trainer threads send), ``poll`` + ``recv`` for an event loop's reader."""

    name = "multiprocessing.connection"

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.lock = threading.Lock()

    @staticmethod
    def pair() -> tuple[Any, Any]:
        return multiprocessing.Pipe(duplex=True)

    def send(self, message: tuple[Any, ...]) -> None:
        with self.lock:
            self.conn.send(message)

    def recv(self) -> tuple[Any, ...]:
        return self.conn.recv()

    def drain(self) -> list[tuple[Any, ...]]:
        messages: list[tuple[Any, ...]] = []
        while self.conn.poll():
            messages.append(self.conn.recv())
        if not messages:  # readable with nothing to read: the peer closed
            self.conn.recv()
        return messages

    def fileno(self) -> int:
        return self.conn.fileno()


Transport = Ours | Baseline
TRANSPORTS: dict[str, type[Ours] | type[Baseline]] = {"ours": Ours, "baseline": Baseline}


# -- the I/O side: a child process ----------------------------------------------------------------


def io_side(kind: str, end: Any, trace: Trace, mode: str, nonblocking: bool) -> None:
    try:
        play_io(kind, end, trace, mode, nonblocking)
    except BaseException:
        os._exit(1)  # our end closes: the trainer side sees the failure


def play_io(kind: str, end: Any, trace: Trace, mode: str, nonblocking: bool) -> None:
    wire = TRANSPORTS[kind](end)
    if nonblocking:  # as uvloop's add_reader leaves the I/O process's end
        os.set_blocking(wire.fileno(), False)
    selector = selectors.DefaultSelector()
    selector.register(wire.fileno(), selectors.EVENT_READ)
    pending: deque[tuple[Any, ...]] = deque()

    def next_message() -> tuple[Any, ...]:
        while not pending:
            selector.select()
            pending.extend(wire.drain())
        return pending.popleft()

    wire.send(("ready",))
    if mode == "replay":
        for direction, message in trace:
            if direction == TO_TRAINER:
                wire.send(message)
            else:
                next_message()
    elif mode == "trainer->io":
        for _ in range(sum(1 for d, _m in trace if d == TO_IO)):
            next_message()
    else:
        for direction, message in trace:
            if direction == TO_TRAINER:
                wire.send(message)
    wire.send(("end",))
    next_message()  # the trainer's "bye": it has read everything


def trainer_side(kind: str, end: Any, trace: Trace, mode: str) -> float | None:
    """Seconds from both sides being ready to the I/O side's end mark; ``None`` when the
    transport failed (the I/O side gave up)."""
    try:
        return play_trainer(kind, end, trace, mode)
    except (EOFError, OSError, pickle.UnpicklingError, AssertionError, ValueError):
        return None


def play_trainer(kind: str, end: Any, trace: Trace, mode: str) -> float:
    wire = TRANSPORTS[kind](end)
    assert wire.recv() == ("ready",)
    started = time.perf_counter()
    if mode == "replay":
        for direction, message in trace:
            if direction == TO_IO:
                wire.send(message)
            else:
                wire.recv()
    elif mode == "trainer->io":
        for direction, message in trace:
            if direction == TO_IO:
                wire.send(message)
    else:
        for _ in range(sum(1 for d, _m in trace if d == TO_TRAINER)):
            wire.recv()
    assert wire.recv() == ("end",)
    elapsed = time.perf_counter() - started
    wire.send(("bye",))
    return elapsed


def measure(kind: str, trace: Trace, mode: str, nonblocking: bool = False) -> float | None:
    context = multiprocessing.get_context("fork")
    ours, theirs = TRANSPORTS[kind].pair()
    args = (kind, theirs, trace, mode, nonblocking)
    child = context.Process(target=io_side, args=args, daemon=True)
    child.start()
    theirs.close()  # the child's now: its exit must read as the end here
    try:
        return trainer_side(kind, ours, trace, mode)
    finally:
        child.join(timeout=60)
        if child.is_alive():
            child.kill()


# -- the run --------------------------------------------------------------------------------------


def describe(trace: Trace) -> str:
    lines = []
    for direction, label in ((TO_IO, "trainer -> I/O"), (TO_TRAINER, "I/O -> trainer")):
        messages = [m for d, m in trace if d == direction]
        sizes = [len(pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL)) for m in messages]
        kinds: dict[str, int] = {}
        for message in messages:
            inner = message[1] if message[0] == "many" else [message]
            for one in inner:
                kinds[one[0]] = kinds.get(one[0], 0) + 1
        mix = ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"  {label}: {len(messages)} sends, {sum(sizes) / 1024:.0f} KiB "
            f"(median {statistics.median(sizes)} B, max {max(sizes) / 1024:.1f} KiB); {mix}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="rounds per transport and mode")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps in the recorded run")
    parser.add_argument("--trace", type=Path, help="reuse (or keep) the recorded messages here")
    parser.add_argument("--capture-to", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.capture_to is not None:
        capture(args.capture_to, args.steps)
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        path = args.trace or Path(tmp) / "trace.pickle"
        if not path.is_file():
            print(f"recording {args.steps} GRPO steps of the copy-digit demo ...", flush=True)
            started = time.perf_counter()
            env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
            argv = [sys.executable, __file__, "--capture-to", str(path), "--steps", str(args.steps)]
            subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
            print(f"  recorded in {time.perf_counter() - started:.0f}s", flush=True)
        trace: Trace = pickle.loads(path.read_bytes())

    print(f"messages ({len(trace)} sends):\n{describe(trace)}")
    rollouts = sum(
        1
        for _d, message in trace
        for one in (message[1] if message[0] == "many" else [message])
        if one[0] == "outcome"
    )
    modes = ("replay", "trainer->io", "io->trainer")
    figures: dict[tuple[str, str], list[float]] = {(k, m): [] for k in TRANSPORTS for m in modes}
    failed: dict[str, list[bool]] = {k: [] for k in TRANSPORTS}
    for mode in modes:
        for kind in TRANSPORTS:  # a warm-up round each, not counted
            measure(kind, trace, mode)
    for round_number in range(args.rounds):
        order = list(TRANSPORTS) if round_number % 2 == 0 else list(reversed(TRANSPORTS))
        for mode in modes:
            for kind in order:
                seconds = measure(kind, trace, mode)
                if seconds is None:
                    raise SystemExit(f"{TRANSPORTS[kind].name} failed a {mode} round")
                figures[kind, mode].append(seconds)
        for kind in order:
            failed[kind].append(measure(kind, trace, "replay", nonblocking=True) is None)

    print(f"\nmedian of {args.rounds} rounds (ms per trace); ratio = ours / baseline")
    print(f"  {'mode':<13}{'baseline':>11}{'ours':>11}{'ratio':>8}   per-round ratios")
    for mode in modes:
        base = figures["baseline", mode]
        ours = figures["ours", mode]
        ratios = [o / b for o, b in zip(ours, base, strict=True)]
        print(
            f"  {mode:<13}{statistics.median(base) * 1e3:>11.1f}"
            f"{statistics.median(ours) * 1e3:>11.1f}{statistics.median(ratios):>8.2f}   "
            + " ".join(f"{r:.2f}" for r in ratios)
        )
    replay = {k: statistics.median(figures[k, "replay"]) for k in TRANSPORTS}
    per_rollout = {k: f"{replay[k] / rollouts * 1e6:.0f} us" for k in TRANSPORTS}
    print(
        f"  replay per rollout ({rollouts} in the trace): "
        f"baseline {per_rollout['baseline']}, ours {per_rollout['ours']}"
    )
    print("\nreplay with the I/O side's end non-blocking, as uvloop's add_reader leaves it:")
    for kind, transport in TRANSPORTS.items():
        print(f"  {transport.name}: {sum(failed[kind])} of {args.rounds} rounds failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
