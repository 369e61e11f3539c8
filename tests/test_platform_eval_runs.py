"""Managed evaluation runs end to end on a real platform (uvicorn on 127.0.0.1, SQLite): a
run submitted against a real Git repository holding the bundled multiply templates is
claimed, checked out and executed by the eval job (the same ``run_eval`` as ``osmosis eval
run``) against the scripted calculator model, reached through the run's ``[env]`` and
secrets; then its metrics, samples manifest and signed downloads, the limit rule, resume
without re-running stored items, retry of failed items only, the import of a local run, and
the ``osmosis eval`` commands with ``--json``."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("sqlalchemy")

from osmosis_ai.platform.crypto import SecretBox, secret_key
from osmosis_ai.platform.objects import ObjectStore
from osmosis_ai.platform.services import work
from osmosis_ai.platform.services.accounts import add_member, create_workspace
from osmosis_ai.platform.services.runs import run_secret_values, seal_secrets
from osmosis_ai.platform.store.orm import Run, RunLog, RunSample, User, utcnow
from osmosis_ai.platform.worker import eval_job
from osmosis_ai.platform.worker.job import JobContext
from osmosis_ai.platform.worker.report import RunReporter
from osmosis_ai.testing.model_server import ChatRequest, ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.scripted_reply import content_text
from osmosis_ai.workspace.templates import apply_template
from platform_support import git
from platform_world import World, running_world

TEMPLATES = {"multiply-local-openai": "agents", "multiply-local-strands": "strands"}
REPO = "acme/evals"
SECRET = "sk-eval-secret-93c1f0"
OPERANDS = re.compile(r"val1 = (-?[\d.]+)\s+val2 = (-?[\d.]+)")
DATASET_ROWS = 20

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(module) is None for module in TEMPLATES.values()),
    reason="the templates' agent frameworks (openai-agents, strands) are not installed",
)


class Calculator:
    """The scripted model: calls ``multiply(a, b)`` on a row's prompt, then answers
    ``#### <product>``; on ``broken`` rows (by first operand) its second turn is an error."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prompts: list[str] = []
        self.broken: set[str] = set()

    def __call__(self, request: ChatRequest) -> ScriptedTurn:
        results = [m for m in request.messages if m.get("role") == "tool"]
        user = next((m for m in request.messages if m.get("role") == "user"), {})
        operands = OPERANDS.search(content_text(user.get("content")))
        if operands is None:
            return ScriptedTurn(content="ok")
        if results:
            if operands.group(1) in self.broken:
                return ScriptedTurn(status_code=400, error="scripted failure")
            product = float(content_text(results[-1].get("content")))
            return ScriptedTurn(content=f"The product is\n#### {product:.4f}")
        with self.lock:
            self.prompts.append(operands.group(1))
        a, b = float(operands.group(1)), float(operands.group(2))
        return ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": a, "b": b})])


def first_operands() -> list[str]:
    path = (
        Path(eval_job.__file__).parents[2] / "templates/multiply-local-openai/data/multiply.jsonl"
    )
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    found = [OPERANDS.search(row["user_prompt"]) for row in rows]
    return [m.group(1) for m in found if m is not None]


