"""The training stages of the Deadlines table (docs/architecture.md) stalled for real: a
trainer step that hangs ends the run with ``TrainerStepStalledError``, and the local
policy's weight sync waits end with ``WeightSyncTimeoutError``, each within twice its
deadline. Each test prints the time from the stall's start to the named error
(``pytest -s`` shows the figures); the suite asserts the error, not the timing.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")
pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

from cli_support import invoke
from osmosis_ai.deadlines import TRAIN_STEP, WEIGHT_SYNC
from osmosis_ai.train import engine
from osmosis_ai.train.demo import setup_workspace
from osmosis_ai.train.tiny_model import build_tiny_model

# 10 rows x 2 epochs / 2 prompts = 10 steps; no warm-up, no validation: only GRPO steps
CONFIG = """
[experiment]
rollout = "copy-digit"
entrypoint = "main.py"
model_path = "local:models/tiny"
dataset = "copy-digit"

[training]
lr = 3e-4
total_epochs = 2
n_samples_per_prompt = 2
rollout_batch_size = 2
max_prompt_length = 64
max_response_length = 4
agent_workflow_timeout_s = 60
grader_timeout_s = 30
no_signal_patience = 0
seed = 0

[checkpoints]
eval_interval = 0
checkpoint_save_freq = 0
"""


def report(stage: str, deadline_s: float, elapsed_s: float) -> None:
    print(f"\n[deadline] {stage}: deadline {deadline_s:g}s, named error after {elapsed_s:.2f}s")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("deadline-model") / "tiny")


@pytest.fixture
def workspace(tmp_path: Path, model_dir: Path) -> Path:
    setup_workspace(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(model_dir)
    (tmp_path / "configs" / "training" / "short.toml").write_text(CONFIG)
    return tmp_path


class HangingStep:
    """A TRL callback whose step ``at`` never reaches its optimizer step: it blocks as a
    deadlock would, until released."""

    def __init__(self, at: int) -> None:
        from transformers import TrainerCallback

        self.at = at
        self.begun: float | None = None  # wall clock, as logs.txt stamps its lines
        self.release = threading.Event()
        hang = self

        class Callback(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                if int(state.global_step) + 1 == hang.at and hang.begun is None:
                    hang.begun = time.time()

            def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kw: Any):
                if int(state.global_step) + 1 == hang.at:
                    hang.release.wait()

        self.callback = Callback()


def test_a_trainer_step_that_hangs_ends_the_run_with_trainer_step_stalled(
    workspace: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    deadline = 4.0
    monkeypatch.setenv(TRAIN_STEP.setting, str(deadline))
    hang = HangingStep(at=2)
    build = engine.build_trainer

    def build_with_hang(*args: Any, **kwargs: Any) -> Any:
        trainer = build(*args, **kwargs)
        trainer.add_callback(hang.callback)
        return trainer

    monkeypatch.setattr(engine, "build_trainer", build_with_hang)
    config = str(workspace / "configs" / "training" / "short.toml")
    started = time.monotonic()
    try:
        outcome = invoke(
            capsys, "--json", "train", "run", config, "--name", "hung", "--threads", "1"
        )
    finally:
        hang.release.set()  # the abandoned training thread may end now
    elapsed = time.monotonic() - started
    assert outcome.code == 1, (outcome.out, outcome.err)
    error = outcome.error()["error"]
    assert error["details"]["error_type"] == "TrainerStepStalledError", error
    assert error["details"]["stage"] == "trainer step"
    assert error["details"]["deadline_s"] == deadline
    assert error["details"]["setting"] == TRAIN_STEP.setting
    assert "training step 2 computed for" in error["message"]
    assert f"the trainer step deadline is {deadline:g}s" in error["message"]
    run_dir = workspace / ".osmosis" / "training" / "hung"
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "failed" and manifest["steps_done"] == 1
    assert "training step 2 computed for" in manifest["error"]
    logs = (run_dir / "logs.txt").read_text()
    failed = _logged_at(logs, "training failed: TrainerStepStalledError")
    assert hang.begun is not None
    report("trainer step (a step that hangs)", deadline, failed - hang.begun)
    print(f"[deadline] whole train run, start-up and teardown included: {elapsed:.2f}s")


def test_the_step_watch_does_not_count_the_wait_for_rollouts():
    from osmosis_ai.train.step_watch import StepWatch

    watch = StepWatch(0.2)
    assert watch.overdue() is None  # between steps nothing is timed
    watch.begin(1)
    with watch.paused():
        time.sleep(0.3)  # the rollouts' wait: not the step's own computation
    assert watch.overdue() is None
    time.sleep(0.25)
    error = watch.overdue()
    assert error is not None and "training step 1 computed for" in str(error)
    assert (error.stage, error.deadline_s, error.setting) == (
        "trainer step",
        0.2,
        TRAIN_STEP.setting,
    )
    watch.end()
    assert watch.overdue() is None


# -- weight sync: the local policy --------------------------------------------------------

USER = [{"role": "user", "content": "Copy: 7"}]


def test_a_hold_the_trainer_never_releases_fails_the_held_model_calls_with_weight_sync_timeout(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    from osmosis_ai.controller.errors import WeightSyncTimeoutError
    from osmosis_ai.controller.policy import LocalPolicy

    deadline = 1.0
    monkeypatch.setenv(WEIGHT_SYNC.setting, str(deadline))
    policy = LocalPolicy(model_dir, seed=0)
    body = {"messages": USER, "temperature": 0, "max_tokens": 2}
    replies: list[tuple[Any, BaseException | None, float]] = []
    done = threading.Event()

    def reply(answer: Any, error: BaseException | None) -> None:
        replies.append((answer, error, time.monotonic()))
        done.set()

    policy.hold(True)  # the next step's model calls wait for a trainer that never asks
    held = time.monotonic()
    policy.submit_chat(dict(body), reply)
    assert done.wait(30)
    ((answer, error, when),) = replies
    report("weight sync (a hold never released)", deadline, when - held)
    assert answer is None and isinstance(error, WeightSyncTimeoutError)
    assert (error.stage, error.deadline_s, error.setting) == (
        "weight sync",
        1.0,
        WEIGHT_SYNC.setting,
    )
    assert "did not ask for that step in time" in str(error)
    with pytest.raises(WeightSyncTimeoutError):  # a call during the overdue hold fails at once
        policy.chat(dict(body))
    policy.hold(False)  # the trainer comes back: calls are served again
    assert policy.chat(dict(body))["choices"][0]["token_ids"]


def test_a_generation_batch_that_keeps_the_model_fails_the_update_with_weight_sync_timeout(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    from osmosis_ai.controller.errors import WeightSyncTimeoutError
    from osmosis_ai.controller.policy import LocalPolicy

    deadline = 0.5
    monkeypatch.setenv(WEIGHT_SYNC.setting, str(deadline))
    policy = LocalPolicy(model_dir, seed=0)
    generating = threading.Event()
    release = threading.Event()

    def stuck(module: Any, args: Any) -> None:  # a forward pass that does not end (a hung kernel)
        generating.set()
        release.wait()

    hook = policy.model.register_forward_pre_hook(stuck)
    caller = threading.Thread(target=policy.chat, args=({"messages": USER, "max_tokens": 2},))
    caller.start()
    try:
        assert generating.wait(30)
        started = time.monotonic()
        with pytest.raises(WeightSyncTimeoutError) as caught, policy.updating(1):
            pass
        report(
            "weight sync (the optimizer waits on a generation batch)",
            deadline,
            time.monotonic() - started,
        )
    finally:
        release.set()
        caller.join(30)
        hook.remove()
    assert "could not be updated" in str(caught.value) and policy.version == 0
    with policy.updating(1):  # the batch ended: the update goes through
        pass
    assert policy.version == 1


def _logged_at(logs: str, message: str) -> float:
    for line in logs.splitlines():
        if message in line:
            stamp = line.split(" ", 1)[0]
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    raise AssertionError(f"{message!r} not in logs.txt:\n{logs}")
