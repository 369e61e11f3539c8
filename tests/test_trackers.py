"""``report_to``: training and eval runs recorded in TensorBoard, MLflow, W&B (offline) and
trackio, checked by reading back what each library wrote: TensorBoard's event files through
its EventAccumulator, MLflow's store through MlflowClient, the W&B offline run's transaction
log, trackio's SQLite database.

The runs go through the CLI as subprocesses, with ``TRACKIO_DIR`` in a temp dir: trackio
fixes its directory when imported.
"""

from __future__ import annotations

import json
import os
import sqlite3
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cli_support import invoke
from osmosis_ai import tracking
from osmosis_ai.errors import MissingExtraError

for _module in ("tensorboard", "mlflow", "wandb", "trackio", "sqlalchemy", "alembic"):
    pytest.importorskip(
        _module, reason="needs the 'trackers' extra: pip install \"osmosis-ai[trackers]\""
    )

ALL = ["tensorboard", "mlflow", "wandb", "trackio"]
EVAL_COMMAND = [sys.executable, "-m", "osmosis_ai.cli.main", "--json", "eval", "run"]


# --- readers ----------------------------------------------------------------------------------


def tensorboard_scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    return [(event.step, event.value) for event in accumulator.Scalars(tag)]


def tensorboard_text(folder: Path, tag: str) -> str:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    (event,) = accumulator.Tensors(tag)
    return event.tensor_proto.string_val[0].decode()


def mlflow_run(run_dir: Path) -> tuple[Any, Any]:
    from mlflow.tracking import MlflowClient

    state = json.loads((run_dir / "trackers.json").read_text())
    assert state["mlflow_tracking_uri"] == f"sqlite:///{run_dir / 'mlflow' / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=state["mlflow_tracking_uri"])
    return client, client.get_run(state["mlflow_run_id"])


def mlflow_series(run_dir: Path, key: str) -> list[tuple[int, float]]:
    client, run = mlflow_run(run_dir)
    history = client.get_metric_history(run.info.run_id, key)
    return sorted((m.step, m.value) for m in history)


def wandb_records(run_dir: Path) -> list[Any]:
    """The records of the run's offline transaction log (LevelDB log framing after a 7-byte
    ``:W&B`` header: 32 KiB blocks of ``crc32 · length · type`` chunks)."""
    from wandb.proto import wandb_internal_pb2

    (path,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(data):
        left = block - position % block
        if left < 7:
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0 and length == 0:  # block padding
            position += left
            continue
        chunk = data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 2):  # full, first
            pending = chunk
        else:  # middle, last
            pending += chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    rows = []
    for record in wandb_records(run_dir):
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    (item.key or "/".join(item.nested_key)): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows


def wandb_summary(run_dir: Path) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for record in wandb_records(run_dir):
        if record.WhichOneof("record_type") == "summary":
            for item in record.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
    return summary


def wandb_config(run_dir: Path) -> dict[str, Any]:
    for record in wandb_records(run_dir):
        if record.WhichOneof("record_type") == "run":
            return {
                item.key: json.loads(item.value_json)
                for item in record.run.config.update
                if item.key != "_wandb"
            }
    raise AssertionError("no run record")


def trackio_rows(trackio_dir: Path, project: str, run: str) -> list[tuple[int, dict[str, Any]]]:
    (database,) = trackio_dir.glob(f"{project}.db")
    with sqlite3.connect(database) as connection:
        found = connection.execute(
            "SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY id", (run,)
        ).fetchall()
    return [(step, json.loads(metrics)) for step, metrics in found]


def trackio_config(trackio_dir: Path, project: str, run: str) -> dict[str, Any]:
    with sqlite3.connect(trackio_dir / f"{project}.db") as connection:
        (config,) = connection.execute(
            "SELECT config FROM configs WHERE run_name = ?", (run,)
        ).fetchone()
    return json.loads(config)


def tracker_env(tmp_path: Path) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WANDB_", "MLFLOW_", "TRACKIO_", "OPENAI_"))
    }
    return env | {"TRACKIO_DIR": str(tmp_path / "trackio"), "NO_COLOR": "1"}


# --- training ---------------------------------------------------------------------------------

