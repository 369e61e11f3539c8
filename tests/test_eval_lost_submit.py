"""``osmosis eval run`` when the answer to a submit is lost and the rollout server does not
replay submits: the rollout was admitted, its lease went with the lost answer, the resend got
``409``. The attempt is cancelled and not journaled; the item runs again under a fresh id.

In-process (``main([...])``), with the quickstart multiply rollout served by its real server
and a scripted model. The run's rollout traffic passes through a front (``tests/rawhttp.py``)
that forwards each request to that server and closes the connection instead of relaying the
answer to the submits it is told to lose.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any

import pytest

from cli_support import Outcome, invoke
from osmosis_ai.controller.dispatch import Dispatcher
from osmosis_ai.controller.service import ControllerService
from osmosis_ai.eval import scheduler
from osmosis_ai.eval.plan import GenerationChoice
from rawhttp import (
    Lost,
    RawServer,
    cancelled_ids,
    forwards_to,
    raw_server,
    submits_lost,
    submitted_ids,
)
from test_eval_run_cli import Model, enter_workspace, lines

RERUN_WARNING = "submit answer lost; the item runs again under a fresh id"
Pool = Callable[[GenerationChoice], Dispatcher]


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return enter_workspace(tmp_path, monkeypatch, rows=4)


def behind_front(
    monkeypatch: pytest.MonkeyPatch, lose: Callable[[bytes], Lost | None]
) -> list[RawServer]:
    """Route the run's dispatchers through a front to its rollout server that loses what
    ``lose`` says and answers a resent submit ``409`` (no replay); returns the front, once
    the run has made it."""
    fronts: list[RawServer] = []
    pool = scheduler.dispatcher_pool

    @contextlib.asynccontextmanager
    async def through_front(server_url: str, service: ControllerService) -> AsyncGenerator[Pool]:
        async with raw_server(forwards_to(server_url, lose, replays=False)) as front:
            fronts.append(front)
            async with pool(front.origin, service) as make:
                yield make

    monkeypatch.setattr(scheduler, "dispatcher_pool", through_front)
    return fronts


def eval_run(capsys: Any, model: Model, monkeypatch: pytest.MonkeyPatch, *args: str) -> Outcome:
    with model.server:
        monkeypatch.setenv("OPENAI_BASE_URL", model.server.base_url)
        return invoke(
            capsys,
            "eval",
            "run",
            "configs/eval/multiply.toml",
            "-y",
            "--json",
            "--generation",
            "polling",
            *args,
        )


def log_entries(run: Path, message: str) -> list[str]:
    return [line for line in (run / "logs.txt").read_text().splitlines() if message in line]


def test_lost_submit_answers_run_again_under_fresh_ids(
    ws: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
):
    fronts = behind_front(monkeypatch, submits_lost("after", count=2))
    model = Model({})  # every row answered right
    outcome = eval_run(capsys, model, monkeypatch, "--name", "lost", "--max-in-flight", "2")

    assert outcome.code == 0, (outcome.out, outcome.err)
    envelope = outcome.json()
    assert envelope["status"] == "success" and "finished: 4 ok, 0 failed" in envelope["message"]
    assert not [line for line in outcome.stderr_lines() if "warning" in line]
    resource = envelope["resource"]
    assert (resource["succeeded"], resource["failed"]) == (4, 0)
    assert resource["dispatched"] == 6  # attempts: four items, two of them twice

    (front,) = fronts
    ids = submitted_ids(front)
    # the two lost submits, each sent once more (answered 409 by the front), and four more
    assert len(ids) == 8 and len(set(ids)) == 6
    lost = [rollout_id for rollout_id in set(ids) if ids.count(rollout_id) == 2]
    assert len(lost) == 2
    assert set(lost) <= set(cancelled_ids(front))  # the orphans were stopped

    run = ws / ".osmosis" / "evals" / "lost"
    journal = lines(run / "events.jsonl")
    assert sorted((r["row_index"], r["run_index"]) for r in journal) == [(i, 0) for i in range(4)]
    assert {r["status"] for r in journal} == {"success"}
    assert {r["rollout_id"] for r in journal} == set(ids) - set(lost)
    index = lines(run / "index.jsonl")
    assert [e["row_index"] for e in index] == list(range(4))
    assert not set(lost) & {e["rollout_id"] for e in index}

    warnings = log_entries(run, RERUN_WARNING)
    assert len(warnings) == 2
    assert all(any(rollout_id in w for w in warnings) for rollout_id in lost)
    assert "was admitted, but its answer was lost" in warnings[0]


def test_an_item_whose_every_submit_answer_is_lost_halts_the_run(
    ws: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
):
    fronts = behind_front(monkeypatch, submits_lost("after"))
    model = Model({})
    outcome = eval_run(capsys, model, monkeypatch, "--name", "gone", "--max-in-flight", "1")

    assert outcome.code == 1, (outcome.out, outcome.err)
    envelope = outcome.json()
    resource = envelope["resource"]
    tries = scheduler.LOST_IN_TRANSIT_RETRIES + 1
    (front,) = fronts
    ids = submitted_ids(front)
    attempts = list(dict.fromkeys(ids))
    # row 0 only: each attempt under its own id, each sent twice; then the run halts
    assert len(attempts) == tries and ids == [i for i in attempts for _ in range(2)]
    assert set(attempts) <= set(cancelled_ids(front))
    assert resource["dispatched"] == tries
    assert (resource["succeeded"], resource["failed"]) == (0, 0)
    assert envelope["status"] == "partial"
    assert (
        "dispatch halted (the answers to 4 submits in a row for row 0 run 0 were lost"
        in (envelope["message"])
    )
    assert "4 of 4 work items are still pending" in envelope["message"]

    (halted,) = [
        line["warning"]["message"]
        for line in outcome.stderr_lines()
        if line.get("warning", {}).get("code") == "DISPATCH_HALTED"
    ]
    assert f"the answers to {tries} submits in a row for row 0 run 0 were lost" in halted
    assert attempts[-1] in halted and "was admitted, but its answer was lost" in halted
    assert "4 work items stay pending" in halted

    run = ws / ".osmosis" / "evals" / "gone"
    assert lines(run / "events.jsonl") == []
    assert len(log_entries(run, RERUN_WARNING)) == tries - 1
    (logged,) = log_entries(run, "ERROR [dispatch] dispatch halted {")
    assert attempts[-1] in logged