@dataclass
class Lab:
    world: World
    origin: Path
    root: Path
    model: Calculator
    model_url: str
    workspace_id: str = ""
    worker_id: str = ""
    runs: list[str] = field(default_factory=list[str])

    def client(self) -> httpx.Client:
        return self.world.client("alice", repo=REPO)

    def call(self, method: str, path: str, **kwargs: Any) -> Any:
        with self.client() as client:
            response = client.request(method, path, **kwargs)
        assert response.is_success, response.text
        return response.json()

    def submit(
        self, template: str, *, advanced: dict[str, Any] | None = None, **evaluation: Any
    ) -> str:
        body = {
            "experiment_config": {
                "rollout": template,
                "entrypoint": "main.py",
                "model_path": "openai/gpt-5-mini",
                "dataset": "multiply",
            },
            "evaluation_config": {"pass_threshold": 1.0, "batch_size": 4, **evaluation},
            "env_config": {"OPENAI_BASE_URL": self.model_url},
            "secrets": {"required": ["OPENAI_API_KEY"], "provided": {"OPENAI_API_KEY": SECRET}},
        }
        if advanced is not None:
            body["advanced_config"] = advanced
        return self.call("POST", "/api/cli/eval-runs", json=body)["id"]

    def claim(self, *, later_s: float = 0.0) -> work.Claim:
        now = utcnow() + timedelta(seconds=later_s)
        with self.world.database.transaction() as session:
            if not self.worker_id:
                self.worker_id = work.register_worker(
                    session, name="test-worker", slots=1, wake_address=None, now=now
                ).id
            claim = work.claim_run(session, self.worker_id, now=now)
        assert claim is not None
        return claim

    def context(self, claim: work.Claim) -> JobContext:
        settings = self.world.settings
        box = SecretBox(secret_key(settings.data_dir))
        with self.world.database.read() as session:
            run = session.get(Run, claim.run_id)
            assert run is not None
            secrets = run_secret_values(session, run, box=box)
            session.expunge(run)
        work_dir = self.root / "work" / run.id
        checkout = work_dir / "checkout"
        if not checkout.exists():
            git(self.root, "clone", "-q", str(self.origin), str(checkout))
        git(checkout, "checkout", "-q", run.commit_sha)
        environ = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OSMOSIS"))}
        environ |= {**(run.env_config or {}), **secrets}
        reporter = RunReporter(
            self.world.database,
            ObjectStore(settings.objects_dir),
            run_id=run.id,
            worker_id=self.worker_id,
            attempt=claim.attempt,
        )
        return JobContext(
            settings=settings,
            run=run,
            attempt=claim.attempt,
            resumed=claim.resumed,
            checkout=checkout,
            work_dir=work_dir,
            environ=environ,
            secret_values=tuple(secrets.values()),
            reporter=reporter,
        )

    def execute(self) -> JobContext:
        ctx = self.context(self.claim())
        eval_job.execute(ctx)
        return ctx

    def run_row(self, run_id: str) -> Run:
        with self.world.database.read() as session:
            run = session.get(Run, run_id)
            assert run is not None
            return run

    def samples(self, run_id: str) -> list[RunSample]:
        with self.world.database.read() as session:
            return list(
                session.query(RunSample)
                .filter(RunSample.run_id == run_id)
                .order_by(RunSample.row_index, RunSample.run_index)
            )

    def dashboard(self, path: str) -> str:
        """The dashboard page at ``path``, signed in as alice."""
        with httpx.Client(base_url=self.world.url, timeout=30) as browser:
            login = browser.get("/login").text
            csrf = login.split('name="csrf" value="', 1)[1].split('"', 1)[0]
            email, token = "alice@example.com", self.world.tokens["alice"]
            signed = browser.post("/login", data={"csrf": csrf, "email": email, "token": token})
            assert signed.status_code == 303, signed.text
            page = browser.get(path)
            assert page.status_code == 200, page.text[:500]
            return page.text

    def log_text(self, run_id: str) -> str:
        with self.world.database.read() as session:
            logs = session.query(RunLog).filter(RunLog.run_id == run_id).all()
            return "\n".join(f"{log.message} {json.dumps(log.details)}" for log in logs)


def upload_dataset(client: httpx.Client, path: Path) -> None:
    data = path.read_bytes()
    created = client.post(
        "/api/cli/datasets",
        json={"file_name": path.stem, "file_size": len(data), "extension": "jsonl"},
    )
    assert created.status_code == 201, created.text
    body = created.json()
    upload = body["upload"]
    put = httpx.put(upload["presigned_url"], content=data, headers=upload["upload_headers"])
    assert put.status_code == 200, put.text
    done = client.post(f"/api/cli/datasets/{body['id']}/complete", json={})
    assert done.status_code == 200, done.text
    deadline = time.monotonic() + 60
    while client.get(f"/api/cli/datasets/{body['id']}").json()["status"] != "uploaded":
        assert time.monotonic() < deadline, "the dataset was not processed in 60 s"
        time.sleep(0.05)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    origin = tmp_path / "acme" / "evals"  # a clone's origin names the workspace acme/evals
    origin.mkdir(parents=True)
    git(origin, "init", "-q", "-b", "main")
    for template in TEMPLATES:
        apply_template(template, origin)
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "multiply templates")
    model = Calculator()
    with (
        running_world(tmp_path / "data") as world,
        ScriptedModelServer(responder=model) as server,
    ):
        with world.database.transaction() as session:
            space = create_workspace(session, "evals", repo=REPO, clone_url=str(origin))
            alice = session.get(User, world.user_ids["alice"])
            assert alice is not None
            add_member(session, space, alice, role="owner")
            workspace_id = space.id
        lab = Lab(world, origin, tmp_path, model, server.base_url, workspace_id)
        with lab.client() as client:
            upload_dataset(client, origin / "data" / "multiply.jsonl")
        yield lab


