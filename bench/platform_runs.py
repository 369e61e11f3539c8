"""Managed runs benchmark: a submitted eval run on `osmosis platform serve`, against the same
`osmosis eval run` on this machine, in one run.

Set-up: a workspace repository (a bare Git repository the platform fetches) holding the
bundled ``multiply-local-openai`` template with ``--rows`` rows, the scripted calculator model
(``bench/scripted_model.py --calculator``), a platform data dir made with the admin commands,
``osmosis platform serve --workers 1``, and the dataset uploaded with ``osmosis dataset
upload``. The rollout's dependencies are installed in this interpreter, so its environment
is "cached" (the fast path: no environment build).

Figures:

* submit → first rollout dispatched: from the run's ``created_at`` (the platform stored the
  submit) to the ``first rollout dispatched`` line of the run's own eval log, median of
  ``--starts`` submits (target <= 3 s);
* throughput: work items per second between the first dispatch and the last result, of the
  managed run and of ``osmosis eval run`` on the same rows, config and concurrency; the ratio
  (target >= 0.80);
* the platform's own cost per rollout: CPU seconds of the writes a worker makes per finished
  item (the sample with its trajectory file, through ``RunReporter.record_samples`` in the
  batches the eval job uses), measured in this process (target <= 1 ms).

    .venv/bin/python bench/platform_runs.py [--rows 200] [--concurrency 8] [--starts 3]
                                            [--single-tenant]  # workers uncontained
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from osmosis_ai.testing.serving import free_port

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
TEMPLATE = ROOT / "src" / "osmosis_ai" / "templates" / "multiply-local-openai"
NAME = "multiply-local-openai"
PYTHON = sys.executable
OSMOSIS = [PYTHON, "-m", "osmosis_ai.cli.main"]
TARGETS = {"start_s": 3.0, "ratio": 0.80, "overhead_ms": 1.0}
API_KEY = "sk-bench-calculator"


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def osmosis(*args: str, cwd: Path, env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        [*OSMOSIS, "--json", *args], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"osmosis {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout) if done.stdout.strip() else {}


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not answer {url} in {timeout} s")


def make_workspace(root: Path, rows: int, concurrency: int) -> tuple[Path, Path]:
    bare = root / "git" / "acme" / "bench.git"
    bare.parent.mkdir(parents=True)
    git(root, "init", "-q", "--bare", "-b", "main", str(bare))
    clone = root / "ws"
    clone.mkdir()
    git(clone, "init", "-q", "-b", "main")
    git(clone, "remote", "add", "origin", str(bare))
    shutil.copytree(TEMPLATE / "rollouts", clone / "rollouts")
    (clone / "configs" / "eval").mkdir(parents=True)
    (clone / "configs" / "training").mkdir(parents=True)
    (clone / "data").mkdir()
    (clone / "data" / ".gitkeep").write_text("")
    source = (TEMPLATE / "data" / "multiply.jsonl").read_text().splitlines()
    lines = [source[i % len(source)] for i in range(rows)]
    (clone / "data" / "calc.jsonl").write_text("\n".join(lines) + "\n")
    (clone / "configs" / "eval" / "calc.toml").write_text(
        f'[experiment]\nrollout = "{NAME}"\nentrypoint = "main.py"\n'
        'model_path = "openai/scripted"\ndataset = "calc"\n\n'
        f"[evaluation]\nlimit = {rows}\nbatch_size = {concurrency}\n\n"
        '[secrets]\nrequired = ["OPENAI_API_KEY", "OPENAI_BASE_URL"]\n'
    )
    git(clone, "add", "-A")
    git(clone, "-c", "user.email=b@example.com", "-c", "user.name=b", "commit", "-qm", "bench")
    git(clone, "push", "-q", "-u", "origin", "main")
    return bare, clone


def log_time(line: str) -> float:
    return datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00")).timestamp()


def dispatch_window(logs_txt: Path) -> tuple[float, float, int]:
    """(first dispatch time, last result time, results) from an eval run's ``logs.txt``."""
    lines = logs_txt.read_text().splitlines()
    first = next(log_time(line) for line in lines if "first rollout dispatched" in line)
    results = [log_time(line) for line in lines if " [result] " in line]
    return first, max(results), len(results)


