"""Runs for the dashboard's tests and bench, written the way a worker stores them: rows in the
platform's database (runs, metrics, checkpoints, the models checkpoints become, samples, logs)
and files in its object store (ATIF trajectories, artifacts).

Everything goes through the real ORM and object store of a :class:`Platform`; nothing is
mocked. ``hostile`` puts HTML and script into every user-controlled string, for the
escaping checks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import insert

from osmosis_ai.platform import training_metrics
from osmosis_ai.platform.api.deps import Platform
from osmosis_ai.platform.api.objects import object_store
from osmosis_ai.platform.services.training_results import register_checkpoint_model
from osmosis_ai.platform.store.orm import (
    Dataset,
    Run,
    RunCheckpoint,
    RunLog,
    RunMetric,
    RunSample,
)

XSS = "<script>alert('x')</script><img src=x onerror=alert(1)>"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
# The charts a training run's page must draw (the seeded run has data for each).
TRAINING_CHARTS = (
    "training_reward",
    "validation_reward",
    "entropy",
    "response_length",
    "total_length",
    "truncation_ratio",
)


@dataclass(frozen=True)
class Seeded:
    id: str
    name: str


def _run(
    workspace_id: str,
    creator_id: str,
    kind: str,
    name: str,
    status: str,
    now: datetime,
    **extra: object,
) -> Run:
    fields: dict[str, object] = {
        "workspace_id": workspace_id,
        "kind": kind,
        "name": name,
        "status": status,
        "creator_id": creator_id,
        "rollout_name": "multiply",
        "entrypoint": "main.py",
        "branch": "main",
        "commit_sha": COMMIT,
        "model_path": "Qwen/Qwen3-0.6B",
        "dataset_name": "multiply",
        "experiment_config": {
            "rollout": "multiply",
            "entrypoint": "main.py",
            "dataset": "multiply",
        },
        "required_secrets": ["OPENAI_API_KEY"],
        "secret_scopes": {"OPENAI_API_KEY": "workspace"},
        "created_at": now - timedelta(hours=1),
        "updated_at": now,
        "started_at": now - timedelta(minutes=50),
    }
    fields.update(extra)
    return Run(**fields)


def reward_at(step: int, steps: int) -> float:
    """A reward that rises with noise, as a learning run's does."""
    return 0.2 + 0.6 * step / max(1, steps) + 0.05 * math.sin(step * 0.7)