# --- the job ---------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_both_templates_reach_full_marks_on_every_row_without_a_limit(lab: Lab):
    for template in TEMPLATES:
        lab.model.prompts.clear()
        run_id = lab.submit(template)  # no limit: every row, as `osmosis eval run` does
        ctx = lab.execute()
        assert ctx.run.id == run_id
        run = lab.run_row(run_id)
        assert run.status == "finished", (run.error, lab.log_text(run_id))
        samples = lab.samples(run_id)
        assert [s.source_row_index for s in samples] == list(range(DATASET_ROWS))
        assert [(s.row_index, s.run_index) for s in samples] == [
            (r, 0) for r in range(DATASET_ROWS)
        ]
        assert sorted(lab.model.prompts) == sorted(first_operands())
        assert all(s.status == "success" and s.reward == 1.0 for s in samples)
        store = ObjectStore(lab.world.settings.objects_dir)
        for sample in samples:
            assert sample.trajectory_key is not None
            document = json.loads(store.path(sample.trajectory_key).read_bytes())
            assert document["session_id"] == sample.rollout_id
        assert run.results is not None and run.results["pass_rate"] == 1.0
        assert run.results["total_samples"] == DATASET_ROWS
        assert (run.results["rows"], run.results["dataset_rows"]) == (DATASET_ROWS, DATASET_ROWS)
        assert (run.current_step, run.total_steps) == (DATASET_ROWS, DATASET_ROWS)
        logs = lab.log_text(run_id)
        assert "Evaluating 20 work items (20 of 20 rows x 1)" in logs
        assert "Finished: 20 of 20 passed" in logs
        page = lab.dashboard(f"/w/evals/evals/{run_id}")
        assert re.search(r'data-test="run-rows">\s*20 of 20 × 1<', page), page
        assert SECRET not in logs
        assert SECRET not in store.path(f"runs/{run_id}/files/logs.txt").read_text()


def test_managed_rows_rule():
    assert eval_job.managed_rows(20, 3) == [0, 1, 2]
    assert eval_job.managed_rows(2, 5) == [0, 1]
    assert eval_job.managed_rows(20, None) == list(range(20))  # no limit: every row
    assert eval_job.managed_rows(0, None) == []


# --- results through the API -----------------------------------------------------------------


