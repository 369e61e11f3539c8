"""``osmosis eval run --ray``: the rollout servers run as a fleet of Ray actors on a local
two-node cluster; the controller and the journal stay in this process.

The quickstart multiply rollout and a scripted model (tests/test_eval_run_cli.py): the fleet's
results equal a single server's row for row, the servers sit on both nodes and both take work,
and a server killed mid-run loses nothing and counts nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from cli_support import Outcome, invoke
from osmosis_ai.distributed.cluster import LOOPBACK_NODES
from test_eval_run_cli import Model, enter_workspace, lines

pytestmark = pytest.mark.ray

PLAN = {2: "right", 3: "wrong", 4: "right", 5: "error", 6: "right", 7: 1, 8: "wrong", 9: "right"}


def eval_run(capsys: Any, model: Model, monkeypatch: pytest.MonkeyPatch, *args: str) -> Outcome:
    monkeypatch.setenv("OPENAI_BASE_URL", model.server.base_url)
    return invoke(capsys, "eval", "run", "configs/eval/multiply.toml", "-y", "--json", *args)


def results(run: Path) -> list[tuple[int, int, str, Any]]:
    """(row, run, status, reward) of each item, in order: what two runs must share."""
    return sorted(
        (r["row_index"], r["run_index"], r["status"], r.get("reward"))
        for r in lines(run / "events.jsonl")
    )


def log_details(run: Path, message: str) -> list[dict[str, Any]]:
    found = []
    for line in (run / "logs.txt").read_text().splitlines():
        if message in line and "{" in line:
            found.append(json.loads(line[line.index("{") :]))
    return found


def test_the_fleet_equals_one_server_row_for_row(
    ray_cluster, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
):
    ws = enter_workspace(tmp_path, monkeypatch, rows=8)
    model = Model(PLAN)
    with model.server:
        single = eval_run(capsys, model, monkeypatch, "--name", "single")
        model.calls.clear()
        fleet = eval_run(
            capsys,
            model,
            monkeypatch,
            "--name",
            "fleet",
            "--ray",
            ray_cluster.address,
            "--rollout-servers",
            "2",
        )
    assert single.code == fleet.code, (fleet.out, fleet.err)
    one, many = ws / ".osmosis/evals/single", ws / ".osmosis/evals/fleet"
    assert results(many) == results(one)
    assert len(results(many)) == 8
    assert (
        json.loads((many / "metrics.json").read_text())["summary"]
        == json.loads((one / "metrics.json").read_text())["summary"]
    )

    servers = log_details(many, "[server] rollout server ")
    assert sorted(s["node"] for s in servers) == sorted(LOOPBACK_NODES)  # one on each node
    (per_server,) = log_details(many, "attempts per rollout server")
    assert len(per_server) == 2 and all(count > 0 for count in per_server.values())
    assert sum(per_server.values()) == 8


def rollout_servers_of(ws: Path) -> list[psutil.Process]:
    entry = str(ws / "rollouts")
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(part.startswith(entry) for part in cmdline):
            found.append(proc)
    return found


def test_a_server_killed_mid_run_loses_nothing_and_counts_nothing_twice(
    ray_cluster, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
):
    ws = enter_workspace(tmp_path, monkeypatch, rows=8)
    model = Model({}, answer_only=4)  # every answer right; calls after the 4th wait
    outcome: list[Outcome] = []
    args = ("--name", "killed", "--ray", ray_cluster.address, "--max-in-flight", "4")
    with model.server:
        runner = threading.Thread(
            target=lambda: outcome.append(eval_run(capsys, model, monkeypatch, *args))
        )
        runner.start()
        deadline = time.monotonic() + 90
        while model.calls.total() < 6 and time.monotonic() < deadline:  # 4 done, 2+ held
            time.sleep(0.05)
        assert model.calls.total() >= 6, "the run never got rollouts in flight"
        servers = rollout_servers_of(ws)
        assert len(servers) == 2
        victim = servers[0]
        os.killpg(victim.pid, signal.SIGKILL)  # a server this run started: the whole group
        time.sleep(1.0)  # the fleet notices; its items go back to the pool
        model.release.set()
        runner.join(timeout=120)
    assert not runner.is_alive()
    (done,) = outcome
    assert done.code == 0, (done.out, done.err)
    run = ws / ".osmosis/evals/killed"
    journal = lines(run / "events.jsonl")
    keys = [(r["row_index"], r["run_index"]) for r in journal]
    assert sorted(keys) == [(i, 0) for i in range(8)]  # every item, exactly once
    assert {r["status"] for r in journal} == {"success"}
    assert done.json()["resource"]["dispatched"] > 8  # the killed server's items ran again
    warnings = [line for line in done.stderr_lines() if "ROLLOUT_SERVER_DIED" in line]
    assert warnings or "ROLLOUT_SERVER_DIED" in (run / "logs.txt").read_text()


JOINING_NODE = "127.0.0.5"


def test_a_node_that_joins_mid_run_gets_a_server_that_takes_work(
    ray_cluster, tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
):
    ws = enter_workspace(tmp_path, monkeypatch, rows=12)
    run = ws / ".osmosis/evals/grown"
    model = Model({}, answer_only=4)  # every answer right; calls after the 4th wait
    outcome: list[Outcome] = []
    args = ("--name", "grown", "--ray", ray_cluster.address, "--max-in-flight", "4")
    cluster = ray_cluster.cluster
    added: list[int] = []
    with model.server:
        runner = threading.Thread(
            target=lambda: outcome.append(eval_run(capsys, model, monkeypatch, *args))
        )
        runner.start()
        try:
            deadline = time.monotonic() + 90
            while model.calls.total() < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert model.calls.total() >= 6, "the run never got rollouts in flight"
            added.append(cluster.add_node(JOINING_NODE))
            deadline = time.monotonic() + 60
            joined = f"joined with its node {JOINING_NODE}"
            while joined not in (run / "logs.txt").read_text() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert joined in (run / "logs.txt").read_text(), "no server started on the new node"
        finally:
            model.release.set()
            runner.join(timeout=120)
            if added:
                cluster.stop_node(added[0])
    assert not runner.is_alive()
    (done,) = outcome
    assert done.code == 0, (done.out, done.err)
    journal = lines(run / "events.jsonl")
    assert sorted((r["row_index"], r["run_index"]) for r in journal) == [(i, 0) for i in range(12)]
    (attempts,) = log_details(run, "attempts per rollout server")
    on_new_node = [n for url, n in attempts.items() if f"//{JOINING_NODE}:" in url]
    assert on_new_node and on_new_node[0] > 0, attempts  # the new server took items
