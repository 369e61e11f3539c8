"""LocalBackend: phases, deadlines, grader rules, concurrency, status and cancel."""

from __future__ import annotations

import asyncio
import time

import pytest

import osmosis_ai.rollout.backend.local as local_backend
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowOutput,
    ConcurrencyConfig,
    ExecutionRequest,
    ExecutionResult,
    Grader,
    GraderConfig,
    LocalBackend,
    RolloutContext,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
    SampleSource,
    get_rollout_context,
)

ANSWER = [{"role": "assistant", "content": "42"}]


class EchoWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx):
        return [*ctx.prompt, *ANSWER]


class ExactGrader(Grader):
    async def grade(self, ctx):
        assert ctx.sample is not None
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


class SleepyWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    started: list[str] = []

    async def run(self, ctx):
        SleepyWorkflow.started.append(ctx.metadata["id"])
        await asyncio.sleep(ctx.metadata.get("sleep", 0.2))
        return ANSWER


async def until(condition, what: str) -> None:
    """Wait for ``condition()`` on this loop; fail naming ``what`` if it never holds."""
    try:
        async with asyncio.timeout(10):  # a guard against a hang; it holds within a few turns
            while not condition():  # noqa: ASYNC110 - the backend's counters have no event
                await asyncio.sleep(0.001)
    except TimeoutError:
        pytest.fail(f"never happened: {what}")


def req(rid: str = "r1", **kw) -> ExecutionRequest:
    kw.setdefault("prompt", [{"role": "user", "content": "q"}])
    kw.setdefault("label", "42")
    return ExecutionRequest(id=rid, **kw)


async def test_success_path_reports_both_phases(artifact_root):
    backend = LocalBackend(workflow=EchoWorkflow, grader=ExactGrader)
    seen: list[tuple[str, ExecutionResult]] = []

    async def on_wf(r):
        seen.append(("wf", r))

    async def on_gr(r):
        seen.append(("gr", r))

    outcome = await backend.execute(req(), on_wf, on_gr)
    assert [s[0] for s in seen] == ["wf", "gr"]
    assert outcome.result.status is RolloutStatus.SUCCESS
    assert outcome.result.sample is not None and outcome.result.sample.reward == 1.0
    assert outcome.workflow.sample is not None and outcome.workflow.sample.reward is None
    assert outcome.result.sample.label == "42"
    assert backend.rollout_status("r1") == {"status": "success", "reward": 1.0, "err_message": None}
    assert not (artifact_root / "r1").exists()  # nobody asked for the artifacts folder


async def test_artifacts_dir_is_made_on_first_read_and_shared_with_the_grader(artifact_root):
    seen: list[object] = []

    class Writes(AgentWorkflow[AgentWorkflowConfig]):
        async def run(self, ctx):
            assert not (artifact_root / "r1").exists()  # not made before it is read
            folder = ctx.artifacts_dir
            seen.append(folder)
            (folder / "notes.txt").write_text("from the workflow")
            return ANSWER

    class Reads(Grader):
        async def grade(self, ctx):
            seen.append(ctx.artifacts_dir)
            ctx.set_reward(float((ctx.artifacts_dir / "notes.txt").read_text() != ""))

    outcome = await LocalBackend(workflow=Writes, grader=Reads).execute(req())
    assert outcome.result.status is RolloutStatus.SUCCESS
    folder = artifact_root / "r1" / "artifacts"
    assert seen == [folder, folder]
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"]  # the probe is gone


async def test_strings_resolve_and_config_is_deep_copied_per_rollout(artifact_root):
    class Mutating(AgentWorkflow[AgentWorkflowConfig]):
        async def run(self, ctx):
            assert ctx.config is not self.config or ctx.config is not CONFIG
            ctx.config.seen.append(1)
            return AgentWorkflowOutput(messages=ANSWER, metrics={"n": len(ctx.config.seen)})

    globals()["Mutating"] = Mutating
    backend = LocalBackend(workflow=f"{__name__}:Mutating", workflow_config=f"{__name__}:CONFIG")
    for i in range(3):
        outcome = await backend.execute(req(f"r{i}", grade=False))
        assert outcome.result.sample is not None
        assert outcome.result.sample.metrics == {"n": 1}
    assert CONFIG.seen == []  # type: ignore[attr-defined]