@pytest.mark.timeout(300)
def test_metrics_manifest_and_signed_downloads_of_a_first_n_rows_run(lab: Lab):
    # [advanced] passes as submitted: a null and a key TOML must quote reach the run unchanged
    advanced = {"notes": {"reviewer": None, "tags": []}, "odd key\x7f": 'say "hi"'}
    run_id = lab.submit("multiply-local-openai", limit=3, advanced=advanced)
    ctx = lab.execute()
    name = lab.run_row(run_id).name
    local = json.loads((ctx.work_dir / eval_job.EVAL_DIR / name / "manifest.json").read_text())
    assert local["provenance"]["advanced"] == advanced
    assert local["provenance"]["git_dirty"] is False  # nothing was written into the checkout
    samples = lab.samples(run_id)
    assert [s.source_row_index for s in samples] == [0, 1, 2]  # limit set: the first N rows
    assert sorted(lab.model.prompts) == sorted(first_operands()[:3])

    metrics = lab.call("GET", f"/api/cli/eval-runs/{run_id}/metrics")
    overview = metrics["overview"]
    assert (overview["total_samples"], overview["passed"], overview["pass_rate"]) == (3, 3, 1.0)
    assert overview["duration_ms"] > 0 and overview["pass_threshold"] == 1.0
    assert metrics["reward_stats"]["mean"] == 1.0 and metrics["pass_at_k"] == []
    listed = lab.call("GET", "/api/cli/eval-runs")["eval_runs"]
    assert listed[0]["results"]["pass_rate"] == 1.0
    detail = lab.call("GET", f"/api/cli/eval-runs/{run_id}")
    assert detail["results"]["total_samples"] == 3
    # the names the 0.3.8 CLI reads for reward, progress and tokens
    results = detail["results"]
    assert (results["score"], results["total_runs"], results["sampled_rows"]) == (1.0, 3, 3)
    assert results["total_tokens"] == results["tokens_used"] > 0

    manifest = lab.call("GET", f"/api/cli/eval-runs/{run_id}/samples/manifest")
    paths = sorted(f["path"] for f in manifest["files"])
    assert paths == [
        "metrics.json",
        "summary.jsonl",
        *(f"trajectories/row_{r}_run_0.json" for r in range(3)),
    ]
    assert manifest["totals"]["files"] == 5 and manifest["totals"]["samples"] == 3
    items = [{"token": f["token"], "path": f["path"]} for f in manifest["files"]]
    urls = lab.call(
        "POST", f"/api/cli/eval-runs/{run_id}/samples/download-urls", json={"items": items}
    )
    assert urls["expires_in"] == 900
    got = {item["path"]: httpx.get(item["url"]).content for item in urls["items"]}
    assert json.loads(got["metrics.json"])["summary"] == metrics["summary"]
    index = [json.loads(line) for line in got["summary.jsonl"].decode().splitlines()]
    assert [(e["row_index"], e["status"]) for e in index] == [
        (0, "success"),
        (1, "success"),
        (2, "success"),
    ]
    for entry in index:
        trajectory = json.loads(got[f"trajectories/row_{entry['row_index']}_run_0.json"])
        assert trajectory["session_id"] == entry["rollout_id"]

    some = lab.call(
        "GET", f"/api/cli/eval-runs/{run_id}/samples/manifest", params={"types": "all", "rows": "1"}
    )
    some_paths = {f["path"] for f in some["files"]}
    assert {"logs.txt", "trajectories/row_1_run_0.json"} <= some_paths
    assert not any(p.startswith("trajectories/row_0") for p in some_paths)
    with lab.client() as client:
        bad = client.get(f"/api/cli/eval-runs/{run_id}/samples/manifest", params={"types": "x"})
        assert bad.status_code == 400 and "unknown sample types" in bad.text
        foreign = client.post(
            f"/api/cli/eval-runs/{run_id}/samples/download-urls",
            json={"items": [{"token": "../other/x.json", "path": "x.json"}]},
        )
        assert foreign.status_code == 400
        too_many = client.post(
            f"/api/cli/eval-runs/{run_id}/samples/download-urls",
            json={"items": [{"token": "files/metrics.json", "path": "m"}] * 501},
        )
        assert too_many.status_code in (400, 422)


@pytest.mark.timeout(300)
def test_resume_runs_only_the_items_without_a_stored_sample(lab: Lab):
    from osmosis_ai.platform.worker.report import SampleRecord

    run_id = lab.submit("multiply-local-openai", limit=4)
    first = lab.context(lab.claim())  # an attempt that stored two results, then was lost
    earlier = {r: f"{r:032x}" for r in (0, 1)}
    first.reporter.record_samples(
        [
            SampleRecord(row_index=r, run_index=0, rollout_id=rid, status="success", reward=1.0)
            for r, rid in earlier.items()
        ]
    )
    second = lab.context(lab.claim(later_s=60))  # its lease ran out: a new attempt
    assert second.resumed and second.attempt == 2
    eval_job.execute(second)
    operands = first_operands()
    assert sorted(lab.model.prompts) == sorted(operands[2:4])
    samples = lab.samples(run_id)
    assert [(s.row_index, s.attempt) for s in samples] == [(0, 1), (1, 1), (2, 2), (3, 2)]
    assert [s.rollout_id for s in samples[:2]] == [earlier[0], earlier[1]]
    assert lab.run_row(run_id).status == "finished"

    # The worker died after journaling row 3 but before storing it: the next attempt on this
    # machine stores it from the journal and runs nothing again.
    journaled = samples[3].rollout_id
    with lab.world.database.transaction() as session:
        session.query(RunSample).filter(
            RunSample.run_id == run_id, RunSample.row_index == 3
        ).delete()
        run = session.get(Run, run_id)
        assert run is not None
        run.status, run.completed_at, run.lease_expires_at = "running", None, utcnow()
        box = SecretBox(secret_key(lab.world.settings.data_dir))
        run.provided_secrets = seal_secrets(box, run_id, {"OPENAI_API_KEY": SECRET})
    third = lab.context(lab.claim(later_s=120))
    eval_job.execute(third)
    assert sorted(lab.model.prompts) == sorted(operands[2:4])  # nothing ran again
    samples = lab.samples(run_id)
    assert len(samples) == 4 and samples[3].rollout_id == journaled
    assert lab.run_row(run_id).status == "finished"


