"""``run_rollout_server(workers=N)``: one port, N forked worker processes, each rollout's
calls answered by the worker that runs it, whichever worker a connection lands on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

from osmosis_ai.errors import UsageError
from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.server import workers as workers_module
from osmosis_ai.rollout.server.workers import (
    WORKERS_ENV,
    WorkerSet,
    resolve_workers,
    serve_workers,
)
from osmosis_ai.testing import CallbackReceiver, ProtocolController
from osmosis_ai.testing.serving import free_port, serve_in_task
from rawhttp import Lost, RawServer, first_submit, forwards_to, raw_server
from rollouts import MetadataGrader, ScriptedBehaviour, init_body, poll_until_done

pytest.importorskip("uvicorn", reason="run_rollout_server needs the server extra (uvicorn)")
pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork"), reason="worker processes need os.fork, which this platform lacks"
)

LEASE = "X-Osmosis-Rollout-Lease"
KEY = "controller-key"

ENTRYPOINT = textwrap.dedent(
    """
    import asyncio
    import os
    import sys

    from osmosis_ai.rollout import AgentWorkflow, Grader, LocalBackend
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server


    class Pid(AgentWorkflow):
        async def run(self, ctx):
            await asyncio.sleep((ctx.metadata or {}).get("sleep", 0))
            return [*ctx.prompt, {"role": "assistant", "content": f"pid {os.getpid()}"}]


    class Full(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1.0)


    class Reporting(LocalBackend):
        \"\"\"Health with fields of every kind a backend may add to it.\"\"\"

        def health(self):
            body = super().health()
            body["max_queue_depth"] = 5
            body["schema_version"] = 3
            body["port"] = 8123
            body["started_at"] = 1_700_000_000
            body["pid"] = os.getpid()
            body["limits"] = {"max_tokens": 4096}
            return body


    if __name__ == "__main__":
        backend_class = Reporting if "--reporting" in sys.argv else LocalBackend
        options = {}
        if "--root-path" in sys.argv:
            options["root_path"] = sys.argv[sys.argv.index("--root-path") + 1]
        app = create_rollout_server(backend=backend_class(workflow=Pid, grader=Full))
        run_rollout_server(app, **options)
    """
)


class Served:
    def __init__(self, proc: subprocess.Popen[str], url: str) -> None:
        self.proc = proc
        self.url = url

    def output(self) -> str:
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.communicate(timeout=30)[0]


def owner(rollout_id: str, workers: int = 2) -> int:
    return zlib.crc32(rollout_id.encode()) % workers


def children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children")
    if found.exists():
        return [int(child) for child in found.read_text().split()]
    listed = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return [int(child) for child in listed.stdout.split()]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(")")[-1].split()[0] == "Z")


def wait_gone(pids: list[int], limit: float = 15.0) -> list[int]:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    return [pid for pid in pids if alive(pid)]


@contextlib.contextmanager
def served(tmp_path: Path, workers: str = "2", *args: str) -> Iterator[Served]:
    script = tmp_path / "main.py"
    script.write_text(ENTRYPOINT)
    port = free_port()
    env = {
        **os.environ,
        "_OSMOSIS_ROLLOUT_PORT": str(port),
        "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(tmp_path / "artifacts"),
        WORKERS_ENV: workers,
    }
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    server = Served(proc, url)
    try:
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=5) as client:
            while True:
                assert proc.poll() is None, server.output()
                assert time.monotonic() < deadline, "no /health answer in 60 s"
                try:
                    if client.get(f"{url}/health").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
        yield server
    finally:
        if proc.poll() is None:
            kids = children(proc.pid)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            finally:
                for kid in kids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(kid, signal.SIGKILL)


@contextlib.asynccontextmanager
async def fresh_connections(url: str) -> AsyncIterator[httpx.AsyncClient]:
    """A client that opens a new connection per request, so requests spread over the
    workers the way many controller connections do."""
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        yield client


async def health_when(
    client: httpx.AsyncClient, ready: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The first ``/health`` body for which ``ready`` holds (workers report as they go)."""
    async with asyncio.timeout(60):  # a guard against a hang, not a speed requirement
        while True:
            body = (await client.get("/health")).json()
            if ready(body):
                return body
            await asyncio.sleep(0.02)