TRAIN_CONFIG = """
[experiment]
rollout = "copy-digit"
entrypoint = "main.py"
model_path = "local:models/tiny"
dataset = "copy-digit"

[training]
lr = 3e-4
total_epochs = 4
n_samples_per_prompt = 4
rollout_batch_size = 4
max_prompt_length = 64
max_response_length = 4
agent_workflow_timeout_s = 60
grader_timeout_s = 30
seed = 0
report_to = {report_to}
no_signal_patience = 0  # an untrained policy's few steps: the trackers are tested, not the signal

[checkpoints]
eval_interval = 2
checkpoint_save_freq = 100
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")
    from osmosis_ai.train.tiny_model import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("trackers-model") / "tiny")


def train_workspace(root: Path, model_dir: Path, report_to: list[str]) -> Path:
    from osmosis_ai.train.demo import setup_workspace

    root.mkdir()
    setup_workspace(root)
    (root / "models").mkdir()
    (root / "models" / "tiny").symlink_to(model_dir)
    text = TRAIN_CONFIG.format(report_to=json.dumps(report_to))
    (root / "configs" / "training" / "tracked.toml").write_text(text)
    return root


def test_train_run_reports_each_step_to_every_tracker(tmp_path: Path, model_dir: Path):
    workspace = train_workspace(tmp_path / "ws", model_dir, ALL)
    command = [sys.executable, "-m", "osmosis_ai.cli.main", "--json", "train", "run"]
    args = ["configs/training/tracked.toml", "--max-steps", "3", "--eval-rows", "4"]
    done = subprocess.run(
        [*command, *args, "--threads", "1", "--name", "tracked"],
        cwd=workspace,
        env=tracker_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    envelope = json.loads(done.stdout)  # no tracker printed on stdout
    assert envelope["status"] == "success"
    run_dir = Path(envelope["resource"]["output_path"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [(r["step"], r["training_reward"]) for r in records]
    entropy = [(r["step"], r["entropy"]) for r in records]
    assert [step for step, _ in rewards] == [1, 2, 3]
    validations = [(v["step"], v["mean_reward"]) for v in envelope["resource"]["validation"]]
    assert [step for step, _ in validations] == [0, 2, 3]

    # TensorBoard: event files under the run dir, float32 scalars
    board = run_dir / "tensorboard"
    assert tensorboard_scalars(board, "training_reward") == [
        (step, pytest.approx(value, rel=1e-6)) for step, value in rewards
    ]
    assert tensorboard_scalars(board, "entropy") == [
        (step, pytest.approx(value, rel=1e-6)) for step, value in entropy
    ]
    assert tensorboard_scalars(board, "validation_reward") == [
        (step, pytest.approx(value, rel=1e-6)) for step, value in validations
    ]
    assert '"lr": 0.0003' in tensorboard_text(board, "config")

    # MLflow: the SQLite store under the run dir
    client, run = mlflow_run(run_dir)
    assert run.info.status == "FINISHED" and run.info.run_name == "tracked"
    assert run.data.params["training.lr"] == "0.0003"
    assert run.data.params["training.report_to"] == json.dumps(ALL)
    assert "env.OPENAI_API_KEY" not in run.data.params
    assert mlflow_series(run_dir, "training_reward") == rewards
    assert mlflow_series(run_dir, "validation_reward") == validations
    assert client.get_experiment(run.info.experiment_id).name == "ws"

    # W&B: an offline run under the run dir
    history = wandb_history(run_dir)
    assert [
        (row["_step"], row["training_reward"]) for row in history if "training_reward" in row
    ] == rewards
    assert [
        (row["_step"], row["validation_reward"]) for row in history if "validation_reward" in row
    ] == validations
    config = wandb_config(run_dir)
    assert config["run_name"] == "tracked" and config["training"]["lr"] == 0.0003

    # trackio: its local database
    rows = trackio_rows(tmp_path / "trackio", "ws", "tracked")
    assert [(step, m["training_reward"]) for step, m in rows if "training_reward" in m] == rewards
    assert [
        (step, m["validation_reward"]) for step, m in rows if "validation_reward" in m
    ] == validations
    assert trackio_config(tmp_path / "trackio", "ws", "tracked")["steps"] == 3

    logs = (run_dir / "logs.txt").read_text()
    for target in ALL:
        assert f"reporting to {target}: " in logs
    assert "Trackio project initialized" in logs  # its prints went to the log, not stdout


# --- evaluation -------------------------------------------------------------------------------


def test_eval_run_reports_its_final_metrics_to_every_tracker(tmp_path: Path):
    from test_eval_run_cli import Model, make_workspace

    workspace = make_workspace(tmp_path / "ws", rows=4)
    config = workspace / "configs" / "eval" / "multiply.toml"
    config.write_text(config.read_text() + f"\n[advanced]\nreport_to = {json.dumps(ALL)}\n")
    model = Model({2: "right", 3: "wrong", 4: "right", 5: "right"})
    with model.server:
        env = tracker_env(tmp_path) | {"OPENAI_BASE_URL": model.server.base_url}
        done = subprocess.run(
            [*EVAL_COMMAND, "configs/eval/multiply.toml", "-y", "--name", "tracked"],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    envelope = json.loads(done.stdout)
    assert "ADVANCED_IGNORED" not in done.stderr
    run_dir = Path(envelope["resource"]["output_path"])
    summary = json.loads((run_dir / "metrics.json").read_text())["summary"]
    assert summary["pass_rate"] == 0.75
    expected = {
        "pass_rate": 0.75,
        "passed": 3.0,
        "total_samples": 4.0,
        "reward_mean": summary["reward_stats"]["mean"],
        "tokens_used": float(summary["tokens_used"]),
    }

    board = run_dir / "tensorboard"
    for key, value in expected.items():
        assert tensorboard_scalars(board, key) == [(0, pytest.approx(value, rel=1e-6))], key
    _client, run = mlflow_run(run_dir)
    assert run.info.status == "FINISHED" and run.data.tags["osmosis.kind"] == "eval"
    assert {k: run.data.metrics[k] for k in expected} == expected
    assert run.data.params["experiment.model_path"] == "openai/scripted"
    assert {k: wandb_summary(run_dir)[k] for k in expected} == expected
    ((step, metrics),) = trackio_rows(tmp_path / "trackio", "ws", "tracked")
    assert step == 0 and {k: metrics[k] for k in expected} == expected


# --- bad names and missing libraries ----------------------------------------------------------


def test_unknown_targets_are_config_errors(tmp_path: Path, capsys, monkeypatch):
    from test_eval_run_cli import make_workspace

    workspace = make_workspace(tmp_path / "ws", rows=2)
    eval_config = workspace / "configs" / "eval" / "multiply.toml"
    eval_config.write_text(
        eval_config.read_text()
        + '\n[advanced]\nreport_to = ["tensorboard", "comet"]\nmlflow_tracking_uri = 5\n'
    )
    monkeypatch.chdir(workspace)
    outcome = invoke(capsys, "--json", "eval", "run", "configs/eval/multiply.toml", "-y")
    assert outcome.code != 0
    error = outcome.error()["error"]
    issues = {issue["key"]: issue["message"] for issue in error["details"]["issues"]}
    assert issues["advanced.report_to"] == (
        "advanced.report_to must be a list of 'tensorboard', 'wandb', 'mlflow', 'trackio', "
        "got ['tensorboard', 'comet'] (array)"
    )
    assert (
        "mlflow_tracking_uri must be a non-empty string" in issues["advanced.mlflow_tracking_uri"]
    )
    assert not (workspace / ".osmosis" / "evals").exists()  # failed before any run started

    (workspace / "configs" / "training").mkdir()
    train_config = workspace / "configs" / "training" / "bad.toml"
    train_config.write_text(TRAIN_CONFIG.format(report_to='["tensorboard", "neptune"]'))
    outcome = invoke(capsys, "--json", "train", "run", "configs/training/bad.toml")
    assert outcome.code != 0
    issues = {i["key"]: i["message"] for i in outcome.error()["error"]["details"]["issues"]}
    assert "'trackio'" in issues["training.report_to"]
    assert "got ['tensorboard', 'neptune']" in issues["training.report_to"]


def test_a_missing_library_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(MissingExtraError) as caught:
        tracking.require_installed(["tensorboard", "wandb"], "osmosis train run", {})
    assert str(caught.value) == (
        "osmosis train run with report_to = ['wandb'] needs the 'trackers' extra (module "
        "'wandb' not found): run pip install \"osmosis-ai[trackers]\""
    )
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "alembic" else real(name, *a)
    )
    with pytest.raises(MissingExtraError):  # the local SQLite store needs it...
        tracking.require_installed(["mlflow"], "osmosis eval run", {})
    # ...a tracking server does not
    tracking.require_installed(["mlflow"], "osmosis eval run", {"MLFLOW_TRACKING_URI": "http://x"})


def test_report_targets_match_the_config_rule():
    from osmosis_ai.workspace.sections import REPORT_TARGETS

    assert set(REPORT_TARGETS) == set(tracking.TARGET_MODULES)


# --- resume -----------------------------------------------------------------------------------


def test_a_resumed_run_continues_its_tracker_runs(tmp_path: Path):
    """Two invocations of one run: the second continues the first's MLflow and W&B runs
    (ids kept in trackers.json), and TensorBoard drops what the first logged past the
    resume point."""
    script = """