@pytest.mark.timeout(300)
def test_retry_runs_the_failed_items_again_and_only_them(lab: Lab):
    operands = first_operands()
    lab.model.broken = {operands[1]}
    run_id = lab.submit("multiply-local-openai", limit=3)
    lab.execute()
    before = {s.row_index: s for s in lab.samples(run_id)}
    assert [before[r].status for r in range(3)] == ["success", "failed", "success"]
    run = lab.run_row(run_id)
    assert run.status == "finished" and run.results is not None
    assert run.results["failed"] == 1

    with lab.client() as client:
        missing = client.post(f"/api/cli/eval-runs/{run_id}/retry", json={})
        assert missing.status_code == 400 and "OPENAI_API_KEY" in missing.text
    body = {"secrets": {"provided": {"OPENAI_API_KEY": SECRET}}}
    retried = lab.call("POST", f"/api/cli/eval-runs/{run_id}/retry", json=body)
    assert (retried["status"], retried["retry_items"]) == ("pending", 1)

    lab.model.broken.clear()
    lab.model.prompts.clear()
    lab.execute()
    assert lab.model.prompts == [operands[1]]
    after = {s.row_index: s for s in lab.samples(run_id)}
    assert len(after) == 3 and after[1].status == "success"
    assert [after[r].rollout_id for r in (0, 2)] == [before[r].rollout_id for r in (0, 2)]
    run = lab.run_row(run_id)
    assert run.status == "finished" and run.results is not None
    assert run.results["pass_rate"] == 1.0 and "retry_failed" not in run.results
    with lab.client() as client:
        again = client.post(f"/api/cli/eval-runs/{run_id}/retry", json=body)
        assert again.status_code == 409 and "NOTHING_TO_RETRY" in again.text