def submit_body(rollout_id: str, **metadata: Any) -> str:
    return json.dumps(init_body(rollout_id, "http://127.0.0.1:9/v1", metadata=metadata or None))


async def submit(client: httpx.AsyncClient, rollout_id: str, **metadata: Any) -> str:
    response = await client.post("/rollout", content=submit_body(rollout_id, **metadata))
    assert response.status_code == 202, response.text
    return response.json()["polling_lease_token"]


# -- the worker count ---------------------------------------------------------------------------


def test_worker_count_from_argument_env_or_default(monkeypatch):
    monkeypatch.delenv(WORKERS_ENV, raising=False)
    assert resolve_workers() == 1
    assert resolve_workers(3) == 3
    monkeypatch.setenv(WORKERS_ENV, "4")
    assert resolve_workers() == 4
    assert resolve_workers(2) == 2  # the argument wins
    monkeypatch.setenv(WORKERS_ENV, "auto")
    assert resolve_workers() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "OSMOSIS_ROLLOUT_WORKERS='0' is not a number of workers: use a whole number >= 1"),
        ("two", "OSMOSIS_ROLLOUT_WORKERS='two' is not a number of workers: set a whole number"),
    ],
)
def test_bad_worker_counts_name_the_value_and_the_fix(monkeypatch, value, message):
    monkeypatch.setenv(WORKERS_ENV, value)
    with pytest.raises(UsageError) as raised:
        resolve_workers()
    assert str(raised.value).startswith(message)
    with pytest.raises(UsageError, match=r"workers=-1 is not a number of workers"):
        resolve_workers(-1)


def test_owner_is_stable_and_spreads_rollouts():
    workers = WorkerSet(index=0, origins=("http://a", "http://b", "http://c"), secret="s")
    ids = [f"rollout-{n}" for n in range(3000)]
    owners = [workers.owner(rollout_id) for rollout_id in ids]
    assert owners == [zlib.crc32(i.encode()) % 3 for i in ids]
    assert all(900 < owners.count(index) < 1100 for index in range(3))


def test_workers_refuse_an_app_that_cannot_route_rollouts():
    async def bare_app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never served")

    with pytest.raises(UsageError, match=r"workers=2 needs the app create_rollout_server built"):
        serve_workers(bare_app, host="127.0.0.1", port=0, workers=2, options={})


# -- serving --------------------------------------------------------------------------------------


async def test_each_rollout_runs_on_its_owner_whatever_connection_it_arrives_on(tmp_path):
    with served(tmp_path) as server:
        async with fresh_connections(server.url) as client:
            health = (await client.get("/health")).json()
            assert health["workers"] == {"count": 2}
            ids = [f"w-{n}" for n in range(24)]
            leases = await asyncio.gather(*(submit(client, i) for i in ids))
            results = await asyncio.gather(
                *(poll_until_done(client, i, lease) for i, lease in zip(ids, leases, strict=True))
            )
            statuses = [(await client.get(f"/rollout/{i}/status")).json() for i in ids]
            # each body sent again, on connections landing on either worker: the owner
            # answers the replay with the lease it gave, forwarded or not
            replays = await asyncio.gather(
                *(client.post("/rollout", content=submit_body(i)) for i in ids)
            )
            duplicate = await client.post("/rollout", json=init_body(ids[0], "http://x/v1"))
            unknown = await client.get("/rollout/nobody/result", headers={LEASE: "x"})
    pids: dict[int, set[str]] = {0: set(), 1: set()}
    for rollout_id, result in zip(ids, results, strict=True):
        assert result["status"] == "success", result
        assert result["sample"]["reward"] == 1.0
        pids[owner(rollout_id)].add(result["sample"]["messages"][-1]["content"])
    # every rollout of one owner ran in one process, and the two owners are two processes
    assert len(pids[0]) == 1 and len(pids[1]) == 1 and pids[0] != pids[1], pids
    assert [s["status"] for s in statuses] == ["success"] * len(ids)
    assert [(r.status_code, r.json()["polling_lease_token"]) for r in replays] == [
        (202, lease) for lease in leases
    ]
    assert duplicate.status_code == 409  # the owner saw the id before, with another body
    assert unknown.status_code == 404


