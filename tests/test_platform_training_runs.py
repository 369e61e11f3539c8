"""Managed training runs end to end: a run submitted to the platform (the copy-digit template
in a real Git repository, the tiny model registered as a base model, the dataset in the
object store) is trained by the worker job through ``run_training``; its metrics, checkpoints
(as trained models), downloads, stop, resume after a lost attempt, and the ``train``
commands are checked against the real server and a real SQLite database.

The job is driven here the way a worker drives it: a claim through ``services.work``, a
``RunReporter`` fenced by that claim, a checkout of the repository at the run's commit.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from cli_support import invoke
from osmosis_ai.platform.api.objects import object_store
from osmosis_ai.platform.services import work
from osmosis_ai.platform.services.models import register_base_model
from osmosis_ai.platform.services.runs import finish
from osmosis_ai.platform.store.orm import Dataset, Model, Run, RunLog, utcnow
from osmosis_ai.platform.worker.job import JobContext
from osmosis_ai.platform.worker.report import RunReporter
from osmosis_ai.testing.serving import ServerThread, free_port
from platform_support import Harness, git

REPO = "acme/copy"
ORIGIN_URL = "git@github.com:Acme/Copy.git"
LEARNING_WINDOW = 10
LEARNING_MARGIN = 0.15


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("torch", reason="needs the 'train' extra")
    pytest.importorskip("trl", reason="needs the 'train' extra")
    from osmosis_ai.train.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("platform-model") / "tiny")


class Platform:
    """A served platform with one workspace (``acme/copy``), the tiny base model and the
    copy-digit dataset; a CLI workspace directory cloned from the repository."""

    def __init__(self, root: Path, model_dir: Path) -> None:
        from osmosis_ai.train.demo import setup_workspace

        self.root = root
        self.origin = root / "origin"
        setup_workspace(self.origin)
        git(self.origin, "init", "-q", "-b", "main")
        git(self.origin, "add", "-A")
        git(self.origin, "commit", "-q", "-m", "copy-digit")
        port = free_port()
        self.harness = Harness(
            root / "data", f"sqlite:///{root / 'platform.db'}", f"http://127.0.0.1:{port}"
        )
        self.server = ServerThread(self.harness.app, port=port).start()
        self.url = f"http://127.0.0.1:{port}"
        self.database = self.harness.platform.database
        self.objects = object_store(self.harness.platform)
        self.workspace_id = self.harness.workspace("Copy", repo=REPO, clone_url=str(self.origin))
        self.alice = self.harness.account("alice@example.com", workspace="Copy", role="owner")
        rows = (self.origin / "data" / "copy-digit.jsonl").read_bytes()
        with self.database.transaction() as session:
            register_base_model(session, "tiny", model_dir)
            dataset = Dataset(
                workspace_id=self.workspace_id,
                file_name="copy-digit",
                extension="jsonl",
                file_size=len(rows),
                status="uploaded",
                row_count=rows.count(b"\n"),
            )
            session.add(dataset)
            session.flush()
            dataset.object_key = f"datasets/{self.workspace_id}/{dataset.id}/copy-digit.jsonl"
            key = dataset.object_key
        self.objects.put(key, rows)
        self.cli_dir = root / "cli"
        git(root, "clone", "-q", str(self.origin), str(self.cli_dir))
        git(self.cli_dir, "remote", "set-url", "origin", ORIGIN_URL)
        self.machines = 0

    def client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self.url, headers=self.alice.headers(REPO), timeout=60, follow_redirects=True
        )

    def submit(self, training: dict, checkpoints: dict, advanced: dict) -> dict:
        body = {
            "experiment_config": {
                "rollout": "copy-digit",
                "entrypoint": "main.py",
                "model_path": "tiny",
                "dataset": "copy-digit",
            },
            "training_config": training,
            "checkpoints_config": checkpoints,
            "advanced_config": advanced,
        }
        with self.client() as client:
            answer = client.post("/api/cli/training-runs", json=body)
        assert answer.status_code == 201, answer.text
        return answer.json()

    def claim(self, worker: str, *, later_s: float = 0.0) -> work.Claim:
        from datetime import timedelta

        now = utcnow() + timedelta(seconds=later_s)
        with self.database.transaction() as session:
            worker_id = work.register_worker(
                session, name=worker, slots=1, wake_address=None, now=now
            ).id
            claim = work.claim_run(session, worker_id, now=now)
        assert claim is not None
        self.worker_ids[claim.attempt] = worker_id
        return claim

    worker_ids: dict[int, str]

    def context(self, claim: work.Claim, *, machine: str | None = None) -> JobContext:
        """A job context on ``machine`` (a new one by default): its own work dir and checkout."""
        self.machines += 1
        home = self.root / "machines" / (machine or f"m{self.machines}")
        with self.database.read() as session:
            run = session.get(Run, claim.run_id)
            assert run is not None
            session.expunge(run)
        checkout = home / "checkout"
        if not checkout.exists():
            git(self.root, "clone", "-q", str(self.origin), str(checkout))
            git(checkout, "checkout", "-q", run.commit_sha)
        reporter = RunReporter(
            self.database,
            self.objects,
            run_id=claim.run_id,
            worker_id=self.worker_ids[claim.attempt],
            attempt=claim.attempt,
        )
        return JobContext(
            settings=self.harness.settings,
            run=run,
            attempt=claim.attempt,
            resumed=claim.resumed,
            checkout=checkout,
            work_dir=home / "work" / "runs" / claim.run_id,
            environ=dict(os.environ),
            secret_values=(),
            reporter=reporter,
        )

    def run_row(self, run_id: str) -> Run:
        with self.database.read() as session:
            run = session.get(Run, run_id)
            assert run is not None
            session.expunge(run)
            return run

    def logs(self, run_id: str) -> list[str]:
        with self.database.read() as session:
            return list(
                session.scalars(
                    select(RunLog.message).where(RunLog.run_id == run_id).order_by(RunLog.id)
                )
            )

    def close(self) -> None:
        self.server.stop()
        self.harness.close()


def make_platform(root: Path, model_dir: Path) -> Platform:
    platform = Platform(root, model_dir)
    platform.worker_ids = {}
    return platform


@pytest.fixture
def platform(tmp_path: Path, tiny_model: Path):
    made = make_platform(tmp_path, tiny_model)
    yield made
    made.close()


@pytest.fixture
def cli(platform: Platform, tmp_path: Path, monkeypatch):
    """The CLI inside the platform's workspace directory, logged in as alice."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in list(os.environ):
        if name.startswith("OSMOSIS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OSMOSIS_TOKEN_STORE", "file")
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", platform.url)
    monkeypatch.setenv("OSMOSIS_TOKEN", platform.alice.token)
    monkeypatch.setenv("OSMOSIS_TOKEN_PLATFORM_URL", platform.url)
    monkeypatch.chdir(platform.cli_dir)
    return platform


