"""What the ``osmosis eval`` platform commands share: the shape of an eval run in results
and where a run's files go locally. The downloads and uploads themselves are
:mod:`osmosis_ai.platform.client.eval_runs`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from osmosis_ai.platform.client.eval_runs import (
    EVAL_RUN_KEYS,
    RUNS_PATH,
    UploadPlan,
    eval_run,
    run_path,
    write_json,
)

if TYPE_CHECKING:
    from osmosis_ai.cli.platform_session import Session

__all__ = [
    "EVALS_DIR",
    "EVAL_RUN_KEYS",
    "RUNS_PATH",
    "default_root",
    "eval_run",
    "pass_rate_text",
    "run_path",
    "upload_result_resource",
    "write_json",
]

EVALS_DIR = Path(".osmosis") / "evals"


def pass_rate_text(results: object) -> str | None:
    if not isinstance(results, Mapping):
        return None
    table: Mapping[str, object] = results  # pyright: ignore[reportUnknownVariableType]
    rate, passed, completed = (
        table.get("pass_rate"),
        table.get("passed"),
        table.get("completed_samples"),
    )
    if not isinstance(rate, int | float):
        return None
    return f"{rate:.1%} ({passed}/{completed})"


def default_root(session: Session, name: str) -> Path:
    base = session.workspace.root if session.workspace is not None else Path.cwd()
    return base / EVALS_DIR / _safe_segment(name)


def _safe_segment(name: str) -> str:
    cleaned = name.replace("/", "_").replace("\\", "_")
    return cleaned if cleaned not in ("", ".", "..") else "_"


def upload_result_resource(answer: Mapping[str, object], plan: UploadPlan) -> dict[str, object]:
    return {
        "eval_run_id": answer.get("eval_run_id"),
        "eval_run_name": answer.get("eval_run_name"),
        "status": answer.get("run_status"),
        "local_run_id": plan.local_run_id,
        "run_dir": str(plan.run_dir),
        "files": answer.get("files"),
        "uploaded_files": answer.get("uploaded_files"),
        "bytes": answer.get("bytes"),
        "results": answer.get("results"),
    }