CONFIG = AgentWorkflowConfig(name="cfg", seen=[])


def test_bad_constructor_arguments_fail_clearly():
    with pytest.raises(TypeError, match="AgentWorkflow subclass"):
        LocalBackend(workflow=ExactGrader)  # type: ignore[arg-type]
    with pytest.raises(ImportError, match="no attribute"):
        LocalBackend(workflow=f"{__name__}:Nope")
    with pytest.raises(ValueError, match="max_concurrent"):
        LocalBackend(workflow=EchoWorkflow, max_concurrent=0)
    with pytest.raises(TypeError):
        LocalBackend(EchoWorkflow)  # type: ignore[misc]  # keyword-only


def test_default_concurrency_is_one_documented_number():
    assert LocalBackend(workflow=EchoWorkflow).max_concurrent == LocalBackend.DEFAULT_MAX_CONCURRENT
    configured = AgentWorkflowConfig(name="x")
    assert LocalBackend(workflow=EchoWorkflow, workflow_config=configured).max_concurrent == 64
    limited = AgentWorkflowConfig(name="x", concurrency=ConcurrencyConfig(max_concurrent=3))
    assert LocalBackend(workflow=EchoWorkflow, workflow_config=limited).max_concurrent == 3
    assert LocalBackend(workflow=EchoWorkflow, max_concurrent=None).max_concurrent is None
    health = LocalBackend(workflow=EchoWorkflow, max_concurrent=5).health()
    assert health == {
        "status": "ok",
        "concurrency": {"max_concurrent": 5, "queued": 0, "running": 0},
    }


async def test_concurrency_limit_and_queue_time_counts_against_deadline(artifact_root):
    release = asyncio.Event()

    class Gated(AgentWorkflow[AgentWorkflowConfig]):
        async def run(self, ctx):
            await release.wait()
            return ANSWER

    backend = LocalBackend(workflow=Gated, max_concurrent=1)
    first = asyncio.create_task(backend.execute(req("a", grade=False)))
    await until(lambda: backend.health()["concurrency"]["running"] == 1, "a runs")
    second = asyncio.create_task(backend.execute(req("b", grade=False, agent_timeout_sec=0.05)))
    await until(lambda: backend.health()["concurrency"]["queued"] == 1, "b queues")
    assert backend.health()["concurrency"] == {"max_concurrent": 1, "queued": 1, "running": 1}
    assert backend.rollout_status("b")["status"] == "queued"  # type: ignore[index]
    await asyncio.sleep(0.06)  # b's whole budget goes by in the queue
    release.set()
    out_b = await second
    assert out_b.result.status is RolloutStatus.FAILURE
    assert out_b.result.err_category is RolloutErrorCategory.TIMEOUT
    assert "spent queued" in (out_b.result.err_message or "")
    assert (await first).result.status is RolloutStatus.SUCCESS


async def test_workflow_deadline_and_blocking_code(artifact_root):
    class Blocking(AgentWorkflow[AgentWorkflowConfig]):
        async def run(self, ctx):
            time.sleep(0.15)  # noqa: ASYNC251 - blocks the loop: the deadline cannot interrupt it
            return ANSWER

    backend = LocalBackend(workflow=SleepyWorkflow)
    out = await backend.execute(req(metadata={"id": "x", "sleep": 5}, agent_timeout_sec=0.1))
    assert out.result.err_message == "workflow exceeded its 0.1s deadline"
    assert out.grader is None
    blocking = LocalBackend(workflow=Blocking)
    out = await blocking.execute(req(agent_timeout_sec=0.05))
    assert out.result.err_category is RolloutErrorCategory.TIMEOUT
    expired = await backend.execute(req("z", metadata={"id": "z"}, agent_timeout_sec=0))
    assert expired.result.err_category is RolloutErrorCategory.TIMEOUT