# The tiny model's learning run of tests/test_train_smoke.py (same data, shape and steps),
# with the trainer's own settings under [advanced] as a config for both CLIs carries them.
LEARNING_TRAINING = {
    "lr": 1e-3,
    "total_epochs": 32,
    "n_samples_per_prompt": 8,
    "rollout_batch_size": 8,
    "max_prompt_length": 64,
    "max_response_length": 4,
    "agent_workflow_timeout_s": 60,
    "grader_timeout_s": 30,
}
LEARNING_ADVANCED = {
    "loss_type": "dapo",
    "kl_coef": 0.0,
    "seed": 0,
    "warmup": {"sft_steps": 100, "lr": 1e-3, "batch_size": 8},  # as test_train_smoke's
}
SHORT_TRAINING = {
    "lr": 3e-4,
    "total_epochs": 2,
    "n_samples_per_prompt": 4,
    "rollout_batch_size": 4,
    "max_prompt_length": 64,
    "max_response_length": 4,
    "agent_workflow_timeout_s": 60,
    "grader_timeout_s": 30,
}
# (a few steps of a barely warmed-up policy may lack a signal by chance: not what is tested)
SHORT_ADVANCED = {"seed": 0, "no_signal_patience": 0, "warmup": {"sft_steps": 5, "batch_size": 8}}


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.timeout(900)  # 100 warm-up and 40 GRPO steps: about 2 min on 2 busy cores
def test_a_training_run_learns_and_its_results_reach_the_platform_and_the_cli(
    cli: Platform, capsys, tmp_path: Path
):
    platform = cli
    submitted = platform.submit(
        LEARNING_TRAINING, {"eval_interval": 40, "checkpoint_save_freq": 20}, LEARNING_ADVANCED
    )
    claim = platform.claim("w1")
    ctx = platform.context(claim)
    from osmosis_ai.platform.worker.train_job import execute

    execute(ctx)

    run = platform.run_row(claim.run_id)
    assert run.status == "finished", platform.logs(claim.run_id)
    assert (run.current_step, run.total_steps, run.examples_processed_count) == (40, 40, 320)
    assert run.lease_expires_at is None and run.reward is not None

    with platform.client() as client:
        metrics = client.get(f"/api/cli/training-runs/{run.id}/metrics").json()
        assert metrics["status"] == "finished"
        series = {m["metric_key"]: m for m in metrics["metrics"]}
        rewards = [p["value"] for p in series["rollout/raw_reward"]["data_points"]]
        assert [p["step"] for p in series["rollout/raw_reward"]["data_points"]] == list(
            range(1, 41)
        )
        assert all(isinstance(r, float) and math.isfinite(r) for r in rewards)
        first, last = mean(rewards[:LEARNING_WINDOW]), mean(rewards[-LEARNING_WINDOW:])
        print(f"stored training reward: first {first:.3f}, last {last:.3f}")
        assert last >= first + LEARNING_MARGIN, f"no learning: {first:.3f} -> {last:.3f}"
        assert series["rollout/raw_reward"]["title"] == "Training Reward"
        assert [p["step"] for p in series["eval/validation/reward"]["data_points"]] == [0, 40]
        overview = metrics["overview"]
        assert overview["latest_step"] == 40 and overview["total_steps"] == 40
        assert overview["examples_processed_count"] == 320
        summary = {s["key"]: s for s in overview["metric_summaries"]}["rollout/raw_reward"]
        assert summary["initial"] == rewards[0] and summary["latest"] == rewards[-1]

        listed = client.get(f"/api/cli/training-runs/{run.name}/checkpoints").json()
        assert listed["training_run_name"] == run.name
        assert [c["checkpoint_step"] for c in listed["checkpoints"]] == [20, 40]
        assert [c["checkpoint_name"] for c in listed["checkpoints"]] == [
            f"{run.name}-step-20",
            f"{run.name}-step-40",
        ]
        assert listed["checkpoints"][1]["reward"] == pytest.approx(rewards[39])

        link = client.get(f"/api/cli/training-runs/{run.name}/checkpoints/40/download").json()
        assert link["checkpoint_step"] == 40
        paths = {f["path"] for f in link["files"]}
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= paths
        missing = client.get(f"/api/cli/training-runs/{run.name}/checkpoints/7/download")
        assert missing.status_code == 404 and "saved steps: 20, 40" in missing.json()["message"]

    with platform.database.read() as session:
        models = session.scalars(
            select(Model).where(Model.training_run_id == run.id).order_by(Model.checkpoint_step)
        ).all()
        assert [(m.kind, m.name, m.checkpoint_step) for m in models] == [
            ("lora", f"{run.name}-step-20", 20),
            ("lora", f"{run.name}-step-40", 40),
        ]
        assert models[1].path == f"runs/{run.id}/checkpoints/step-40"
        assert models[1].workspace_id == platform.workspace_id and models[1].base_model

    # the CLI: list, info with its metrics export, logs, and a loadable checkpoint download
    listed_cli = invoke(capsys, "--json", "train", "list")
    assert listed_cli.code == 0, listed_cli.err
    assert [(r["name"], r["status"], r["current_step"]) for r in listed_cli.json()["items"]] == [
        (submitted["name"], "finished", 40)
    ]
    export_path = tmp_path / "export.json"
    info = invoke(capsys, "--json", "train", "info", run.name, "-o", str(export_path))
    assert info.code == 0, info.err
    data = info.json()["data"]
    assert [c["checkpoint_step"] for c in data["checkpoints"]] == [20, 40]
    export = json.loads(export_path.read_text())
    assert export == data["metrics"]
    assert set(export) == {"training_run", "summary", "metrics"}
    assert export["training_run"]["rows_processed"] == 320
    assert export["training_run"]["base_model_name"] == "tiny"
    keys = [m["key"] for m in export["metrics"]]
    assert keys[:2] == ["training_reward", "validation_reward"] and "entropy" in keys
    assert export["summary"]["training_reward"]["latest"] == rewards[-1]
    assert export["metrics"][0]["data"][0]["timestamp"].endswith("Z")

    logs = invoke(capsys, "--json", "train", "logs", run.name, "--limit", "200")
    assert logs.code == 0
    messages = [item["message"] for item in logs.json()["items"]]
    assert any(m.startswith("Saved checkpoint") for m in messages)
    assert any(m.startswith("Finished: 40 of 40 steps") for m in messages)

    target = tmp_path / "downloaded"
    got = invoke(capsys, "--json", "train", "download", run.name, "-o", str(target))
    assert got.code == 0, got.err
    assert got.json()["resource"]["checkpoint_step"] == 40

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(target, local_files_only=True)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Copy: 7"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert out.shape[1] > ids.shape[1]