async def test_cancel_and_health_cover_every_worker(tmp_path):
    with served(tmp_path) as server:
        async with fresh_connections(server.url) as client:
            ids = [f"slow-{n}" for n in range(8)]
            assert {owner(i) for i in ids} == {0, 1}
            leases = await asyncio.gather(*(submit(client, i, sleep=60) for i in ids))
            health = await health_when(
                client, lambda body: body["concurrency"]["running"] == len(ids)
            )
            assert health["lifecycle"]["active_rollouts"] == len(ids)
            assert health["concurrency"]["max_concurrent"] == 2 * 64  # per worker, summed
            assert health["lifecycle"]["accepting_rollouts"] is True

            one = await client.post("/rollout/cancel", json={"ids": [ids[0], "nobody"]})
            assert one.json() == {
                "dispositions": {ids[0]: "cancelled_running", "nobody": "not_found"}
            }
            rest = await client.post("/rollout/cancel", json={"prefix": "slow-"})
            assert rest.status_code == 200
            dispositions = rest.json()["dispositions"]
            # a prefix picks live rollouts only: the first one, cancelled already, if not ended
            assert dispositions.pop(ids[0], "ended") in ("cancelled_running", "ended")
            assert dispositions == {i: "cancelled_running" for i in ids[1:]}
            results = await asyncio.gather(
                *(poll_until_done(client, i, lease) for i, lease in zip(ids, leases, strict=True))
            )
            bad = await client.post("/rollout/cancel", json={"ids": ["a"], "all": True})
    assert {r["status"] for r in results} == {"cancelled"}
    assert bad.status_code == 422


async def test_callback_generation_through_either_worker(tmp_path):
    receiver = CallbackReceiver(KEY)
    with served(tmp_path) as server:
        async with serve_in_task(receiver.app) as receiver_url, fresh_connections(server.url) as c:
            ids = [f"cb-{n}" for n in range(8)]
            assert {owner(i) for i in ids} == {0, 1}
            for rollout_id in ids:
                receiver.expect(rollout_id)
                body = init_body(
                    rollout_id,
                    "http://127.0.0.1:9/v1",
                    completion_callback_url=f"{receiver_url}/v1/rollouts/{rollout_id}/completion",
                    grader_callback_url=f"{receiver_url}/v1/rollouts/{rollout_id}/grader",
                    controller_api_key=KEY,
                )
                response = await c.post("/rollout", json=body)
                assert (response.status_code, response.json()) == (202, {})
            graded = await asyncio.wait_for(
                asyncio.gather(*(receiver.wait_for(i, "grader") for i in ids)), 20
            )
    assert [(g["status"], g["sample"]["reward"]) for g in graded] == [("success", 1.0)] * len(ids)


async def test_health_adds_up_counts_and_keeps_every_other_field_whole(tmp_path):
    with served(tmp_path, "2", "--reporting") as server:
        pids = children(server.proc.pid)
        async with fresh_connections(server.url) as client:
            ids = [f"busy-{n}" for n in range(6)]
            assert {owner(i) for i in ids} == {0, 1}
            await asyncio.gather(*(submit(client, i, sleep=60) for i in ids))
            await health_when(client, lambda body: body["concurrency"]["running"] == len(ids))
            answers = [await client.get("/health") for _ in range(8)]  # on either worker
            await client.post("/rollout/cancel", json={"all": True})
    bodies = [answer.json() for answer in answers]
    first = bodies[0]
    # counts add up over the workers
    assert first["concurrency"]["running"] == len(ids)
    assert first["concurrency"]["queued"] == 0
    assert first["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": len(ids)}
    # a capacity limit holds per worker: the server's capacity is the workers' total
    assert first["concurrency"]["max_concurrent"] == 2 * 64
    assert first["max_queue_depth"] == 2 * 5
    # identity, versions, ports, timestamps and unknown fields are one worker's, unsummed
    assert first["schema_version"] == 3
    assert first["port"] == 8123
    assert first["started_at"] == 1_700_000_000
    assert first["limits"] == {"max_tokens": 4096}
    assert first["status"] == "ok"
    assert first["workers"] == {"count": 2}
    assert first["pid"] in pids
    # and the same worker's, whichever worker answered: every answer tells one story
    assert all(body == first for body in bodies), bodies
    instance = {answer.headers["x-osmosis-rollout-instance-id"] for answer in answers}
    assert instance == {first["instance_id"]}


