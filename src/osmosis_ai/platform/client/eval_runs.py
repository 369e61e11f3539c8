"""An eval run's files between the platform and a local run dir (reference §3.2, §5.9, §6.1).

A download writes the layout of a local run dir (``metrics.json``, ``summary.jsonl``,
``trajectories/``, ``artifacts/``, ``logs.txt``, then ``index.jsonl``, ``events.jsonl``,
``progress.json`` and ``manifest.json``) under a root, from the run's samples manifest. An
upload sends only ``index.jsonl`` and the selected attempts' trajectories and artifacts;
never the manifest, journal, logs or secrets. Each file is hashed first and checked again
just before it is sent, so a file that changes meanwhile is refused rather than uploaded
half-old.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis_ai.platform.client.api import PlatformClient, UploadInstructions, segment
from osmosis_ai.platform.client.errors import (
    AlreadyExistsError,
    LocalFileError,
    LocalRunBusyError,
    PlatformClientError,
)
from osmosis_ai.platform.client.transfer import safe_relative, transfers_for
from osmosis_ai.rundir.durable import atomic_write_bytes

if TYPE_CHECKING:
    from osmosis_ai.eval.rundir import RunLock

EVAL_RUN_KEYS = (
    "id",
    "name",
    "status",
    "created_at",
    "started_at",
    "completed_at",
    "model_name",
    "dataset_name",
    "rollout_name",
    "creator_name",
    "results",
)
RUNS_PATH = "/api/cli/eval-runs"
DOWNLOAD_BATCH = 500
UPLOAD_BATCH = 100
FINALIZE_TIMEOUT_S = 300.0
_UPLOADABLE = re.compile(r"^(?:trajectories/row_\d+_run_\d+\.json|artifacts/row_\d+_run_\d+/.+)$")


def run_path(name_or_id: str, *rest: str) -> str:
    return "/".join((RUNS_PATH, segment(name_or_id), *rest))


def eval_run(record: Mapping[str, Any]) -> dict[str, object]:
    """An eval run as list and detail results show it (its model, dataset, rollout flat)."""
    block = record.get("eval_run")
    source: Mapping[str, Any] = block if isinstance(block, Mapping) else record  # pyright: ignore[reportUnknownVariableType]
    data = {key: source.get(key, record.get(key)) for key in EVAL_RUN_KEYS}
    if data["results"] is None:
        data["results"] = record.get("results")
    for key in ("model", "dataset", "rollout"):  # the names, as the hosted CLI lists them
        data[key] = data.get(f"{key}_name")
    url = source.get("platform_url") or record.get("platform_url")
    if isinstance(url, str) and url:
        data["platform_url"] = url
    return data


def write_json(path: Path, value: object) -> None:
    data = json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n"
    atomic_write_bytes(path, data.encode("utf-8"))


# --- download ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Downloaded:
    root: Path
    files: int
    bytes: int
    skipped: int


@dataclass(frozen=True)
class DownloadPlan:
    """What a download of ``name_or_id`` would write under ``root``."""

    name_or_id: str
    root: Path
    record: dict[str, object]  # the run, as :func:`eval_run` shows it
    files: list[tuple[str, str, int, Path]]  # (token, relative path, size, target)
    existing: list[Path]  # targets already there, which the download replaces


def plan_download(
    client: PlatformClient,
    name_or_id: str,
    *,
    types: str,
    rows: str | None,
    root: Path,
    overwrite: bool,
) -> DownloadPlan:
    """The files the run's manifest lists for ``types`` (and ``rows``), to go under ``root``.

    Raises :class:`AlreadyExistsError` when some are there already and ``overwrite`` is off
    (``metrics.json`` that ``eval info`` wrote for the same run is refreshed, not a conflict).
    """
    params: dict[str, str | int] = {"types": types}
    if rows:
        params["rows"] = rows
    manifest = client.call("GET", run_path(name_or_id, "samples", "manifest"), params=params)
    raw = manifest.get("files")
    files = [f for f in raw if isinstance(f, dict)] if isinstance(raw, list) else []  # pyright: ignore[reportUnknownVariableType]
    planned: list[tuple[str, str, int, Path]] = []
    for item in files:
        relative = safe_relative(str(item.get("path", "")))
        token = item.get("token")
        size = item.get("size")
        if not isinstance(token, str):
            continue
        expected = size if isinstance(size, int) and not isinstance(size, bool) else 0
        planned.append((token, str(relative), expected, root.joinpath(*relative.parts)))
    record = eval_run(client.call("GET", run_path(name_or_id)))
    existing = [
        target
        for _, relative, _, target in planned
        if target.exists() and not own_metrics(relative, target, record.get("id"))
    ]
    if existing and not overwrite:
        raise AlreadyExistsError(
            f"{len(existing)} of the files already exist under {root} (e.g. {existing[0]}). "
            "Use --overwrite to replace them, or -o to download elsewhere.",
            {"output_path": str(root), "existing": [str(p) for p in existing[:20]]},
        )
    return DownloadPlan(name_or_id, root, record, planned, existing)


def download_run(client: PlatformClient, plan: DownloadPlan) -> Downloaded:
    """Download what ``plan`` lists, then complete the layout of a local run dir."""
    name_or_id, total = plan.name_or_id, 0
    with transfers_for(client) as transfers:
        for start in range(0, len(plan.files), DOWNLOAD_BATCH):
            batch = plan.files[start : start + DOWNLOAD_BATCH]
            body = {"items": [{"token": token, "path": path} for token, path, _, _ in batch]}
            answer = client.call(
                "POST", run_path(name_or_id, "samples", "download-urls"), json=body
            )
            urls = {
                str(u.get("token")): str(u.get("url"))
                for u in answer.get("items", [])
                if isinstance(u, dict)
            }
            for token, path, size, target in batch:
                url = urls.get(token)
                if not url:
                    raise PlatformClientError(
                        "PLATFORM_ERROR", f"The platform gave no URL for {path}."
                    )
                transfers.download(url, target, overwrite=True, expected_size=size)
                total += size
    detail = client.call("GET", run_path(name_or_id))
    written = write_local_layout(plan.root, plan.record, detail)
    return Downloaded(root=plan.root, files=len(plan.files) + written, bytes=total, skipped=0)


def own_metrics(relative: str, target: Path, run_id: object) -> bool:
    """``metrics.json`` that ``eval info`` wrote for this same run: refreshed, not a conflict."""
    if relative != "metrics.json" or not isinstance(run_id, str):
        return False
    try:
        document = json.loads(target.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    block = document.get("eval_run") if isinstance(document, dict) else None
    return isinstance(block, dict) and block.get("id") == run_id  # pyright: ignore[reportUnknownMemberType]


def write_local_layout(root: Path, record: Mapping[str, Any], detail: Mapping[str, Any]) -> int:
    """Complete a download into the layout ``osmosis eval run`` leaves (reference §5.6).

    From ``summary.jsonl`` (the platform's sample index): ``index.jsonl`` (the same bytes),
    ``events.jsonl`` (one journal record per item) and ``progress.json``; from the run's
    record, ``manifest.json`` (its inputs; ``provenance.source`` says it came from the
    platform). ``logs.txt`` comes with ``--type logs`` (or ``all``). Returns the files written.
    """
    summary = root / "summary.jsonl"
    if not summary.is_file():
        return 0
    index = summary.read_bytes()
    entries: list[dict[str, Any]] = []
    for line in index.decode("utf-8").splitlines():
        if line.strip():
            entry = json.loads(line)
            if isinstance(entry, dict):
                entries.append(_str_keys(entry))
    atomic_write_bytes(root / "index.jsonl", index)
    journal_keys = ("row_index", "run_index", "rollout_id", "status", "reward", "tokens")
    events = "".join(
        json.dumps(
            {
                **{k: e[k] for k in journal_keys if e.get(k) is not None},
                "duration_ms": e.get("duration_ms", 0),
                **({"error_type": e["error_type"]} if e.get("error_type") else {}),
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        + "\n"
        for e in entries
    )
    atomic_write_bytes(root / "events.jsonl", events.encode("utf-8"))
    results = record.get("results")
    results = results if isinstance(results, dict) else {}
    rows = {e.get("row_index") for e in entries}
    write_json(
        root / "progress.json",
        {
            "total_runs": results.get("total_runs", len(entries)),  # pyright: ignore[reportUnknownMemberType]
            "sampled_rows": results.get("sampled_rows", len(rows)),  # pyright: ignore[reportUnknownMemberType]
            "total_dataset_rows": results.get("dataset_rows"),  # pyright: ignore[reportUnknownMemberType]
        },
    )
    config = detail.get("config")
    config = config if isinstance(config, dict) else {}
    run_id = str(record.get("id") or "")
    write_json(
        root / "manifest.json",
        {
            "schema_version": 1,
            "local_run_id": hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:32],
            "run_name": record.get("name"),
            "created_at": record.get("created_at"),
            "inputs": {
                "model_path": record.get("model_name"),
                "dataset": {"name": record.get("dataset_name")},
                "n": config.get("n", 1),  # pyright: ignore[reportUnknownMemberType]
                "rollout": {
                    "name": record.get("rollout_name"),
                    "entrypoint": detail.get("entrypoint"),
                },
                "env": detail.get("env_config") or {},
                "secret_names": sorted(detail.get("resolved_secret_scopes") or {}),
            },
            "provenance": {
                "source": "platform",
                "platform_run_id": run_id,
                "config_branch": detail.get("branch"),
                "config_commit_sha": detail.get("commit_sha"),
            },
        },
    )
    return 4


def _str_keys(entry: dict[Any, Any]) -> dict[str, Any]:
    return {str(k): v for k, v in entry.items()}  # pyright: ignore[reportUnknownVariableType]


# --- upload ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalFile:
    path: str  # relative, POSIX
    source: Path
    size: int
    sha256: str
    inode: int
    mtime_ns: int


@dataclass(frozen=True)
class UploadPlan:
    run_dir: Path
    local_run_id: str
    manifest_digest: str
    run: dict[str, object]
    schema_versions: dict[str, object]
    provenance: dict[str, object]
    files: list[LocalFile]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise LocalFileError(
            f"{path} is missing: {path.parent} is not a complete local eval run.",
            {"run_dir": str(path.parent)},
        ) from None
    except ValueError as exc:
        raise LocalFileError(f"{path} is not valid JSON ({exc}).", {"path": str(path)}) from None


def _local_file(run_dir: Path, relative: str) -> LocalFile:
    path = run_dir / relative
    status = path.lstat()
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return LocalFile(
        relative, path, status.st_size, digest.hexdigest(), status.st_ino, status.st_mtime_ns
    )


def plan_upload(run_dir: Path) -> UploadPlan:
    """Check that ``run_dir`` is a complete local run and list (and hash) what to send."""
    from osmosis_ai.eval.projections import INDEX_FILE, METRICS_FILE, PROGRESS_FILE
    from osmosis_ai.eval.rundir import MANIFEST_FILE

    run_dir = run_dir.expanduser().resolve()
    if not run_dir.is_dir():
        raise LocalFileError(
            f"{run_dir} is not a directory: pass a run dir such as .osmosis/evals/<run-name>.",
            {"run_dir": str(run_dir)},
        )
    manifest_path = run_dir / MANIFEST_FILE
    manifest_bytes = manifest_path.read_bytes() if manifest_path.is_file() else b""
    manifest = _read_json(manifest_path)
    if not isinstance(manifest, dict):
        raise LocalFileError(f"{manifest_path} is not a run manifest.")
    local_run_id = str(manifest.get("local_run_id", ""))  # pyright: ignore[reportUnknownArgumentType, reportUnknownMemberType]
    if manifest.get("schema_version") != 1 or not re.fullmatch(r"[0-9a-f]{32}", local_run_id):  # pyright: ignore[reportUnknownMemberType]
        raise LocalFileError(
            f"{manifest_path} is not a manifest this CLI can upload (schema 1, a 32-hex "
            "local_run_id).",
        )
    if manifest.get("run_name") != run_dir.name:  # pyright: ignore[reportUnknownMemberType]
        raise LocalFileError(
            f"{manifest_path} names run {manifest.get('run_name')!r}, not the folder's name "  # pyright: ignore[reportUnknownMemberType]
            f"{run_dir.name!r}; upload the run dir as `osmosis eval run` wrote it.",
        )
    inputs: dict[str, Any] = manifest.get("inputs") or {}  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType, reportAssignmentType]
    entries = (
        [
            json.loads(line)
            for line in (run_dir / INDEX_FILE).read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        if (run_dir / INDEX_FILE).is_file()
        else []
    )
    progress = _read_json(run_dir / PROGRESS_FILE)
    total = progress.get("total_runs") if isinstance(progress, dict) else None  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if not entries or total != len(entries):
        raise LocalFileError(
            f"The run {run_dir.name} is not complete ({len(entries)} of {total} work items have "
            "a result): resume it with osmosis eval run --name "
            f"{run_dir.name}, then upload it.",
            {"run_dir": str(run_dir), "indexed": len(entries), "total": total},
        )
    metrics = _read_json(run_dir / METRICS_FILE)
    block: dict[str, Any] = metrics.get("eval_run", {}) if isinstance(metrics, dict) else {}  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    summary: dict[str, Any] = metrics.get("summary", {}) if isinstance(metrics, dict) else {}  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    rollout: dict[str, Any] = inputs.get("rollout") or {}
    files = _upload_files(run_dir, entries, INDEX_FILE)
    run: dict[str, object] = {
        "name": run_dir.name,
        "dataset_name": block.get("dataset_name") or "",
        "model_path": inputs.get("model_path") or block.get("model_name") or "",
        "rollout_name": rollout.get("name") or block.get("rollout_name") or "",
        "entrypoint": rollout.get("entrypoint") or "",
        "pass_threshold": summary.get("pass_threshold", 1.0),
        "n": inputs.get("n", 1),
        "started_at": block.get("started_at"),
        "completed_at": block.get("completed_at"),
        "duration_ms": block.get("duration_ms"),
    }
    provenance: dict[str, Any] = manifest.get("provenance") or {}  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType, reportAssignmentType]
    return UploadPlan(
        run_dir=run_dir,
        local_run_id=local_run_id,
        manifest_digest=hashlib.sha256(manifest_bytes).hexdigest(),
        run=run,
        schema_versions={"manifest": 1, "index": 1},
        provenance=dict(provenance),
        files=files,
    )


def _upload_files(run_dir: Path, entries: list[Any], index_file: str) -> list[LocalFile]:
    """The index, then each entry's trajectory and artifacts (regular files only)."""
    files = [_local_file(run_dir, index_file)]
    for entry in entries:
        stem = f"row_{entry['row_index']}_run_{entry['run_index']}"
        trajectory = run_dir / "trajectories" / f"{stem}.json"
        if trajectory.is_file() and not trajectory.is_symlink():
            document = _read_json(trajectory)
            if not isinstance(document, dict) or document.get("session_id") != entry["rollout_id"]:  # pyright: ignore[reportUnknownMemberType]
                raise LocalFileError(
                    f"{trajectory} is not the trajectory of rollout {entry['rollout_id']}; "
                    f"rebuild the run's projections (osmosis eval run --name {run_dir.name}).",
                )
            files.append(_local_file(run_dir, f"trajectories/{stem}.json"))
        artifacts = run_dir / "artifacts" / stem
        if artifacts.is_dir() and not artifacts.is_symlink():
            for folder, dirs, names in os.walk(artifacts, followlinks=False):
                dirs.sort()
                for name in sorted(names):
                    path = Path(folder) / name
                    if path.is_symlink() or not path.is_file():
                        continue
                    relative = path.relative_to(run_dir).as_posix()
                    if _UPLOADABLE.match(relative):
                        files.append(_local_file(run_dir, relative))
    return files


def _unchanged(item: LocalFile) -> None:
    try:
        status = item.source.lstat()
    except OSError:
        status = None
    if (
        status is None
        or status.st_size != item.size
        or status.st_ino != item.inode
        or status.st_mtime_ns != item.mtime_ns
    ):
        raise LocalRunBusyError(
            f"{item.source} changed during the upload; wait for the run to settle, then "
            "upload again (what was sent is kept and not sent twice).",
            {"path": item.path},
        )


def upload_run(client: PlatformClient, plan: UploadPlan) -> dict[str, object]:
    """Send ``plan`` to the platform (resuming an earlier upload of the same run) and
    finalize it; the finalize answer."""
    body = {
        "schema_version": 1,
        "local_run_id": plan.local_run_id,
        "manifest_digest": plan.manifest_digest,
        "run": plan.run,
        "schema_versions": plan.schema_versions,
        "provenance": plan.provenance,
        "files": [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in plan.files],
    }
    opened = client.call("POST", f"{RUNS_PATH}/imports", json=body)
    session_id = str(opened.get("session_id"))
    base = f"{RUNS_PATH}/imports/{segment(session_id)}"
    by_path = {f.path: f for f in plan.files}
    states = {
        str(f.get("path")): str(f.get("state"))
        for f in opened.get("files", [])
        if isinstance(f, dict)
    }
    pending = [f for f in plan.files if states.get(f.path) != "uploaded"]
    sent = 0
    if opened.get("status") != "finalized":
        with transfers_for(client) as transfers:
            for start in range(0, len(pending), UPLOAD_BATCH):
                batch = pending[start : start + UPLOAD_BATCH]
                answer = client.call(
                    "POST", f"{base}/uploads", json={"paths": [f.path for f in batch]}
                )
                for signed in answer.get("files", []):
                    if not isinstance(signed, dict):
                        continue
                    item = by_path[str(signed.get("path"))]  # pyright: ignore[reportUnknownArgumentType]
                    _unchanged(item)
                    instructions = client.model(
                        UploadInstructions,
                        signed.get("upload") or {},
                        f"POST {base}/uploads",  # pyright: ignore[reportUnknownArgumentType]
                    )
                    transfers.upload(instructions, item.source)
                    client.call("POST", f"{base}/uploads/complete", json={"path": item.path})
                    sent += 1
    finalized = client.call("POST", f"{base}/finalize", json={}, timeout=FINALIZE_TIMEOUT_S)
    return {
        **finalized,
        "local_run_id": plan.local_run_id,
        "files": len(plan.files),
        "uploaded_files": sent,
        "bytes": sum(f.size for f in plan.files),
    }


def lock_run(plan_dir: Path) -> RunLock:
    """Hold the local run's lock (as ``osmosis eval run`` does) while it is uploaded."""
    from osmosis_ai.eval.rundir import RunLock, RunLockedError

    try:
        return RunLock.acquire(plan_dir.parent, plan_dir.name)
    except RunLockedError as exc:
        raise LocalRunBusyError(str(exc), {"run_dir": str(plan_dir)}) from None


@dataclass(frozen=True)
class UploadedRun:
    plan: UploadPlan
    answer: dict[str, object]  # the finalize answer, with the upload's counts


def upload_local_run(client: PlatformClient, run_dir: Path) -> UploadedRun:
    """Import the completed local run at ``run_dir``, holding its lock (as ``osmosis eval
    run`` does) meanwhile; an interrupted upload resumes where it stopped."""
    lock = lock_run(run_dir)
    try:
        plan = plan_upload(run_dir)
        answer = upload_run(client, plan)
    finally:
        lock.release()
    return UploadedRun(plan, answer)
