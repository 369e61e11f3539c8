"""``osmosis train run --ray`` on a two-turn tool rollout: every rollout makes two model calls
with a tool's result between them, so its row carries an environment mask, and a model
answer that does not re-encode to its own tokens splits a rollout into several rows. Two
trainer workers (gloo DDP on CPU) make the same collectives whatever their own share of the
rollouts produced (the same number of appended rows, padded with rows that carry no loss):
the steps train on both workers and their metrics come back."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_train_ray import metrics, options, workspace

from osmosis_ai.train.runner import run_training
from osmosis_ai.train.tiny_model import build_tiny_model
from test_train_smoke import SMOKE_CONFIG

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

STEPS = 2
# Two model calls with a tool's result between them. The first rollout of the run to claim
# the marker file rewrites its first answer before the second call, so its tokens split
# into two rows: one worker has a segment row to append and the other has none.
ROLLOUT = """
import os

from osmosis_ai.rollout import (
    AgentWorkflow, AgentWorkflowConfig, AgentWorkflowContext, AgentWorkflowOutput, Grader,
    GraderContext, LocalBackend, get_rollout_context,
)
from osmosis_ai.rollout.http import post_json


def first_to_claim() -> bool:
    try:
        os.close(os.open(os.environ["BREAK_MARKER"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return False
    return True


class ToolTurns(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        url = f"{rollout.chat_completions_url}/chat/completions"
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        messages = list(ctx.prompt)
        task = str(messages[-1].get("content") or "")
        for turn in range(2):
            if turn:
                messages.append({"role": "user", "content": task})
                if first_to_claim():
                    messages[-2] = {"role": "assistant", "content": "rewritten"}
            # one token: a digit re-encodes to itself, so the chain breaks only where rewritten
            body = {"model": "osmosis-rollout", "messages": messages, "max_tokens": 1}
            completion = await post_json(url, body, headers=headers)
            answer = completion["choices"][0]["message"].get("content") or ""
            messages.append({"role": "assistant", "content": answer})
        return AgentWorkflowOutput(messages=messages)


class Partial(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        answer = str(ctx.sample.messages[-1].get("content") or "").strip()
        ctx.set_reward(sum(map(ord, answer)) % 5 / 4)


if __name__ == "__main__":
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

    backend = LocalBackend(workflow=ToolTurns, grader=Partial, max_concurrent=64)
    run_rollout_server(create_rollout_server(backend=backend, configure_logging=False))
"""
TOOL_CONFIG = (
    SMOKE_CONFIG.replace('rollout = "copy-digit"', 'rollout = "tool-turns"')
    .replace("eval_interval = 2", "eval_interval = 0")
    .replace("checkpoint_save_freq = 2", "checkpoint_save_freq = 0")
    # both answers and the user turn between them fit one row
    .replace("max_response_length = 4", "max_response_length = 40")
    # a policy warmed up enough that its answers re-encode to their own tokens (as the bench's
    # does), so the rewrite is the only split and the other worker has no segment
    .replace("sft_steps = 5", "sft_steps = 60")
    # the policy's answers re-encode to their own tokens, so only the rewrite splits a row
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("ray-tool-model") / "tiny")


@pytest.mark.parametrize("staleness", [0, 1])
def test_two_workers_train_a_two_turn_tool_rollout(
    ray_cluster, tmp_path: Path, model_dir: Path, staleness: int
):
    marker = tmp_path / "rewritten"
    config = (
        TOOL_CONFIG.replace("[training]\n", f"[training]\nmax_staleness = {staleness}\n")
        + f'\n[env]\nBREAK_MARKER = "{marker}"\n'
    )
    root = workspace(tmp_path, model_dir, "tools", config)
    folder = root / "rollouts" / "tool-turns"
    folder.mkdir(parents=True)
    (folder / "main.py").write_text(ROLLOUT)
    result = run_training(
        options(
            root,
            "tools",
            ray_address=ray_cluster.address,
            trainer_workers=2,
            rollout_servers=2,
            max_steps=STEPS,
        )
    )
    assert (result.status, result.steps_done) == ("success", STEPS), result
    records = metrics(result.run_dir)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert record["rollouts"] == 16  # both workers' halves counted, once
    assert marker.exists()
    assert sum(int(r["token_segments"]) for r in records) > sum(int(r["rollouts"]) for r in records)
    log = (result.run_dir / "logs.txt").read_text()
    assert "trainer worker 1 of 2 started" in log
    # a collective mismatch kills a worker and Ray Train restarts the group: none may have
    assert "restarted after a failure" not in log, log