async def test_grader_deadline_is_independent(artifact_root):
    class SlowGrader(Grader):
        async def grade(self, ctx):
            await asyncio.sleep(1)

    backend = LocalBackend(workflow=EchoWorkflow, grader=SlowGrader)
    out = await backend.execute(req(agent_timeout_sec=30, grader_timeout_sec=0.1))
    assert out.workflow.status is RolloutStatus.SUCCESS
    assert out.result.err_message == "grader exceeded its 0.1s deadline"
    assert out.result.err_category is RolloutErrorCategory.TIMEOUT


@pytest.mark.parametrize(
    ("grader", "label", "metadata", "message"),
    [
        (None, "42", None, "no grader is configured"),
        (ExactGrader, None, None, "neither a label nor metadata"),
    ],
)
async def test_grader_rules(artifact_root, grader, label, metadata, message):
    backend = LocalBackend(workflow=EchoWorkflow, grader=grader)
    out = await backend.execute(req(label=label, metadata=metadata))
    assert out.result.status is RolloutStatus.FAILURE
    assert message in (out.result.err_message or "")


async def test_grader_without_reward_and_grader_exceptions(artifact_root):
    class Lazy(Grader):
        async def grade(self, ctx):
            return 1.0  # returning is not setting

    class Broken(Grader):
        async def grade(self, ctx):
            raise KeyError("label")

    class Remover(Grader):
        async def grade(self, ctx):
            ctx.sample.remove_sample = True

    out = await LocalBackend(workflow=EchoWorkflow, grader=Lazy).execute(req())
    assert "no reward after grading" in (out.result.err_message or "")
    out = await LocalBackend(workflow=EchoWorkflow, grader=Broken).execute(req())
    assert out.result.err_category is RolloutErrorCategory.AGENT_ERROR
    assert out.result.err_message == "'label'"
    out = await LocalBackend(workflow=EchoWorkflow, grader=Remover).execute(req())
    assert out.result.status is RolloutStatus.SUCCESS
    assert out.result.sample is not None and out.result.sample.remove_sample


async def test_workflow_errors_are_categorised(artifact_root):
    class Raises(AgentWorkflow[AgentWorkflowConfig]):
        async def run(self, ctx):
            raise ctx.metadata["exc"]

    class ReturnsJunk(AgentWorkflow[AgentWorkflowConfig]):
        async def run(self, ctx):
            return "not messages"

    backend = LocalBackend(workflow=Raises, grader=ExactGrader)
    for exc, category in [
        (ValueError("bad"), RolloutErrorCategory.VALIDATION_ERROR),
        (RuntimeError("boom"), RolloutErrorCategory.AGENT_ERROR),
        (TimeoutError(), RolloutErrorCategory.TIMEOUT),
    ]:
        out = await backend.execute(req(metadata={"exc": exc}))
        assert out.result.status is RolloutStatus.FAILURE
        assert out.result.err_category is category
        assert out.grader is None
    out = await LocalBackend(workflow=ReturnsJunk).execute(req())
    assert out.result.err_category is RolloutErrorCategory.VALIDATION_ERROR


async def test_sample_source_fallback_and_context(artifact_root):
    class Source(SampleSource):
        async def get_sample(self):
            return RolloutSample(messages=ANSWER)

    class UsesSource(AgentWorkflow[AgentWorkflowConfig]):
        async def run(self, ctx):
            rctx = get_rollout_context()
            assert rctx is not None and rctx.rollout_id == "src"
            rctx.set_sample_source(Source())
            return

    out = await LocalBackend(workflow=UsesSource, grader=ExactGrader).execute(req("src"))
    assert out.result.sample is not None and out.result.sample.reward == 1.0
    # Inside an ambient context the backend uses it rather than making its own.
    with RolloutContext(chat_completions_url="http://m/v1", rollout_id="src") as rctx:
        await LocalBackend(workflow=UsesSource).execute(req("src", grade=False))
        assert rctx.sample_source is not None