import sys
from pathlib import Path
from osmosis_ai import tracking

run_dir, resumed = Path(sys.argv[1]), sys.argv[2] == "1"
run = tracking.TrackedRun(
    kind="train", name="again", run_dir=run_dir, project="proj",
    config={"training": {"lr": 0.1}}, resumed=resumed, resume_step=2 if resumed else None,
)
trackers = tracking.open_trackers(sys.argv[3].split(","), run)
steps = [3, 4] if resumed else [1, 2, 3]
for step in steps:
    trackers.log(step, {"training_reward": step + (0.5 if resumed else 0.0), "text": "x"})
trackers.close("success")
"""
    targets = "tensorboard,mlflow,wandb"
    for resumed in ("0", "1"):
        done = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "run"), resumed, targets],
            env=tracker_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""
    run_dir = tmp_path / "run"
    assert tensorboard_scalars(run_dir / "tensorboard", "training_reward") == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.5),
        (4, 4.5),
    ]
    client, run = mlflow_run(run_dir)
    assert len(client.search_runs([run.info.experiment_id])) == 1
    assert mlflow_series(run_dir, "training_reward") == [
        (1, 1.0),
        (2, 2.0),
        (3, 3.0),
        (3, 3.5),
        (4, 4.5),
    ]
    offline = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 2 and len({p.name.rpartition("-")[2] for p in offline}) == 1


# --- asynchronous training metrics ------------------------------------------------------------


def test_asynchronous_training_metrics_reach_the_trackers_and_absent_ones_leave_no_gap(
    tmp_path: Path,
):
    """Step records as ``TrainReporter`` forwards them (``metrics.jsonl`` keys less the ones it
    does not log): a synchronous step without the staleness keys, then asynchronous ones."""
    script = """