def watch(
    platform: Platform, run_id: str, step: int, then, *, saved_state: bool = False
) -> threading.Thread:
    """Call ``then()`` once the run's progress reaches ``step`` (polls the database) and,
    with ``saved_state``, once its resumable state is in the object store."""

    def loop() -> None:
        while True:
            current = platform.run_row(run_id).current_step or 0
            stored = platform.objects.exists(f"runs/{run_id}/files/state.json")
            if current >= step and (stored or not saved_state):
                then()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    return thread


def test_stop_finishes_the_step_and_keeps_its_checkpoint(platform: Platform):
    platform.submit(
        SHORT_TRAINING, {"eval_interval": 100, "checkpoint_save_freq": 100}, SHORT_ADVANCED
    )
    claim = platform.claim("w1")
    ctx = platform.context(claim)

    def stop() -> None:  # what `osmosis train stop` and the worker's SIGTERM do
        with platform.database.transaction() as session:
            run = session.get(Run, claim.run_id)
            assert run is not None
            finish(run, "stopped", now=utcnow())
        ctx.stop.set()

    from osmosis_ai.platform.worker.train_job import execute

    watcher = watch(platform, claim.run_id, 2, stop)
    execute(ctx)
    watcher.join(5)
    run = platform.run_row(claim.run_id)
    assert run.status == "stopped" and run.lease_expires_at is None
    assert 2 <= (run.current_step or 0) < 5
    with platform.database.read() as session:
        models = session.scalars(select(Model).where(Model.training_run_id == run.id)).all()
        assert [m.checkpoint_step for m in models] == [run.current_step]
    with platform.client() as client:
        listed = client.get(f"/api/cli/training-runs/{run.id}/checkpoints").json()
    assert [c["checkpoint_step"] for c in listed["checkpoints"]] == [run.current_step]
    assert any(
        m.startswith(f"Stopped after step {run.current_step}; checkpoint step-{run.current_step}")
        for m in platform.logs(run.id)
    )