async def test_cancel_queued_and_running(artifact_root):
    backend = LocalBackend(workflow=SleepyWorkflow, max_concurrent=1)
    running = asyncio.create_task(backend.execute(req("run", metadata={"id": "run", "sleep": 5})))
    queued = asyncio.create_task(backend.execute(req("q", metadata={"id": "q"})))
    await until(lambda: backend.health()["concurrency"]["queued"] == 1, "q queues behind run")
    assert backend.cancel_rollouts(ids=["q", "run", "nope"]) == {
        "q": "cancelled_queued",
        "run": "cancelled_running",
        "nope": "not_found",
    }
    for task in (running, queued):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert backend.rollout_status("q")["status"] == "cancelled"  # type: ignore[index]
    assert backend.cancel_rollouts(ids=["q"]) == {"q": "cancelled_queued"}  # idempotent
    assert backend.cancel_rollouts(all=True) == {}
    assert backend.health()["concurrency"] == {"max_concurrent": 1, "queued": 0, "running": 0}


async def test_cancel_by_prefix(artifact_root):
    backend = LocalBackend(workflow=SleepyWorkflow)
    tasks = [
        asyncio.create_task(backend.execute(req(f"{p}-{i}", metadata={"id": "p", "sleep": 5})))
        for p in ("a", "b")
        for i in range(2)
    ]
    await until(lambda: backend.health()["concurrency"]["running"] == 4, "all four run")
    assert set(backend.cancel_rollouts(prefix="a-")) == {"a-0", "a-1"}
    assert set(backend.cancel_rollouts(all=True).values()) == {"cancelled_running"}
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_unusable_artifact_root_gives_none(tmp_path, monkeypatch):
    waits: list[float] = []
    monkeypatch.setattr(local_backend.time, "sleep", waits.append)
    blocker = tmp_path / "file"
    blocker.write_text("x")

    class Check(AgentWorkflow[AgentWorkflowConfig]):
        async def run(self, ctx):
            assert ctx.artifacts_dir is None
            return ANSWER

    backend = LocalBackend(workflow=Check, artifact_root=blocker)
    out = await backend.execute(req(grade=False))
    assert out.result.status is RolloutStatus.SUCCESS
    assert waits == [0.05, 0.1]  # three attempts, short waits on the loop


async def test_grader_concurrency_limit(artifact_root):
    active = 0
    peak = 0

    class Counting(Grader):
        async def grade(self, ctx):
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.02)
            active -= 1
            ctx.set_reward(1.0)

    backend = LocalBackend(
        workflow=EchoWorkflow,
        grader=Counting,
        grader_config=GraderConfig(name="g", concurrency=ConcurrencyConfig(max_concurrent=2)),
    )
    await asyncio.gather(*(backend.execute(req(f"g{i}")) for i in range(6)))
    assert peak == 2


# -- the grader callback contract: asked for once, answered once --------------------------


class Raises(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx):
        raise RuntimeError("the agent fell over")


class NeverEnds(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx):
        await asyncio.Event().wait()


class ReturnsNumber(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx):
        return 42