def local_eval(clone: Path, model_url: str, name: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OSMOSIS_"))}
    env |= {"OPENAI_BASE_URL": f"{model_url}/v1", "OPENAI_API_KEY": API_KEY}
    osmosis(
        "eval", "run", "configs/eval/calc.toml", "--dataset-file", "data/calc.jsonl", "-y",
        "--name", name, cwd=clone, env=env,
    )  # fmt: skip
    first, last, results = dispatch_window(clone / ".osmosis" / "evals" / name / "logs.txt")
    return results / (last - first)


class Platform:
    def __init__(self, root: Path, *, single_tenant: bool = False) -> None:
        self.single_tenant = single_tenant
        self.data_dir = root / "platform"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "OSMOSIS_"))
        }
        self.env["HOME"] = str(root / "home")
        self.proc: subprocess.Popen[bytes] | None = None
        self.token = ""

    def admin(self, *args: str) -> dict[str, Any]:
        return osmosis("platform", *args, "--data-dir", str(self.data_dir), cwd=ROOT, env=self.env)

    def start(self, bare: Path) -> None:
        self.admin("user", "create", "bench@example.com")
        self.admin("workspace", "create", "Bench", "--repo", "acme/bench", "--clone-url", str(bare))
        self.admin("workspace", "add-member", "Bench", "bench@example.com", "--role", "owner")
        made = self.admin(
            "token", "create", "--email", "bench@example.com", "--platform-url", self.url
        )
        self.token = made["token"]
        command = [*OSMOSIS, "platform", "serve", "--data-dir", str(self.data_dir)]
        command += ["--port", str(self.port), "--workers", "1", "--log-level", "warning"]
        if self.single_tenant:  # the uncontained baseline of the isolation's cost
            command.append("--single-tenant")
        self.proc = subprocess.Popen(command, env=self.env)
        wait_http(f"{self.url}/api/health", self.proc, "osmosis platform serve")
        self.env |= {
            "OSMOSIS_PLATFORM_URL": self.url,
            "OSMOSIS_TOKEN": self.token,
            "OSMOSIS_TOKEN_PLATFORM_URL": self.url,
        }

    def api(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}", "X-Osmosis-Git": "acme/bench"}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def managed_eval(platform: Platform, clone: Path, secrets: Path) -> dict[str, Any]:
    """Submit the eval, wait for it to end; its start latency and throughput."""
    env = platform.env | {"OSMOSIS_ALLOW_INSECURE_PLATFORM_URL": "1"}
    submitted = osmosis(
        "eval", "submit", "configs/eval/calc.toml", "-y", "--secrets-file", str(secrets),
        cwd=clone, env=env,
    )  # fmt: skip
    run_id = submitted["resource"]["id"]
    with platform.api() as client:
        deadline = time.monotonic() + 600
        while True:
            raw = client.get(f"/api/cli/eval-runs/{run_id}").raise_for_status().json()
            run = {**raw, **raw.get("eval_run", {})}
            run["results"] = raw.get("results") or run.get("results")
            if run["status"] in ("finished", "failed", "stopped") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        run_logs = client.get(f"/api/cli/eval-runs/{run_id}/logs", params={"limit": 200})
        entries = run_logs.raise_for_status().json()["logs"]
    if run["status"] != "finished":
        raise RuntimeError(f"managed run {run_id} ended {run['status']}")
    logs = next((platform.data_dir / "work" / "runs" / run_id).rglob("logs.txt"))
    first, last, results = dispatch_window(logs)
    created = _epoch(run["created_at"])
    # where the start-up went: the worker's own log lines, then the eval's stage lines
    stages: dict[str, float] = {}
    for entry in entries:
        message = entry["message"]
        for mark, text in (
            ("claimed", "Started on worker"),
            ("child_up", "Preparing the run"),
            ("checked_out", "Code: "),
        ):
            if mark not in stages and text in message:
                stages[mark] = _epoch(entry["timestamp"]) - created
    for line in logs.read_text().splitlines():
        for mark, text in (
            ("server_spawned", "starting rollout server"),
            ("model_checked", "model answered"),
            ("server_healthy", "rollout server healthy"),
        ):
            if mark not in stages and text in line:
                stages[mark] = log_time(line) - created
    return {
        "start_s": first - created,
        "stages_s": {k: round(v, 3) for k, v in sorted(stages.items(), key=lambda kv: kv[1])},
        "rate": results / (last - first),
        "results": results,
        "pass_rate": (run.get("results") or {}).get("pass_rate"),
    }


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def reporter_overhead(root: Path, samples: int, batch: int) -> float:
    """CPU milliseconds per sample that a worker spends storing it (SQLite, trajectory file)."""
    from osmosis_ai.platform.objects import ObjectStore
    from osmosis_ai.platform.services import work
    from osmosis_ai.platform.services.accounts import create_user, create_workspace
    from osmosis_ai.platform.settings import load_settings
    from osmosis_ai.platform.store.database import open_database
    from osmosis_ai.platform.store.orm import Run, utcnow
    from osmosis_ai.platform.worker.report import RunReporter, SampleRecord

    settings = load_settings(data_dir=root / "overhead")
    database = open_database(settings)
    now = utcnow()
    with database.transaction() as session:
        user = create_user(session, "o@example.com")
        space = create_workspace(session, "O", repo="acme/o", clone_url="/nonexistent")
        session.add(
            Run(
                id="run-o", workspace_id=space.id, kind="eval", name="o", status="pending",
                creator_id=user.id, rollout_name="r", entrypoint="main.py", commit_sha="0" * 40,
                model_path="m", dataset_name="d", experiment_config={}, required_secrets=[],
                secret_scopes={}, created_at=now, updated_at=now,
            )
        )  # fmt: skip
        worker = work.register_worker(session, name="bench", slots=1, wake_address=None, now=now)
        worker_id = worker.id
    with database.transaction() as session:
        claim = work.claim_run(session, worker_id, now=utcnow())
        assert claim is not None
    reporter = RunReporter(
        database, ObjectStore(settings.objects_dir), run_id="run-o", worker_id=worker_id,
        attempt=claim.attempt,
    )  # fmt: skip
    trajectory = root / "trajectory.json"
    trajectory.write_text(json.dumps({"schema_version": "ATIF-v1.4", "steps": [{"x": "y" * 2000}]}))
    records = [
        SampleRecord(row_index=i, run_index=0, rollout_id=f"{i:032x}", status="success",
                     reward=1.0, tokens=120, duration_ms=40, trajectory=trajectory)
        for i in range(samples)
    ]  # fmt: skip
    started = time.process_time()
    for at in range(0, samples, batch):
        reporter.record_samples(records[at : at + batch])
    spent = time.process_time() - started
    database.dispose()
    return spent / samples * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--starts", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--single-tenant",
        action="store_true",
        help="run the platform's workers uncontained (the baseline of what isolation costs)",
    )
    args = parser.parse_args(argv)
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="osmosis-bench-runs-") as temp:
        root = Path(temp)
        model_port = free_port()
        model = subprocess.Popen(
            [PYTHON, str(BENCH / "scripted_model.py"), "--port", str(model_port), "--calculator"]
        )
        platform = Platform(root, single_tenant=args.single_tenant)
        try:
            model_url = f"http://127.0.0.1:{model_port}"
            wait_http(f"{model_url}/v1/models", model, "scripted model")
            bare, clone = make_workspace(root, args.rows, args.concurrency)
            secrets = root / "secrets.env"
            secrets.write_text(f"OPENAI_API_KEY={API_KEY}\nOPENAI_BASE_URL={model_url}/v1\n")
            platform.start(bare)
            env = platform.env | {"OSMOSIS_ALLOW_INSECURE_PLATFORM_URL": "1"}
            osmosis("dataset", "upload", "data/calc.jsonl", "-y", cwd=clone, env=env)
            local_rates = [local_eval(clone, model_url, f"local-{i}") for i in range(2)]
            runs = [managed_eval(platform, clone, secrets) for _ in range(args.starts)]
            local_rate = statistics.median(local_rates)
            managed_rate = statistics.median(r["rate"] for r in runs)
            figures = {
                "rows": args.rows,
                "concurrency": args.concurrency,
                "start_s": [round(r["start_s"], 3) for r in runs],
                "start_stages_s": [r["stages_s"] for r in runs],
                "start_s_median": statistics.median(r["start_s"] for r in runs),
                "local_items_per_s": local_rate,
                "managed_items_per_s": managed_rate,
                "ratio": managed_rate / local_rate,
                "managed_pass_rate": [r["pass_rate"] for r in runs],
                "overhead_ms_per_rollout": reporter_overhead(root, 400, 16),
            }
        finally:
            platform.stop()
            model.terminate()
            model.wait(timeout=10)
    print(f"rows {figures['rows']}, concurrency {figures['concurrency']}")
    print(
        f"submit -> first dispatch: median {figures['start_s_median']:.2f} s "
        f"(each: {figures['start_s']}; target <= {TARGETS['start_s']:g} s)"
    )
    for stages in figures["start_stages_s"]:
        print(f"  start-up after submit: {stages}")
    print(
        f"throughput: managed {figures['managed_items_per_s']:.1f} items/s, local "
        f"{figures['local_items_per_s']:.1f} items/s, ratio {figures['ratio']:.2f} "
        f"(target >= {TARGETS['ratio']:.2f}); managed pass rates {figures['managed_pass_rate']}"
    )
    print(
        f"platform cost per rollout: {figures['overhead_ms_per_rollout']:.3f} ms CPU "
        f"(target <= {TARGETS['overhead_ms']:g} ms)"
    )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