def test_a_lost_attempt_resumes_on_another_machine_from_the_stored_state(platform: Platform):
    from osmosis_ai.platform.worker.train_job import execute

    platform.submit(
        SHORT_TRAINING, {"eval_interval": 100, "checkpoint_save_freq": 1}, SHORT_ADVANCED
    )
    first = platform.claim("w1")
    ctx = platform.context(first)
    taken: dict[str, work.Claim] = {}

    def take_over() -> None:  # the first worker stopped heartbeating; another one claims
        taken["claim"] = platform.claim("w2", later_s=3600)

    watcher = watch(platform, first.run_id, 2, take_over, saved_state=True)
    with pytest.raises(work.LeaseLostError):
        execute(ctx)
    watcher.join(5)
    second = taken["claim"]
    assert second.resumed and second.attempt == 2
    execute(platform.context(second))  # a fresh machine: no run dir, only the object store

    run = platform.run_row(first.run_id)
    assert run.status == "finished", platform.logs(run.id)
    assert run.current_step == 5
    logs = platform.logs(run.id)
    assert any(m.startswith("Resuming from the state saved at step") for m in logs)
    with platform.client() as client:
        metrics = client.get(f"/api/cli/training-runs/{run.id}/metrics").json()
        checkpoints = client.get(f"/api/cli/training-runs/{run.id}/checkpoints").json()
    steps = [
        p["step"]
        for p in {m["metric_key"]: m for m in metrics["metrics"]}["rollout/raw_reward"][
            "data_points"
        ]
    ]
    assert steps == [1, 2, 3, 4, 5]
    assert [c["checkpoint_step"] for c in checkpoints["checkpoints"]] == [1, 2, 3, 4, 5]