class Recorder:
    """Both callbacks of one ``execute`` call, in the order they came."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ExecutionResult]] = []

    async def workflow(self, result: ExecutionResult) -> None:
        self.calls.append(("workflow", result))

    async def grader(self, result: ExecutionResult) -> None:
        self.calls.append(("grader", result))

    def only(self, phase: str) -> ExecutionResult:
        results = [r for p, r in self.calls if p == phase]
        assert len(results) == 1, f"{phase} callback came {len(results)} times"
        return results[0]


@pytest.mark.parametrize(
    ("workflow", "agent_timeout", "category", "message"),
    [
        (Raises, None, RolloutErrorCategory.AGENT_ERROR, "the agent fell over"),
        (NeverEnds, 0.05, RolloutErrorCategory.TIMEOUT, "workflow exceeded its 0.05s deadline"),
        (ReturnsNumber, None, RolloutErrorCategory.VALIDATION_ERROR, "int"),
    ],
    ids=["raises", "times-out", "invalid-output"],
)
async def test_failed_workflow_still_answers_the_grader_callback(
    artifact_root, workflow, agent_timeout, category, message
):
    graded: list[str] = []

    class Counting(Grader):
        async def grade(self, ctx):
            graded.append(ctx.label)
            ctx.set_reward(1.0)

    calls = Recorder()
    backend = LocalBackend(workflow=workflow, grader=Counting)
    outcome = await backend.execute(
        req("wf-fails", agent_timeout_sec=agent_timeout), calls.workflow, calls.grader
    )
    assert [phase for phase, _ in calls.calls] == ["workflow", "grader"]
    done = calls.only("workflow")
    assert done.status is RolloutStatus.FAILURE and done.err_category is category
    assert message in (done.err_message or "")
    answer = calls.only("grader")
    assert answer.status is RolloutStatus.FAILURE
    assert answer.sample is None
    assert (answer.err_message, answer.err_category) == (done.err_message, done.err_category)
    assert graded == []  # the grader never ran on a failed workflow
    assert outcome.grader is None  # no grading phase: the outcome is the workflow's
    assert outcome.result.status is RolloutStatus.FAILURE
    assert backend.rollout_status("wf-fails")["status"] == "failure"  # type: ignore[index]


async def test_successful_workflow_gets_the_graders_result_through_the_callback(artifact_root):
    calls = Recorder()
    backend = LocalBackend(workflow=EchoWorkflow, grader=ExactGrader)
    outcome = await backend.execute(req("ok"), calls.workflow, calls.grader)
    assert [phase for phase, _ in calls.calls] == ["workflow", "grader"]
    assert calls.only("workflow").status is RolloutStatus.SUCCESS
    answer = calls.only("grader")
    assert answer.status is RolloutStatus.SUCCESS
    assert answer.sample is not None and answer.sample.reward == 1.0
    assert answer is outcome.grader


async def test_no_grader_callback_asked_for_means_none_is_called(artifact_root):
    calls = Recorder()
    for workflow in (EchoWorkflow, Raises):
        await LocalBackend(workflow=workflow, grader=ExactGrader).execute(
            req(f"no-grade-{workflow.__name__}", grade=False), calls.workflow
        )
    assert [phase for phase, _ in calls.calls] == ["workflow", "workflow"]


async def test_no_grader_configured_still_answers_the_grader_callback(artifact_root):
    calls = Recorder()
    await LocalBackend(workflow=EchoWorkflow).execute(req("bare"), calls.workflow, calls.grader)
    answer = calls.only("grader")
    assert answer.status is RolloutStatus.FAILURE and answer.sample is None
    assert "no grader is configured" in (answer.err_message or "")


async def test_grader_callback_with_grading_switched_off_is_refused(artifact_root):
    calls = Recorder()
    backend = LocalBackend(workflow=EchoWorkflow, grader=ExactGrader)
    with pytest.raises(ValueError, match="grade=False"):
        await backend.execute(req("contradiction", grade=False), calls.workflow, calls.grader)
    assert calls.calls == []
    assert backend.rollout_status("contradiction") is None


async def test_status_and_health_bodies_keep_their_wire_bytes(artifact_root):
    """The typed reports serialize to the bytes the plain dicts did (keys in this order)."""
    import json

    class WholeGrader(Grader):
        async def grade(self, ctx):
            ctx.set_reward(1)

    backend = LocalBackend(workflow=EchoWorkflow, grader=WholeGrader, max_concurrent=2)
    await backend.execute(req("whole"))
    assert json.dumps(backend.rollout_status("whole"), separators=(",", ":")) == (
        '{"status":"success","reward":1.0,"err_message":null}'
    )
    assert json.dumps(backend.health(), separators=(",", ":")) == (
        '{"status":"ok","concurrency":{"max_concurrent":2,"queued":0,"running":0}}'
    )