import sys
from pathlib import Path
from osmosis_ai import tracking
from osmosis_ai.train import reporting

records = [
    {"step": 1, "time": 1.0, "training_reward": 0.1, "rollout_wait_seconds": 0.5},
    {"step": 2, "time": 2.0, "training_reward": 0.2, "rollout_wait_seconds": 0.0,
     "max_staleness": 2, "staleness_mean": 1.25, "staleness_max": 2, "stale_regenerated": 1,
     "logprob_mismatch": 0.03, "logprob_mismatch_max": 0.5, "importance_ratio_mean": 0.97,
     "importance_ratio_max": 2.0, "validation_reward": 0.3, "validation_policy_version": 2},
    {"step": 3, "time": 3.0, "training_reward": 0.3, "max_staleness": 2,
     "staleness_mean": None, "staleness_max": 1},
]
run = tracking.TrackedRun(kind="train", name="stale", run_dir=Path(sys.argv[1]),
                          project="proj", config={}, resumed=False, resume_step=0)
trackers = tracking.open_trackers(["tensorboard", "mlflow"], run)
for record in records:
    trackers.log(record["step"], {k: v for k, v in record.items()
                                  if k not in reporting._NOT_LOGGED})
trackers.close("success")
"""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "run")],
        env=tracker_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    run_dir = tmp_path / "run"
    board = run_dir / "tensorboard"
    assert tensorboard_scalars(board, "staleness_mean") == [(2, 1.25)]
    assert tensorboard_scalars(board, "staleness_max") == [(2, 2.0), (3, 1.0)]
    assert tensorboard_scalars(board, "max_staleness") == [(2, 2.0), (3, 2.0)]
    assert tensorboard_scalars(board, "importance_ratio_max") == [(2, 2.0)]
    assert tensorboard_scalars(board, "rollout_wait_seconds") == [(1, 0.5), (2, 0.0)]
    for key in ("validation_reward", "validation_policy_version"):
        with pytest.raises(KeyError):  # a ValidationEvent logs them, not the step record
            tensorboard_scalars(board, key)
    assert mlflow_series(run_dir, "logprob_mismatch") == [(2, pytest.approx(0.03))]
    assert mlflow_series(run_dir, "stale_regenerated") == [(2, 1.0)]
    assert mlflow_series(run_dir, "staleness_mean") == [(2, 1.25)]