# --- the CLI -----------------------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_eval_commands_against_the_platform(lab: Lab, tmp_path: Path, capsys, monkeypatch):
    from cli_support import invoke

    run_id = lab.submit("multiply-local-openai", limit=2)
    lab.execute()
    name = lab.run_row(run_id).name
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(lab.origin), str(clone))
    monkeypatch.chdir(clone)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", lab.world.url)
    monkeypatch.setenv("OSMOSIS_TOKEN", lab.world.tokens["alice"])
    monkeypatch.setenv("OSMOSIS_TOKEN_PLATFORM_URL", lab.world.url)

    def ok(*args: str) -> dict[str, Any]:
        outcome = invoke(capsys, *args, "--json")
        assert outcome.code == 0, (args, outcome.err)
        assert SECRET not in outcome.out + outcome.err
        return outcome.json()

    listed = ok("eval", "list")["items"]
    assert [(r["name"], r["status"], r["rollout"]) for r in listed] == [
        (name, "finished", "multiply-local-openai")
    ]
    assert listed[0]["results"]["pass_rate"] == 1.0
    info = ok("eval", "info", name, "-o", str(tmp_path / "info"))["data"]
    assert info["metrics"]["overview"]["total_samples"] == 2
    assert (info["results"]["rows"], info["results"]["dataset_rows"]) == (2, DATASET_ROWS)
    shown = invoke(capsys, "--plain", "eval", "info", name, "-o", str(tmp_path / "info"))
    assert "Rows: 2 of 20 dataset rows × 1" in shown.out.splitlines()
    written = json.loads((tmp_path / "info" / "metrics.json").read_text())
    assert written["summary"]["pass_rate"] == 1.0 and written["eval_run"]["name"] == name
    logs = ok("eval", "logs", name, "--limit", "200")["items"]
    assert any(entry["message"].startswith("Finished: 2 of 2 passed") for entry in logs)

    downloaded = ok("eval", "download", name)["resource"]
    root = clone / ".osmosis" / "evals" / name
    # The local run layout: what osmosis eval run writes, besides metrics and trajectories.
    assert downloaded["output_path"] == str(root) and downloaded["files"] == 8
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        "events.jsonl",
        "index.jsonl",
        "manifest.json",
        "metrics.json",
        "progress.json",
        "summary.jsonl",
        "trajectories/row_0_run_0.json",
        "trajectories/row_1_run_0.json",
    ]
    index = [json.loads(line) for line in (root / "summary.jsonl").read_text().splitlines()]
    trajectory = json.loads((root / "trajectories" / "row_1_run_0.json").read_text())
    assert trajectory["session_id"] == index[1]["rollout_id"]
    again = invoke(capsys, "eval", "download", name, "--json")
    assert again.code == 1 and again.error()["error"]["code"] == "CONFLICT"
    ok("eval", "download", name, "--overwrite", "-y")
    some = ok("eval", "download", name, "--type", "all", "--rows", "1", "-o", str(tmp_path / "x"))
    assert (tmp_path / "x" / "logs.txt").is_file()
    assert not (tmp_path / "x" / "trajectories" / "row_0_run_0.json").exists()
    assert some["resource"]["files"] >= 4

    # A local run, uploaded as it finishes; uploading it again sends nothing new.
    monkeypatch.setenv("OPENAI_BASE_URL", lab.model_url)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    config = "configs/eval/multiply-local-openai.toml"
    local = ok("eval", "run", config, "--rows", "0-2", "--name", "local-1", "-y", "--upload")
    upload = local["resource"]["upload"]
    assert upload["eval_run_name"] == "local-1" and upload["status"] == "finished"
    assert upload["files"] == 4 and upload["uploaded_files"] == 4
    metrics = lab.call("GET", "/api/cli/eval-runs/local-1/metrics")
    assert (metrics["overview"]["total_samples"], metrics["overview"]["pass_rate"]) == (3, 1.0)
    assert metrics["overview"]["tokens_used"] == local["resource"]["metrics"]["tokens_used"]
    manifest = lab.call("GET", "/api/cli/eval-runs/local-1/samples/manifest")
    assert len([f for f in manifest["files"] if f["path"].startswith("trajectories/")]) == 3
    repeated = ok("eval", "upload", ".osmosis/evals/local-1")["resource"]
    assert repeated["eval_run_id"] == upload["eval_run_id"] and repeated["uploaded_files"] == 0
    names = [r["name"] for r in ok("eval", "list")["items"]]
    assert sorted(names) == sorted([name, "local-1"])
    retry = lab.world.client("alice", repo=REPO).post("/api/cli/eval-runs/local-1/retry", json={})
    assert retry.status_code == 409 and "RUN_IMPORTED" in retry.text

    # the submit's answer says how many rows the run evaluates: every row without a limit
    said = invoke(capsys, "--plain", "eval", "submit", config, "-y")
    assert said.code == 0, said.err
    lines = said.out.splitlines()
    assert "Rows: all 20 rows of multiply" in lines
    limited = Path(config).with_name("first-three.toml")
    limited.write_text(Path(config).read_text().replace("# limit = 10 ", "limit = 3 "))
    submitted = ok("eval", "submit", str(limited), "-y")["resource"]
    assert submitted["rows"] == {"limit": 3, "dataset_rows": DATASET_ROWS, "rows": 3}
    for made in (lines[0].rpartition(": ")[2], submitted["name"]):
        ok("eval", "stop", made, "-y")

    pending = lab.submit("multiply-local-openai", limit=1)
    refused = invoke(capsys, "eval", "stop", pending, "--json")
    assert refused.code == 1 and refused.error()["error"]["code"] == "INTERACTIVE_REQUIRED"
    stopped = ok("eval", "stop", pending, "-y")["resource"]
    assert stopped["status"] == "stopped" and lab.run_row(pending).status == "stopped"