def test_a_resume_whose_stored_state_is_unreadable_ends_crashed(platform: Platform):
    from osmosis_ai.platform.worker.train_job import execute

    platform.submit(
        SHORT_TRAINING, {"eval_interval": 100, "checkpoint_save_freq": 1}, SHORT_ADVANCED
    )
    first = platform.claim("w1")
    platform.objects.put(
        f"runs/{first.run_id}/files/state.json",
        json.dumps({"step": 3, "prefix": f"runs/{first.run_id}/files/state-3"}).encode(),
    )
    second = platform.claim("w2", later_s=3600)  # the first worker was lost before any step
    execute(platform.context(second))
    run = platform.run_row(first.run_id)
    assert run.status == "crashed" and run.lease_expires_at is None
    assert run.error is not None and run.error.startswith("Could not resume the run")


def test_metrics_answer_and_export_write_non_finite_values_as_null(cli: Platform, capsys):
    platform = cli
    submitted = platform.submit(SHORT_TRAINING, {"checkpoint_save_freq": 1}, {})
    with platform.client() as client:
        pending = client.get(f"/api/cli/training-runs/{submitted['id']}/metrics").json()
    assert pending["status"] == "pending" and pending["metrics"] == []
    claim = platform.claim("w1")
    reporter = platform.context(claim).reporter
    reporter.record_metrics(1, {"rollout/raw_reward": 0.25, "train/entropy_loss": float("nan")})
    reporter.record_metrics(2, {"rollout/raw_reward": float("inf"), "train/entropy_loss": 2.0})
    reporter.record_metrics(3, {"rollout/raw_reward": 0.75, "loss": -1.5})
    reporter.progress(current_step=3, total_steps=5, examples_processed=12, reward=0.75)

    with platform.client() as client:
        answer = client.get(f"/api/cli/training-runs/{submitted['name']}/metrics")
    assert answer.status_code == 200
    assert "NaN" not in answer.text and "Infinity" not in answer.text
    body = answer.json()
    assert set(body) == {"status", "overview", "metrics"}
    assert set(body["overview"]) == {
        "duration_ms",
        "metric_summaries",
        "examples_processed_count",
        "latest_step",
        "total_steps",
    }
    by_key = {m["metric_key"]: m for m in body["metrics"]}
    assert [m["metric_key"] for m in body["metrics"]] == [
        "rollout/raw_reward",
        "train/entropy_loss",
        "loss",
    ]
    assert [p["value"] for p in by_key["rollout/raw_reward"]["data_points"]] == [0.25, None, 0.75]
    assert all(isinstance(p["timestamp"], int) for p in by_key["loss"]["data_points"])
    summary = {s["key"]: s for s in body["overview"]["metric_summaries"]}
    assert summary["rollout/raw_reward"] == {
        "key": "rollout/raw_reward",
        "title": "Training Reward",
        "initial": 0.25,
        "latest": 0.75,
        "delta": 0.5,
        "min": 0.25,
        "max": 0.75,
    }

    info = invoke(capsys, "--json", "train", "info", submitted["name"])
    assert info.code == 0, info.err
    export = info.json()["data"]["metrics"]
    assert set(export["training_run"]) == {
        "id",
        "status",
        "name",
        "base_model_name",
        "dataset_name",
        "rollout_name",
        "duration_ms",
        "started_at",
        "completed_at",
        "rows_processed",
        "latest_step",
        "total_steps",
    }
    assert (export["training_run"]["latest_step"], export["training_run"]["rows_processed"]) == (
        3,
        12,
    )
    series = {m["key"]: m for m in export["metrics"]}
    assert list(series) == ["training_reward", "entropy", "loss"]
    assert series["entropy"]["title"] == "Model Entropy"
    assert [d["value"] for d in series["entropy"]["data"]] == [None, 2.0]
    assert export["summary"]["entropy"] == {
        "initial": 2.0,
        "latest": 2.0,
        "delta": 0.0,
        "min": 2.0,
        "max": 2.0,
    }
    assert info.json()["data"]["checkpoints"] is None  # only for runs that ended

    nothing = invoke(capsys, "--json", "train", "download", submitted["name"])
    assert nothing.code == 1 and nothing.error()["error"]["code"] == "NOT_FOUND"

    refused = invoke(capsys, "--json", "train", "stop", submitted["name"])
    assert refused.code == 1 and refused.error()["error"]["code"] == "INTERACTIVE_REQUIRED"
    stopped = invoke(capsys, "--json", "train", "stop", submitted["name"], "-y")
    assert stopped.code == 0, stopped.err
    assert stopped.json()["operation"] == "train.stop"
    assert stopped.json()["resource"]["status"] == "stopped"