def seed_training(
    platform: Platform,
    workspace_id: str,
    creator_id: str,
    *,
    name: str = "bright-otter",
    steps: int = 50,
    total_steps: int | None = None,
    status: str = "running",
    checkpoints: tuple[int, ...] = (),
    logs: int = 5,
    no_signal: int = 0,
    warnings: tuple[str, ...] = (),
    error: str | None = None,
    extra: Mapping[str, Callable[[int], float | None]] | None = None,
) -> Seeded:
    """A training run with ``steps`` steps of the metrics a GRPO run logs: the six overview
    charts and the trainer's others (loss, grad norm, learning rate, KL, clip ratio, throughput,
    step time; ``clip_ratio`` stays 0 throughout). The last ``no_signal`` steps had no learning
    signal; each of ``warnings`` is a warning line of the run's log; ``extra`` adds metrics,
    each a function of the step (``None``: not logged at that step)."""
    now = platform.now()
    with platform.transaction() as db:
        run = _run(
            workspace_id,
            creator_id,
            "training",
            name,
            status,
            now,
            current_step=steps,
            total_steps=total_steps or steps,
            examples_processed_count=steps * 8,
            training_config={"lr": 1e-5, "n_samples_per_prompt": 8, "notes": name},
            error=error,
            reward=reward_at(steps, steps) if steps else None,
            completed_at=now if status in ("finished", "failed", "stopped") else None,
        )
        db.add(run)
        db.flush()
        start = now - timedelta(minutes=50)
        rows: list[dict[str, object]] = []
        for step in range(1, steps + 1):
            stamp = start + timedelta(seconds=step)
            values = {
                "training_reward": reward_at(step, steps),
                "validation_reward": reward_at(step, steps) - 0.05 if step % 10 == 0 else None,
                "entropy": 1.5 - step / max(1, steps),
                "response_length": 200.0 + step % 37,
                "total_length": 600.0 + step % 53,
                "truncation_ratio": 0.1 * (step % 5) / 5,
                "loss": 0.4 - 0.3 * step / max(1, steps) + 0.02 * math.cos(step),
                "grad_norm": 0.8 + 0.3 * math.sin(step * 0.3),
                "learning_rate": 1e-5,
                "kl": 0.002 * step / max(1, steps),
                "clip_ratio": 0.0,
                "tokens_per_s": 1500.0 + 10 * (step % 7),
                "step_seconds": 4.0 + 0.1 * (step % 3),
                "steps_without_signal": float(max(0, step - (steps - no_signal))),
                **{key: value_at(step) for key, value_at in (extra or {}).items()},
            }
            for key, value in values.items():
                if value is None:
                    continue
                rows.append(
                    {
                        "run_id": run.id,
                        "key": training_metrics.wire_key(key),
                        "step": step,
                        "value": value,
                        "timestamp": stamp,
                    }
                )
        for chunk in range(0, len(rows), 5000):
            db.execute(insert(RunMetric), rows[chunk : chunk + 5000])
        for step in checkpoints:
            db.add(
                RunCheckpoint(
                    run_id=run.id,
                    step=step,
                    name=f"step-{step}",
                    status="saved",
                    reward=reward_at(step, steps),
                    object_prefix=f"runs/{run.id}/checkpoints/step-{step}",
                    created_at=now,
                )
            )
            register_checkpoint_model(
                db,
                run,
                step=step,
                path=f"/models/{name}/step-{step}",
                reward=reward_at(step, steps),
                now=now,
            )
        for index in range(logs):
            db.add(
                RunLog(
                    run_id=run.id,
                    timestamp=now,
                    level="info",
                    step="train",
                    message=f"step {index + 1} done",
                )
            )
        for message in warnings:
            db.add(
                RunLog(run_id=run.id, timestamp=now, level="warning", step="train", message=message)
            )
        return Seeded(run.id, run.name)


def trajectory(row: int, *, reward: float, hostile: bool, failed: bool) -> dict[str, object]:
    """An ATIF document: a system prompt, the question, a tool call, its result, the answer."""
    tool_output = f"{XSS} product" if hostile else "product = 42"
    answer = f"The answer is {XSS}" if hostile else f"#### {row * 2}"
    return {
        "schema_version": "ATIF-v1.7",
        "session_id": f"s{row}",
        "trajectory_id": f"t{row}",
        "agent": {"name": "osmosis-rollout-sdk", "version": "0"},
        "steps": [
            {"step_id": 1, "source": "system", "message": "You are a careful calculator."},
            {
                "step_id": 2,
                "source": "user",
                "message": f"What is {row} times 2? {XSS if hostile else ''}",
            },
            {
                "step_id": 3,
                "source": "agent",
                "message": "",
                "tool_calls": [
                    {
                        "tool_call_id": "call_1",
                        "function_name": "multiply",
                        "arguments": {"a": row, "b": 2},
                    }
                ],
                "metrics": {"prompt_tokens": 40, "completion_tokens": 12},
            },
            {
                "step_id": 4,
                "source": "system",
                "message": "",
                "observation": {"results": [{"source_call_id": "call_1", "content": tool_output}]},
            },
            {
                "step_id": 5,
                "source": "agent",
                "message": answer,
                "metrics": {"prompt_tokens": 60, "completion_tokens": 8},
            },
        ],
        "final_metrics": {
            "total_prompt_tokens": 100,
            "total_completion_tokens": 20,
            "total_steps": 5,
        },
        "extra": {
            "osmosis": {
                "rollout_id": f"r{row}",
                "reward": reward,
                "status": "failed" if failed else "success",
                "err_message": "The grader found no '#### <number>' line" if failed else None,
                "err_category": "grader_error" if failed else None,
            }
        },
    }


