"""The rollout server of a run: launched early, owned through ``server.json``, reaped if orphaned.

:class:`RunServer` spawns the child as soon as the run dir is open and awaits its health in a
thread, so its start-up overlaps the controller's own. ``server.json`` records the child from
its spawn on and is removed on a clean stop; after a ``kill -9`` of the controller the next
invocation stops the orphan, once the process on the recorded port proves it is ours (same
instance id).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from osmosis_ai.controller.rollout_process import (
    RolloutServerProcess,
    stop_if_ours,
)
from osmosis_ai.eval.plan import EvalPlan, model_credential_vars
from osmosis_ai.eval.rundir import TRIALS_DIR
from osmosis_ai.rundir.durable import atomic_write_json, fsync_dir
from osmosis_ai.rundir.timestamps import iso_utc

SERVER_FILE = "server.json"
_STOP_GRACE_SEC = 5.0


@dataclass(frozen=True)
class ServerRecord:
    """The ownership record of one rollout server process (the leader of its process group)."""

    pid: int
    port: int
    instance_id: str
    created_at: str

    def write(self, run_dir: Path) -> None:
        data = {"pid": self.pid, "pgid": self.pid, "port": self.port}
        data |= {"instance_id": self.instance_id, "created_at": self.created_at}
        atomic_write_json(run_dir / SERVER_FILE, data)

    @classmethod
    def read(cls, run_dir: Path) -> ServerRecord | None:
        try:
            data = json.loads((run_dir / SERVER_FILE).read_text(encoding="utf-8"))
            return cls(int(data["pid"]), int(data["port"]), str(data["instance_id"]), "")
        except (OSError, ValueError, KeyError, TypeError):
            return None


class RunServer:
    """A :class:`RolloutServerProcess` started in a background thread for one run dir."""

    def __init__(self, process: RolloutServerProcess, run_dir: Path) -> None:
        self.process = process
        self.run_dir = run_dir
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._recorded: int | None = None

    @classmethod
    def for_plan(  # noqa: PLR0917
        cls,
        plan: EvalPlan,
        run_dir: Path,
        secrets: Mapping[str, str],
        environ: Mapping[str, str],
        port: int | None,
        on_output: Callable[[str], None],
    ) -> RunServer:
        """The plan's rollout server: ``[env]`` and the secrets in its environment, the
        model's credentials blanked (it reaches the model only through the proxy)."""
        hidden = dict.fromkeys(model_credential_vars(plan, environ), "")
        process = RolloutServerProcess(
            rollout_dir=plan.config.rollout_dir or Path(),
            entrypoint=plan.config.entrypoint_path or Path(),
            artifact_root=run_dir / TRIALS_DIR,
            env={**plan.config.env, **secrets, **hidden},
            port=port,
            on_output=on_output,
        )
        process.command()  # decides now: this interpreter (fast path), or uv
        return cls(process, run_dir)

    def launch(self) -> None:
        """Spawn the server and record it now; its health is awaited in a thread (:meth:`ready`).

        The record comes before anything else, so that a controller killed at any later
        moment leaves an orphan the next invocation can find.
        """
        try:
            self.process.spawn()
            self._record()
        except BaseException as exc:
            self._started.set_exception(exc)  # nothing to wait for: stop() must not
            raise

        def wait() -> None:
            try:
                self.process.wait_ready()
            except BaseException as exc:
                self._started.set_exception(exc)
            else:
                self._started.set_result(None)

        threading.Thread(target=wait, name="osmosis-rollout-server", daemon=True).start()

    async def ready(self) -> None:
        """Wait until healthy (recording ``server.json`` again if the child was respawned)."""
        waiting = asyncio.wrap_future(self._started)
        while not waiting.done():
            self._record()
            await asyncio.wait({waiting}, timeout=0.02)
        await waiting
        self._record()

    def _record(self) -> None:
        child, port = self.process.process, self.process.port
        if child is not None and port is not None and child.pid != self._recorded:
            record = ServerRecord(child.pid, port, self.process.instance_id, iso_utc())
            record.write(self.run_dir)
            self._recorded = child.pid

    def stop(self, grace_sec: float = _STOP_GRACE_SEC) -> None:
        """Stop the child (SIGTERM, then SIGKILL), let the start thread end, drop the record."""
        self.process.stop(grace_sec)
        with contextlib.suppress(BaseException):
            self._started.exception(timeout=grace_sec + 5.0)
        self.process.stop(grace_sec)  # a child spawned while the first stop ran
        forget_server(self.run_dir)


def forget_server(run_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(run_dir / SERVER_FILE)
        fsync_dir(run_dir)


def reap_orphan(run_dir: Path) -> ServerRecord | None:
    """Stop the server a killed earlier invocation left running, if it is provably ours.

    Returns the record of a server it stopped. The record is removed either way: a process
    that does not answer as ours is left alone.
    """
    record = ServerRecord.read(run_dir)
    stopped = record is not None and stop_if_ours(
        record.pid, record.port, record.instance_id, grace_sec=_STOP_GRACE_SEC
    )
    forget_server(run_dir)
    return record if stopped else None