GRADED = 'ctx.set_reward(1.0 if answer == (ctx.label or "").strip() else 0.0)'
CONSTANT = "ctx.set_reward(0.5)  # the same reward for every answer"


@pytest.mark.timeout(600)
def test_a_run_without_a_learning_signal_ends_failed_saying_why_everywhere(
    cli: Platform, capsys: pytest.CaptureFixture[str], tmp_path: Path
):
    platform = cli
    main = platform.origin / "rollouts" / "copy-digit" / "main.py"
    assert GRADED in main.read_text()
    main.write_text(main.read_text().replace(GRADED, CONSTANT))
    git(platform.origin, "commit", "-q", "-am", "a grader that gives every answer 0.5")
    # 10 rows x 4 epochs / 4 prompts = 10 steps, so the default patience is 2 steps
    training = {**SHORT_TRAINING, "total_epochs": 4}
    # [advanced] reaches the trainer as submitted, a null and all: no TOML file between
    advanced = {"seed": 0, "notes": {"reviewer": None, "odd key\x7f": 'say "hi"'}}
    platform.submit(training, {"eval_interval": 100, "checkpoint_save_freq": 100}, advanced)
    claim = platform.claim("w1")
    from osmosis_ai.platform.worker.train_job import execute

    ctx = platform.context(claim)
    execute(ctx)

    run = platform.run_row(claim.run_id)
    assert run.status == "failed", platform.logs(run.id)
    written = json.loads((ctx.work_dir / "training" / run.name / "config.json").read_text())
    assert written["advanced"] == advanced
    assert not list(ctx.checkout.glob("configs/training/.platform-*"))
    assert run.error is not None
    assert run.error.startswith("no_learning_signal: no learning signal for 2 consecutive steps")
    assert "Check the grader" in run.error
    assert (run.current_step, run.total_steps) == (2, 10)
    logs = platform.logs(run.id)
    assert any(m.startswith("no learning signal for 2 steps in a row") for m in logs)
    assert logs[-1] == run.error  # the run's last log line says why it failed

    with platform.client() as client:
        detail = client.get(f"/api/cli/training-runs/{run.name}").json()["training_run"]
        assert (detail["status"], detail["error"]) == ("failed", run.error)
        listed = client.get("/api/cli/training-runs").json()["training_runs"]
        assert listed[0]["error"] == run.error
        saved = client.get(f"/api/cli/training-runs/{run.name}/checkpoints").json()
        assert [c["checkpoint_step"] for c in saved["checkpoints"]] == [2]  # nothing lost

    info = invoke(capsys, "--json", "train", "info", run.name, "-o", str(tmp_path / "x.json"))
    assert info.code == 0, info.err
    block = info.json()["data"]["training_run"]
    assert (block["status"], block["error"]) == ("failed", run.error)
    shown = invoke(capsys, "--plain", "train", "info", run.name, "-o", str(tmp_path / "x.json"))
    assert f"Error: {run.error}" in shown.out.splitlines()

    with httpx.Client(base_url=platform.url, follow_redirects=False, timeout=30) as browser:
        login = browser.get("/login").text
        csrf = login.split('name="csrf" value="', 1)[1].split('"', 1)[0]
        signed = browser.post(
            "/login",
            data={"csrf": csrf, "email": platform.alice.email, "token": platform.alice.token},
        )
        assert signed.status_code == 303, signed.text
        page = browser.get(f"/w/Copy/trainings/{run.name}")
        assert page.status_code == 200, page.text[:500]
        assert 'data-test="run-error"' in page.text
        assert "no_learning_signal: no learning signal for 2 consecutive steps" in page.text