def seed_eval(
    platform: Platform,
    workspace_id: str,
    creator_id: str,
    *,
    name: str = "calm-heron",
    samples: int = 20,
    n: int = 1,
    status: str = "finished",
    trajectories: int | None = None,
    hostile: bool = False,
    shift: int = 0,
    dataset: str = "multiply",
) -> Seeded:
    """An eval run of ``samples`` rows × ``n`` runs: every third row fails (reward 0, error
    ``grader_error``), the rest pass; the first ``trajectories`` samples (default all) get an
    ATIF file, and row 0 an artifacts folder."""
    now = platform.now()
    store = object_store(platform)
    keep = samples * n if trajectories is None else trajectories
    with platform.transaction() as db:
        run = _run(
            workspace_id,
            creator_id,
            "eval",
            name,
            status,
            now,
            evaluation_config={"pass_threshold": 1.0, "n": n},
            dataset_name=dataset,
            completed_at=now if status != "running" else None,
            examples_processed_count=samples * n,
            current_step=samples * n,
            total_steps=samples * n,
        )
        db.add(run)
        db.flush()
        rows: list[dict[str, object]] = []
        files: list[tuple[str, bytes]] = []
        count = 0
        for row in range(samples):
            for index in range(n):
                failed = (row + shift + index) % 3 == 0
                reward = 0.0 if failed else 1.0
                key = None
                if count < keep:
                    key = f"runs/{run.id}/trajectories/row_{row}_run_{index}.json"
                    document = trajectory(row, reward=reward, hostile=hostile, failed=failed)
                    files.append((key, json.dumps(document).encode()))
                count += 1
                rows.append(
                    {
                        "run_id": run.id,
                        "row_index": row,
                        "run_index": index,
                        "source_row_index": row,
                        "rollout_id": f"r{row}-{index}",
                        "status": "failed" if failed and row % 2 == 0 else "success",
                        "reward": reward,
                        "tokens": 120 + row % 17,
                        "duration_ms": 1000 + row,
                        "error_type": "grader_error" if failed else None,
                        "trajectory_key": key,
                        "attempt": 1,
                        "created_at": now,
                    }
                )
        for chunk in range(0, len(rows), 5000):
            db.execute(insert(RunSample), rows[chunk : chunk + 5000])
        passed = sum(1 for r in rows if r["reward"] == 1.0)
        run.results = {"pass_rate": passed / len(rows) if rows else 0.0, "passed": passed}
        db.add(
            RunLog(run_id=run.id, timestamp=now, level="info", step="eval", message="eval started")
        )
        seeded = Seeded(run.id, run.name)
    for key, data in files:
        store.put(key, data)
    artifacts = f"runs/{seeded.id}/artifacts/row_0_run_0"
    odd = f"{XSS}.txt" if hostile else "notes.txt"
    store.put(f"{artifacts}/{odd}", b"notes <b>bold</b>\n")
    store.put(f"{artifacts}/logs/agent.log", b"line 1\nline 2 <script>alert(2)</script>\n")
    store.put(f"{artifacts}/page.html", b"<html><script>alert(3)</script></html>")
    store.put(f"{artifacts}/plot.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 16)
    return seeded


def seed_dataset(
    platform: Platform,
    workspace_id: str,
    creator_id: str,
    *,
    name: str = "multiply",
    rows: int = 12,
    preview: int = 5,
) -> str:
    """An uploaded ``.jsonl`` dataset whose row ``i`` asks for ``i`` times 2 and holds the
    ground truth ``2i``; its stored preview keeps the first ``preview`` rows."""
    from osmosis_ai.platform.services.datasets import object_key

    records = [
        {"user_prompt": f"What is {i} times 2?", "ground_truth": str(2 * i)} for i in range(rows)
    ]
    body = "".join(json.dumps(r) + "\n" for r in records).encode()
    with platform.transaction() as db:
        dataset = Dataset(
            workspace_id=workspace_id,
            file_name=name,
            extension="jsonl",
            file_size=len(body),
            status="uploaded",
            row_count=rows,
            data_preview=records[:preview],
            creator_id=creator_id,
            file_format="jsonl",
        )
        db.add(dataset)
        db.flush()
        dataset.object_key = object_key(dataset)
        key, dataset_id = dataset.object_key, dataset.id
    object_store(platform).put(key, body)
    return dataset_id