async def test_root_path_routes_each_rollout_to_its_owner_in_both_generations(tmp_path):
    with served(tmp_path, "2", "--root-path", "/api") as server:
        # Served under a root path, as behind a proxy that strips /api: the app sees it
        # in each request's scope, so FastAPI's copies of the hot routes answer.
        async with fresh_connections(server.url) as client:
            ids = [f"rp-{n}" for n in range(12)]
            assert {owner(i) for i in ids} == {0, 1}
            leases = await asyncio.gather(*(submit(client, i) for i in ids))
            results = await asyncio.gather(
                *(poll_until_done(client, i, lease) for i, lease in zip(ids, leases, strict=True))
            )
            statuses = [(await client.get(f"/rollout/{i}/status")).json() for i in ids]
            health = (await client.get("/health")).json()
            schema = (await client.get("/openapi.json")).json()
        for generation in ("polling", "callback"):
            async with ProtocolController(server.url, generation=generation) as controller:
                outcomes = await asyncio.gather(
                    *(
                        controller.run(
                            [{"role": "user", "content": "hi"}],
                            "http://127.0.0.1:9/v1",
                            label="42",
                            rollout_id=f"{generation}-{n}",
                        )
                        for n in range(6)
                    )
                )
            assert {owner(o.rollout_id) for o in outcomes} == {0, 1}
            assert [(o.status.value, o.reward) for o in outcomes] == [("success", 1.0)] * 6, (
                outcomes
            )
    pids: dict[int, set[str]] = {0: set(), 1: set()}
    for rollout_id, result in zip(ids, results, strict=True):
        assert result["status"] == "success", result
        pids[owner(rollout_id)].add(result["sample"]["messages"][-1]["content"])
    assert len(pids[0]) == 1 and len(pids[1]) == 1 and pids[0] != pids[1], pids
    assert [s["status"] for s in statuses] == ["success"] * len(ids)
    assert health["workers"] == {"count": 2}
    assert schema["servers"] == [{"url": "/api"}]


def test_sigterm_drains_and_stops_every_worker(tmp_path):
    with served(tmp_path) as server:
        kids = children(server.proc.pid)
        assert len(kids) == 2
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=30) == 0
        assert wait_gone(kids) == []
    output = server.output()
    assert "with 2 workers" in output
    assert output.count("Application shutdown complete.") == 2, output


def test_a_worker_that_dies_stops_the_server(tmp_path):
    with served(tmp_path) as server:
        kids = children(server.proc.pid)
        os.kill(kids[0], signal.SIGKILL)
        assert server.proc.wait(timeout=30) == 1
        assert wait_gone(kids) == []
    output = server.output()
    assert re.search(
        rf"rollout worker \d \(pid {kids[0]}\) exited on its own with signal SIGKILL", output
    )


def test_workers_stop_when_their_parent_is_killed(tmp_path):
    with served(tmp_path) as server:
        kids = children(server.proc.pid)
        server.proc.kill()
        server.proc.wait(timeout=10)
        assert wait_gone(kids) == []
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{server.url}/health", timeout=2)


# -- forwarding, in one process: the owner behind a front that closes kept-alive connections ------

started_runs: list[str] = []


class Tagged(LocalBackend):
    """A LocalBackend whose rollouts note ``metadata.tag`` in :data:`started_runs` as they start."""

    def __init__(self) -> None:
        super().__init__(workflow=TaggedWorkflow, grader=MetadataGrader)


class TaggedWorkflow(ScriptedBehaviour):
    async def run(self, ctx):
        started_runs.append((ctx.metadata or {}).get("tag", "?"))
        return await super().run(ctx)


def owned_by_one(prefix: str) -> str:
    """A rollout id that worker 1 of 2 owns."""
    return next(f"{prefix}-{n}" for n in range(100) if owner(f"{prefix}-{n}") == 1)