def test_asynchronous_training_metrics_reach_train_info_and_old_records_stay_clean(
    cli: Platform, capsys
):
    """A step record of asynchronous training (``max_staleness`` > 0) as the worker stores it
    (``step_values`` of its ``metrics.jsonl`` record), beside a synchronous run's record
    without the new keys: ``train info`` shows each as a series with its title, and a step
    without a key is a gap, never ``None`` on screen."""
    from osmosis_ai.platform import training_metrics

    platform = cli
    submitted = platform.submit(SHORT_TRAINING, {"checkpoint_save_freq": 1}, {})
    reporter = platform.context(platform.claim("w1")).reporter
    old = {"step": 1, "time": 1.0, "training_reward": 0.25, "rollout_wait_seconds": 0.5}
    stale = {
        "step": 2,
        "time": 2.0,
        "training_reward": 0.5,
        "rollout_wait_seconds": 0.0,
        "max_staleness": 2,
        "staleness_mean": 1.25,
        "staleness_max": 2,
        "logprob_mismatch": 0.03,
        "logprob_mismatch_max": 0.4,
        "importance_ratio_mean": 0.98,
        "importance_ratio_max": 2.0,
        "stale_regenerated": 3,
        "validation_reward": 0.4,
        "validation_pass_rate": 0.5,
        "validation_policy_version": 2,
    }
    for record in (old, stale):
        reporter.record_metrics(int(record["step"]), training_metrics.step_values(record))
    reporter.progress(current_step=2, total_steps=5, examples_processed=8, reward=0.5)

    info = invoke(capsys, "--json", "train", "info", submitted["name"])
    assert info.code == 0, info.err
    export = info.json()["data"]["metrics"]
    series = {m["key"]: m for m in export["metrics"]}
    new = {
        "max_staleness": 2.0,
        "staleness_mean": 1.25,
        "staleness_max": 2.0,
        "logprob_mismatch": 0.03,
        "logprob_mismatch_max": 0.4,
        "importance_ratio_mean": 0.98,
        "importance_ratio_max": 2.0,
        "stale_regenerated": 3.0,
        "validation_policy_version": 2.0,
    }
    for key, value in new.items():
        assert [(d["step"], d["value"]) for d in series[key]["data"]] == [(2, value)], key
        assert series[key]["title"] == training_metrics.LABELS[key]
        assert export["summary"][key]["latest"] == value
    assert [d["value"] for d in series["rollout_wait_seconds"]["data"]] == [0.5, 0.0]
    assert series["staleness_mean"]["title"] == "Staleness, mean (versions)"

    shown = invoke(capsys, "--plain", "train", "info", submitted["name"], "-o", "export.json")
    assert shown.code == 0, shown.err
    lines = shown.out.splitlines()
    assert any(
        line.startswith("Staleness, mean (versions): ") and line.endswith(" 1.25 → 1.25")
        for line in lines
    ), shown.out
    assert any(line.startswith("Importance ratio, max: ") for line in lines), shown.out
    assert any(line.startswith("Rollout wait seconds: ") for line in lines), shown.out
    assert "None" not in shown.out and "nan" not in shown.out


def test_a_submitted_asynchronous_run_trains_on_stale_samples_within_its_bound(
    cli: Platform, capsys
):
    """``max_staleness`` under ``[advanced]`` of a platform submit reaches the worker's
    trainer: its steps may train samples one version old (how many are is a matter of
    timing: a step that updates before the next step's rollouts call the model gives them
    the new weights), corrected, within the bound, and the stored metrics that ``train info``
    shows say so."""
    from osmosis_ai.platform.worker.train_job import execute

    platform = cli
    advanced = {**SHORT_ADVANCED, "max_staleness": 1, "importance_ratio_cap": 1.5}
    submitted = platform.submit(
        SHORT_TRAINING, {"eval_interval": 100, "checkpoint_save_freq": 100}, advanced
    )
    claim = platform.claim("w1")
    execute(platform.context(claim))
    run = platform.run_row(claim.run_id)
    assert (run.status, run.current_step) == ("finished", 5), platform.logs(run.id)

    info = invoke(capsys, "--json", "train", "info", submitted["name"])
    assert info.code == 0, info.err
    series = {m["key"]: m["data"] for m in info.json()["data"]["metrics"]["metrics"]}
    assert [d["value"] for d in series["max_staleness"]] == [1.0] * 5
    staleness = [d["value"] for d in series["staleness_mean"]]
    assert len(staleness) == 5 and all(0.0 <= s <= 1.0 for s in staleness), staleness
    assert all(d["value"] <= 1.0 for d in series["staleness_max"])
    assert len(series["logprob_mismatch"]) == 5
    assert all(d["value"] <= 1.5 + 1e-6 for d in series["importance_ratio_max"])
    assert any("max_staleness 1" in m for m in platform.logs(run.id))  # the GRPO stage line