@contextlib.asynccontextmanager
async def forwarding(
    monkeypatch: pytest.MonkeyPatch,
    wrap: Callable[[Any], Any] = lambda app: app,
    lose: Callable[[bytes], Lost | None] | None = None,
) -> AsyncIterator[tuple[httpx.AsyncClient, RawServer]]:
    """Worker 0 of 2, served here (through ``wrap``), whose worker 1 is a raw front that
    forwards to a real rollout server; unless ``lose`` says otherwise, the front closes its
    kept-alive connection after passing on the first ``POST /rollout``, unanswered (as an
    owner closing an idle connection just as a forwarded request arrives)."""
    started_runs.clear()
    router = create_rollout_server(backend=Tagged(), configure_logging=False)
    owner_app = create_rollout_server(backend=Tagged(), configure_logging=False)
    async with (
        serve_in_task(owner_app) as owner_url,
        raw_server(forwards_to(owner_url, lose or first_submit("after"))) as front,
    ):
        workers = WorkerSet(index=0, origins=("http://127.0.0.1:9", front.origin), secret="s")
        monkeypatch.setattr(workers_module._Serving, "workers", workers)
        async with (
            serve_in_task(wrap(router)) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            yield client, front


async def test_a_forwarded_submit_whose_connection_closes_is_resent_and_replayed(
    monkeypatch, artifact_root
):
    rollout_id = owned_by_one("race")
    async with forwarding(monkeypatch) as (client, front):
        # a forwarded call leaves a kept-alive connection to the owner; the submit reuses it
        assert (await client.get(f"/rollout/{rollout_id}/status")).json()["status"] == "unknown"
        body = init_body(rollout_id, "http://127.0.0.1:9/v1", metadata={"tag": rollout_id})
        admitted = await client.post("/rollout", json=body)
        assert admitted.status_code == 202, admitted.text
        lease = admitted.json()["polling_lease_token"]
        result = await poll_until_done(client, rollout_id, lease)
    assert (result["status"], result["sample"]["reward"]) == ("success", 1.0)
    submits = [head for head, _ in front.requests if head.startswith(b"POST /rollout ")]
    assert len(submits) == 2  # the first, which the owner admitted, and the resend
    assert front.connections == 2
    assert started_runs == [rollout_id]  # the resend was answered as a replay: one run


@pytest.mark.parametrize(
    "unsafe",
    [
        pytest.param({"llm_api_key": None}, id="no-llm-api-key"),
        pytest.param({"completion_callback_url": "http://127.0.0.1:9/done"}, id="callback"),
    ],
)
async def test_a_forwarded_submit_that_cannot_be_replayed_is_not_resent(
    monkeypatch, artifact_root, unsafe
):
    rollout_id = owned_by_one("once")
    async with forwarding(monkeypatch) as (client, front):
        assert (await client.get(f"/rollout/{rollout_id}/status")).status_code == 200
        body = init_body(rollout_id, "http://127.0.0.1:9/v1", metadata={"tag": rollout_id})
        body.update(unsafe)
        lost = await client.post("/rollout", json={k: v for k, v in body.items() if v})
        assert lost.status_code == 503
        assert "rollout worker 1 did not answer" in lost.json()["detail"]
    submits = [head for head, _ in front.requests if head.startswith(b"POST /rollout ")]
    assert len(submits) == 1  # never twice: a second send would run it again, or get 409
    assert started_runs == [rollout_id]


async def test_a_forwarded_path_is_sent_percent_encoded_and_a_raw_non_ascii_one_is_a_400(
    monkeypatch, artifact_root
):
    rollout_id = owned_by_one("é")
    path = f"/rollout/{quote(rollout_id, safe='')}/result"
    raw_path: list[bytes | None] = []

    def wrap(app: Any) -> Any:
        async def rewritten(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and raw_path:
                scope = {k: v for k, v in scope.items() if k != "raw_path"}
                if raw_path[-1] is not None:  # a server passing raw bytes on as it got them
                    scope["raw_path"] = raw_path[-1]
            await app(scope, receive, send)

        return rewritten

    async with forwarding(monkeypatch, wrap, lambda head: None) as (client, _front):
        lease = (
            await client.post("/rollout", json=init_body(rollout_id, "http://127.0.0.1:9/v1"))
        ).json()["polling_lease_token"]
        raw_path.append(None)  # a server that gives no raw_path: the decoded path is encoded
        result = await poll_until_done(client, rollout_id, lease)
        raw_path.append(f"/rollout/{rollout_id}/result".encode())
        refused = await client.get(path, headers={LEASE: lease})
    assert result["status"] == "success"
    assert refused.status_code == 400
    assert refused.json() == {
        "detail": f"the request path '/rollout/{rollout_id}/result' has a space, control or "
        "non-ASCII character, so it cannot be passed to the worker running the rollout: "
        "percent-encode it"
    }
