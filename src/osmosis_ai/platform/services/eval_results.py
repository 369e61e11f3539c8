"""The results of eval runs: metrics, the samples manifest and its downloads, retrying failed
items, and importing local runs (reference §5.7, §5.9, §6.1, §6.4).

* Metrics are recomputed from the stored samples with the same aggregation as a local run
  (:func:`osmosis_ai.eval.metrics.aggregate_metrics`), so a managed run, an imported one
  and ``osmosis eval run`` count alike.
* The manifest lists a run's downloadable files under the paths of a local run dir
  (``metrics.json``, ``summary.jsonl``, ``trajectories/row_<r>_run_<n>.json``,
  ``artifacts/row_<r>_run_<n>/…``, ``logs.txt``); each carries a ``token`` (the object's
  key under the run) that ``download-urls`` turns into a signed GET of 15 minutes.
* A retry puts an ended run back to ``pending`` with ``results.retry_failed`` set: the eval
  job then runs its failed and skipped items again, and the pending ones.
* An import is a session keyed by ``(local_run_id, manifest digest)``: asking again answers
  the same session, so an interrupted upload resumes where it stopped. Finalizing reads the
  uploaded ``index.jsonl`` and trajectories into the run's samples and recomputes its
  metrics; the run then is a ``finished`` eval run like any other.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets as random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, cast

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from osmosis_ai.platform.errors import ConflictError, InvalidRequestError, NotFoundError
from osmosis_ai.platform.objects import InvalidObjectKeyError, ObjectNotFoundError, check_key
from osmosis_ai.platform.services import storage
from osmosis_ai.platform.services.accounts import require_creator_or_manager
from osmosis_ai.platform.services.runs import (
    TERMINAL,
    add_log,
    finish,
    get_run,
    seal_secrets,
)
from osmosis_ai.platform.store.orm import EvalImport, Run, RunLog, RunSample, User

if TYPE_CHECKING:
    from osmosis_ai.eval.metrics import EvalMetrics
    from osmosis_ai.platform.crypto import SecretBox
    from osmosis_ai.platform.objects import ObjectStore, UrlSigner
    from osmosis_ai.platform.services.accounts import WorkspaceAccess

DOWNLOAD_EXPIRES_IN = 900
MAX_DOWNLOAD_ITEMS = 500
MAX_UPLOAD_PATHS = 100
IMPORT_EXPIRES = timedelta(days=1)
MAX_TRAJECTORY_BYTES = 64 * 1024 * 1024  # each is parsed whole at finalize
ENDED_IMPORTS = ("failed", "expired")  # its run failed; asking again starts a new session
UPLOAD_EXPIRES_IN = 3600
CONTENT_TYPE = "application/octet-stream"
SAMPLE_TYPES = ("metrics", "trajectories", "artifacts", "logs")
DEFAULT_TYPES = ("metrics", "trajectories")
RETRY_FLAG = "retry_failed"
OVERVIEW_KEYS = (
    "total_samples",
    "completed_samples",
    "graded",
    "passed",
    "failed",
    "skipped",
    "pass_rate",
    "pass_threshold",
    "tokens_used",
)
INDEX_PATH = "index.jsonl"
_STEM = re.compile(r"^(?:trajectories/row_(\d+)_run_(\d+)\.json|artifacts/row_(\d+)_run_(\d+)/.+)$")
_HEX32 = re.compile(r"^[0-9a-f]{32}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def run_prefix(run_id: str) -> str:
    return f"runs/{run_id}"


# --- metrics ---------------------------------------------------------------------------------


def evaluation_settings(run: Run) -> tuple[float, int]:
    """``(pass_threshold, n)`` of the run's ``[evaluation]`` (defaults 1.0 and 1)."""
    table = run.evaluation_config or {}
    threshold, n = table.get("pass_threshold", 1.0), table.get("n", 1)
    threshold = float(threshold) if isinstance(threshold, int | float) else 1.0
    return threshold, n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else 1


def stored_samples(session: Session, run_id: str) -> list[RunSample]:
    query = (
        select(RunSample)
        .where(RunSample.run_id == run_id)
        .order_by(RunSample.row_index, RunSample.run_index)
    )
    return list(session.scalars(query))


@dataclass(frozen=True, slots=True)
class _Scored:
    row_index: int
    status: str
    reward: float | None
    tokens: int | None


def aggregate(run: Run, samples: Iterable[RunSample]) -> EvalMetrics:
    from osmosis_ai.eval.metrics import aggregate_metrics

    threshold, n = evaluation_settings(run)
    scored = [_Scored(s.row_index, s.status, s.reward, s.tokens) for s in samples]
    return aggregate_metrics(scored, threshold, n)


def duration_ms(run: Run, now: datetime) -> int:
    if run.started_at is None:
        return 0
    end = run.completed_at or now
    return max(0, round((end - run.started_at).total_seconds() * 1000))


def run_metrics(session: Session, run: Run, *, now: datetime) -> dict[str, object]:
    """``EvalRunMetrics`` (reference §5.7): overview, reward stats and pass@k, plus the
    ``eval_run`` block and ``summary`` a local ``metrics.json`` holds."""
    summary = aggregate(run, stored_samples(session, run.id)).to_json()
    duration = duration_ms(run, now)
    overview: dict[str, object] = {"duration_ms": duration}
    overview.update({key: summary[key] for key in OVERVIEW_KEYS})
    return {
        "status": run.status,
        "eval_run": eval_run_block(run, duration),
        "overview": overview,
        "reward_stats": summary.get("reward_stats"),
        "n_runs": summary.get("n_runs"),
        "pass_at_k": summary.get("pass_at_k") or [],
        "summary": summary,
    }


def eval_run_block(run: Run, duration: int) -> dict[str, object]:
    """The ``eval_run`` block of ``metrics.json``."""
    block: dict[str, object] = {
        "id": run.id,
        "status": run.status,
        "name": run.name,
        "dataset_name": run.dataset_name,
        "model_name": run.model_path,
        "rollout_name": run.rollout_name,
        "duration_ms": duration,
        "started_at": _iso(run.started_at),
        "completed_at": _iso(run.completed_at),
    }
    return {k: v for k, v in block.items() if v is not None}


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


def index_entry(sample: RunSample) -> dict[str, object]:
    """A sample as a line of ``summary.jsonl`` (``index.jsonl`` of a local run)."""
    entry: dict[str, object | None] = {
        "row_index": sample.row_index,
        "run_index": sample.run_index,
        "rollout_id": sample.rollout_id,
        "trajectory_filename": "trajectory.json" if sample.trajectory_key else None,
        "status": sample.status,
        "reward": sample.reward,
        "tokens": sample.tokens,
        "duration_ms": sample.duration_ms or 0,
        "error_type": sample.error_type,
    }
    return {k: v for k, v in entry.items() if v is not None}


# --- the samples manifest --------------------------------------------------------------------


@dataclass(frozen=True)
class ManifestFile:
    path: str
    size: int
    token: str


def parse_types(text: str | None) -> tuple[str, ...]:
    """``metrics,trajectories`` → the file types to list; ``all`` is every type."""
    if text is None or not text.strip():
        return DEFAULT_TYPES
    names = [part.strip() for part in text.split(",") if part.strip()]
    if "all" in names:
        return SAMPLE_TYPES
    unknown = [name for name in names if name not in SAMPLE_TYPES]
    if unknown:
        raise InvalidRequestError(
            f"unknown sample types {unknown}: use any of {', '.join(SAMPLE_TYPES)}, or all",
            field="types",
        )
    return tuple(name for name in SAMPLE_TYPES if name in names)


def parse_rows(spec: str | None) -> frozenset[int] | None:
    """``3,7,10-20`` → those row indexes (``None``: every row)."""
    if spec is None or not spec.strip():
        return None
    chosen: set[int] = set()
    for part in spec.split(","):
        low, _, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high or low)
        except ValueError:
            raise InvalidRequestError(
                f"rows {spec!r}: {part.strip()!r} is not a row (7) or a range (10-20)",
                field="rows",
            ) from None
        if first < 0 or last < first:
            raise InvalidRequestError(
                f"rows {spec!r}: {part.strip()!r} is not an ascending range of rows",
                field="rows",
            )
        if last - first > 1_000_000:
            raise InvalidRequestError(f"rows {spec!r}: the range is too long", field="rows")
        chosen.update(range(first, last + 1))
    return frozenset(chosen)


def samples_manifest(
    session: Session,
    run: Run,
    store: ObjectStore,
    *,
    types: Sequence[str],
    rows: frozenset[int] | None,
    now: datetime,
) -> tuple[list[ManifestFile], dict[str, object]]:
    """The files of ``run`` to download, and their totals."""
    prefix = run_prefix(run.id)
    samples = [s for s in stored_samples(session, run.id) if rows is None or s.row_index in rows]
    kept = {(s.row_index, s.run_index) for s in samples}
    files: list[ManifestFile] = []

    def add(path: str, token: str) -> None:
        files.append(ManifestFile(path, store.stat(f"{prefix}/{token}").size, token))

    if "metrics" in types:
        metrics = run_metrics(session, run, now=now)
        document = {"eval_run": metrics["eval_run"], "summary": metrics["summary"]}
        store.put(f"{prefix}/files/metrics.json", _json_document(document))
        add("metrics.json", "files/metrics.json")
        lines = "".join(_compact(index_entry(s)) + "\n" for s in samples)
        store.put(f"{prefix}/files/summary.jsonl", lines.encode("utf-8"))
        add("summary.jsonl", "files/summary.jsonl")
    if "trajectories" in types:
        for sample in samples:
            key = sample.trajectory_key
            if key and key.startswith(prefix + "/") and store.exists(key):
                add(
                    f"trajectories/row_{sample.row_index}_run_{sample.run_index}.json",
                    key[len(prefix) + 1 :],
                )
    if "artifacts" in types:
        for info in store.list(f"{prefix}/artifacts"):
            token = info.key[len(prefix) + 1 :]
            match = _STEM.match(token)
            if match is not None and (int(match[3]), int(match[4])) in kept:
                files.append(ManifestFile(token, info.size, token))
    if "logs" in types:
        if not store.exists(f"{prefix}/files/logs.txt") or run.status not in TERMINAL["eval"]:
            store.put(f"{prefix}/files/run-logs.txt", _log_text(session, run.id))
            add("logs.txt", "files/run-logs.txt")
        else:
            add("logs.txt", "files/logs.txt")
    totals: dict[str, object] = {
        "files": len(files),
        "bytes": sum(f.size for f in files),
        "samples": len(samples),
        "types": list(types),
    }
    return files, totals


def _log_text(session: Session, run_id: str) -> bytes:
    query = select(RunLog).where(RunLog.run_id == run_id).order_by(RunLog.id)
    lines = []
    for entry in session.scalars(query):
        details = f" {_compact(entry.details)}" if entry.details else ""
        stamp = _iso(entry.timestamp) or ""
        lines.append(f"{stamp} {entry.level.upper()} [{entry.step}] {entry.message}{details}\n")
    return "".join(lines).encode("utf-8")


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)


def _json_document(value: object) -> bytes:
    return (json.dumps(value, indent=2, sort_keys=True, allow_nan=False) + "\n").encode("utf-8")


@dataclass(frozen=True)
class DownloadUrl:
    path: str
    url: str
    token: str


def download_urls(
    run: Run,
    store: ObjectStore,
    signer: UrlSigner,
    base_url: str,
    items: Sequence[tuple[str, str]],
) -> list[DownloadUrl]:
    """Signed GETs (15 minutes) for ``(token, path)`` pairs of the run's manifest."""
    if len(items) > MAX_DOWNLOAD_ITEMS:
        raise InvalidRequestError(
            f"{len(items)} items requested: ask for at most {MAX_DOWNLOAD_ITEMS} at a time",
            field="items",
        )
    prefix = run_prefix(run.id)
    found: list[DownloadUrl] = []
    for token, path in items:
        try:
            key = f"{prefix}/{check_key(token)}"
        except InvalidObjectKeyError:
            raise InvalidRequestError(
                f"{token!r} is not a file of this run", field="items"
            ) from None
        if not store.exists(key):
            raise NotFoundError(
                f"the file {path!r} ({token}) of eval run {run.name!r} is gone; list the files "
                "again (GET …/samples/manifest)",
                code="SAMPLE_FILE_NOT_FOUND",
            )
        name = path.rsplit("/", 1)[-1] or token.rsplit("/", 1)[-1]
        url = signer.url(base_url, "get", key, {"name": name}, expires_in=DOWNLOAD_EXPIRES_IN)
        found.append(DownloadUrl(path, url, token))
    return found


# --- retry -----------------------------------------------------------------------------------


def retry_run(
    session: Session,
    workspace: WorkspaceAccess,
    user_id: str,
    name_or_id: str,
    *,
    provided: Mapping[str, str],
    box: SecretBox,
    now: datetime,
) -> tuple[Run, int]:
    """Queue an ended run again to re-run its failed items; ``(run, items to re-run)``."""
    run = get_run(session, workspace, "eval", name_or_id)
    require_creator_or_manager(
        workspace,
        user_id,
        run.creator_id,
        action="retry",
        what=f"eval run {run.name!r}",
        code="RUN_RETRY_FORBIDDEN",
    )
    if run.status not in TERMINAL["eval"]:
        raise ConflictError(
            f"The eval run {run.name!r} is {run.status}: only a run that ended can be retried.",
            code="RUN_NOT_ENDED",
            details={"status": run.status},
        )
    imported = session.scalar(select(EvalImport.id).where(EvalImport.run_id == run.id))
    if imported is not None:
        raise ConflictError(
            f"The eval run {run.name!r} was imported from a local run: rerun it locally with "
            "osmosis eval run --retry-failed, then upload it again.",
            code="RUN_IMPORTED",
        )
    failed = session.scalar(
        select(func.count())
        .select_from(RunSample)
        .where(RunSample.run_id == run.id, RunSample.status.in_(("failed", "skipped")))
    )
    count = int(failed or 0)
    if count == 0 and run.status == "finished":
        raise ConflictError(
            f"The eval run {run.name!r} has no failed items to retry.", code="NOTHING_TO_RETRY"
        )
    given = [name for name, scope in run.secret_scopes.items() if scope == "provided"]
    missing = [name for name in given if not provided.get(name)]
    if missing:
        raise InvalidRequestError(
            f"The eval run {run.name!r} was given {', '.join(missing)} at submit and those "
            "values are not kept once a run ends: pass them again (--secrets-file).",
            code="SECRETS_MISSING",
            details={"missing": missing},
        )
    run.provided_secrets = seal_secrets(box, run.id, {n: provided[n] for n in given})
    run.status = "pending"
    run.attempts_base = run.attempt  # lost attempts count afresh from here
    run.completed_at = None
    run.error = None
    run.worker_id = None
    run.lease_expires_at = None
    run.results = {**(run.results or {}), RETRY_FLAG: True}
    run.updated_at = now
    who = session.get(User, user_id)
    add_log(
        session,
        run,
        now,
        "retry",
        f"Retry requested by {who.email if who else user_id}: {count} failed or skipped items "
        "run again, with any pending ones",
        details={"failed_items": count},
    )
    return run, count


# --- importing local runs --------------------------------------------------------------------


@dataclass(frozen=True)
class ImportFile:
    path: str
    size: int
    sha256: str


@dataclass(frozen=True)
class ImportRequest:
    local_run_id: str
    manifest_digest: str
    run: Mapping[str, object]
    schema_versions: Mapping[str, object]
    provenance: Mapping[str, object]
    files: Sequence[ImportFile]


def import_key(run_id: str, path: str) -> str:
    """Where an uploaded file of a local run is kept (the paths a managed run uses)."""
    if path == INDEX_PATH:
        return f"{run_prefix(run_id)}/files/{INDEX_PATH}"
    return f"{run_prefix(run_id)}/{path}"


def _check_import(request: ImportRequest) -> None:
    if not _HEX32.match(request.local_run_id):
        raise InvalidRequestError(
            f"local_run_id {request.local_run_id!r} is not 32 hex digits", field="local_run_id"
        )
    if not _SHA256.match(request.manifest_digest):
        raise InvalidRequestError(
            "manifest_digest must be the manifest's SHA-256 in hex", field="manifest_digest"
        )
    paths = [f.path for f in request.files]
    if len(set(paths)) != len(paths):
        raise InvalidRequestError("files name a path more than once", field="files")
    if INDEX_PATH not in paths:
        raise InvalidRequestError(f"files must include {INDEX_PATH}", field="files")
    for item in request.files:
        if item.path != INDEX_PATH and not _STEM.match(item.path):
            raise InvalidRequestError(
                f"{item.path!r} is not a file of a local run that can be uploaded "
                f"({INDEX_PATH}, trajectories/row_<r>_run_<n>.json, artifacts/row_<r>_run_<n>/…)",
                field="files",
            )
        try:
            check_key(item.path)
        except InvalidObjectKeyError as exc:
            raise InvalidRequestError(str(exc), field="files") from None
        if item.size < 0 or not _SHA256.match(item.sha256):
            raise InvalidRequestError(
                f"{item.path!r}: a size and a hex SHA-256 are needed", field="files"
            )
        storage.check_file_size(item.size, name=repr(item.path), field="files")
        if item.path.startswith("trajectories/") and item.size > MAX_TRAJECTORY_BYTES:
            raise InvalidRequestError(
                f"{item.path!r} declares {item.size} bytes; a trajectory is read whole when "
                f"the import is finalized, so it may hold at most {MAX_TRAJECTORY_BYTES} bytes",
                field="files",
                code="FILE_TOO_LARGE",
            )
    for key in ("name", "model_path", "dataset_name", "rollout_name"):
        if not isinstance(request.run.get(key), str) or not request.run.get(key):
            raise InvalidRequestError(f"run.{key} is required", field=f"run.{key}")


def open_import(
    session: Session,
    workspace: WorkspaceAccess,
    user_id: str,
    request: ImportRequest,
    *,
    now: datetime,
    quota_bytes: int,
) -> EvalImport:
    """The import session of this local run (the existing one when asked again).

    A new one is refused before anything is made when a file is over the one-file limit or
    the files would take the workspace past ``quota_bytes``."""
    found = session.scalar(
        select(EvalImport).where(
            EvalImport.workspace_id == workspace.id,
            EvalImport.local_run_id == request.local_run_id,
            EvalImport.manifest_digest == request.manifest_digest,
        )
    )
    if found is not None and found.status not in ENDED_IMPORTS:
        return found
    if found is not None:  # it failed or expired: its run stays as history, this starts over
        session.delete(found)
        session.flush()
    _check_import(request)
    storage.check_room(
        session, workspace.id, sum(f.size for f in request.files), quota_bytes=quota_bytes
    )
    info = request.run
    threshold = info.get("pass_threshold", 1.0)
    n = info.get("n", 1)
    provenance = dict(request.provenance)
    started = _parse_time(info.get("started_at")) or now
    run = Run(
        workspace_id=workspace.id,
        kind="eval",
        status="running",  # no lease: no worker claims it
        creator_id=user_id,
        rollout_name=str(info["rollout_name"]),
        entrypoint=str(info.get("entrypoint") or ""),
        branch=_text(provenance.get("git_branch")),
        commit_sha=_text(provenance.get("git_head")) or "",
        model_path=str(info["model_path"]),
        dataset_name=str(info["dataset_name"]),
        experiment_config={
            "rollout": info["rollout_name"],
            "entrypoint": info.get("entrypoint") or "",
            "model_path": info["model_path"],
            "dataset": info["dataset_name"],
        },
        evaluation_config={
            "pass_threshold": float(threshold) if isinstance(threshold, int | float) else 1.0,
            "n": n if isinstance(n, int) and n >= 1 else 1,
        },
        required_secrets=[],
        secret_scopes={},
        started_at=started,
        created_at=now,
        updated_at=now,
    )
    _insert_named(session, run, str(info["name"]))
    add_log(
        session,
        run,
        now,
        "import",
        f"Import of local run {info['name']} ({request.local_run_id}) started: "
        f"{len(request.files)} files",
    )
    imported = EvalImport(
        workspace_id=workspace.id,
        run_id=run.id,
        creator_id=user_id,
        local_run_id=request.local_run_id,
        manifest_digest=request.manifest_digest,
        status="uploading",
        files=[
            {"path": f.path, "size": f.size, "sha256": f.sha256, "state": "pending"}
            for f in request.files
        ],
        payload={
            "run": dict(info),
            "schema_versions": dict(request.schema_versions),
            "provenance": provenance,
        },
        expires_at=now + IMPORT_EXPIRES,
        created_at=now,
    )
    session.add(imported)
    session.flush()
    return imported


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else None


def _insert_named(session: Session, run: Run, name: str) -> None:
    """Insert ``run`` as ``name``, or ``name-2``, ``name-3``… when that name is taken."""
    base = name[:90]
    taken = set(
        session.scalars(
            select(Run.name).where(Run.workspace_id == run.workspace_id, Run.name.like(f"{base}%"))
        )
    )
    candidate, k = base, 2
    while candidate in taken:
        candidate, k = f"{base}-{k}", k + 1
    run.name = candidate
    session.add(run)
    session.flush()


def get_import(session: Session, workspace: WorkspaceAccess, session_id: str) -> EvalImport:
    found = session.get(EvalImport, session_id)
    if found is None or found.workspace_id != workspace.id:
        raise NotFoundError(
            f"No import session {session_id!r}; start the upload again with osmosis eval upload",
            code="IMPORT_NOT_FOUND",
        )
    return found


def _open(imported: EvalImport) -> None:
    if imported.status != "uploading":
        raise ConflictError("this import was finalized already", code="IMPORT_FINALIZED")


@dataclass(frozen=True)
class SignedUpload:
    path: str
    size: int
    sha256: str
    url: str


def sign_uploads(
    imported: EvalImport,
    paths: Sequence[str],
    store: ObjectStore,
    signer: UrlSigner,
    base_url: str,
) -> list[SignedUpload]:
    """An upload (a signed PUT) for each of ``paths``; a path asked again gets a new one."""
    _open(imported)
    if len(paths) > MAX_UPLOAD_PATHS:
        raise InvalidRequestError(
            f"ask for at most {MAX_UPLOAD_PATHS} paths at a time", field="paths"
        )
    files = [dict(item) for item in imported.files]
    by_path = {str(item["path"]): item for item in files}
    signed: list[SignedUpload] = []
    for path in paths:
        item = by_path.get(path)
        if item is None:
            raise NotFoundError(
                f"{path!r} is not a file of this import", code="IMPORT_FILE_NOT_FOUND"
            )
        size = cast(int, item["size"])
        key = import_key(imported.run_id, path)
        upload_id = random.token_hex(16)
        store.start_upload(key, upload_id)
        item["upload_id"] = upload_id
        params = {"upload_id": upload_id, "size": str(size), "content_type": CONTENT_TYPE}
        url = signer.url(base_url, "put", key, params, expires_in=UPLOAD_EXPIRES_IN)
        signed.append(SignedUpload(path, size, str(item["sha256"]), url))
    imported.files = files
    return signed


def complete_file(imported: EvalImport, path: str, store: ObjectStore) -> dict[str, object]:
    """Keep an uploaded file once its size and SHA-256 are what the session named."""
    _open(imported)
    files = [dict(item) for item in imported.files]
    item = next((f for f in files if f.get("path") == path), None)
    if item is None:
        raise NotFoundError(f"{path!r} is not a file of this import", code="IMPORT_FILE_NOT_FOUND")
    key = import_key(imported.run_id, path)
    size = cast(int, item["size"])
    if item.get("state") != "uploaded":
        upload_id = item.get("upload_id")
        if not isinstance(upload_id, str):
            raise ConflictError(
                f"{path!r} was never sent: request its upload first", code="NOT_UPLOADED"
            )
        try:
            store.complete_upload(upload_id, None, size=size)
        except ObjectNotFoundError:
            if not store.exists(key):
                raise
        digest = _sha256(store, key)
        if digest != item["sha256"]:
            store.delete(key)
            raise InvalidRequestError(
                f"{path!r} arrived with SHA-256 {digest}, not the {item['sha256']} named at the "
                "start: it changed during the upload; upload it again",
                code="CHECKSUM_MISMATCH",
            )
        item["state"] = "uploaded"
        item.pop("upload_id", None)
    imported.files = files
    return item


def _sha256(store: ObjectStore, key: str) -> str:
    digest = hashlib.sha256()
    with store.open(key) as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def finalize_import(
    session: Session, imported: EvalImport, store: ObjectStore, *, now: datetime
) -> Run:
    """Read the uploaded index and trajectories into samples; the run ends ``finished``."""
    run = session.get(Run, imported.run_id)
    assert run is not None
    if imported.status == "finalized":
        return run
    waiting = [str(f["path"]) for f in imported.files if f.get("state") != "uploaded"]
    if waiting:
        raise ConflictError(
            f"{len(waiting)} files are not uploaded yet (e.g. {waiting[0]}); upload them, then "
            "finalize",
            code="IMPORT_INCOMPLETE",
            details={"pending": waiting[:20]},
        )
    uploaded = {str(f["path"]) for f in imported.files}
    samples = _imported_samples(run, store, uploaded, now)
    for sample in samples:
        session.merge(sample)
    session.flush()
    metrics = aggregate(run, samples)
    info = imported.payload.get("run")
    completed = _parse_time(info.get("completed_at")) if isinstance(info, dict) else None
    finish(run, "finished", now=completed or now)
    run.updated_at = now
    summary = metrics.to_json()
    run.results = {**summary, "duration_ms": duration_ms(run, now), "pending": 0}
    run.reward = metrics.reward_stats.mean if metrics.reward_stats is not None else None
    run.total_steps = run.current_step = run.examples_processed_count = len(samples)
    imported.status = "finalized"
    add_log(
        session,
        run,
        now,
        "import",
        f"Imported {len(samples)} samples: {metrics.passed} of {metrics.completed_samples} "
        f"passed ({metrics.pass_rate:.1%})",
    )
    return run


def fail_import(
    session: Session,
    imported: EvalImport,
    store: ObjectStore,
    *,
    reason: str,
    now: datetime,
    status: str = "failed",
) -> Run:
    """End an import that cannot finish: its run ``failed`` with ``reason`` in its log, the
    files it received dropped. Asking for the same import again starts a new session."""
    run = session.get(Run, imported.run_id)
    assert run is not None
    for item in imported.files:
        upload_id = item.get("upload_id")
        if isinstance(upload_id, str):
            store.abort_upload(upload_id)
    store.delete_prefix(run_prefix(run.id))
    imported.status = status
    if run.status not in TERMINAL["eval"]:
        finish(run, "failed", now=now)
        run.error = reason
    run.updated_at = now
    add_log(session, run, now, "import", reason, level="error")
    return run


def expire_imports(session: Session, store: ObjectStore, *, now: datetime) -> int:
    """End every import still uploading after its session expired (:func:`fail_import`)."""
    expired = list(
        session.scalars(
            select(EvalImport).where(EvalImport.status == "uploading", EvalImport.expires_at < now)
        )
    )
    for imported in expired:
        uploaded = sum(1 for f in imported.files if f.get("state") == "uploaded")
        fail_import(
            session,
            imported,
            store,
            reason=(
                f"The import expired unfinished at {imported.expires_at.isoformat()} "
                f"({uploaded} of {len(imported.files)} files uploaded); its files were "
                "dropped. Upload the run again with osmosis eval upload."
            ),
            now=now,
            status="expired",
        )
    session.flush()
    return len(expired)


def _imported_samples(
    run: Run, store: ObjectStore, uploaded: set[str], now: datetime
) -> list[RunSample]:
    from osmosis_ai.errors import UsageError
    from osmosis_ai.eval.journal import JournalRecord

    samples: list[RunSample] = []
    seen: set[tuple[int, int]] = set()
    for number, line in enumerate(_index_lines(store, import_key(run.id, INDEX_PATH)), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            if not isinstance(raw, dict):
                raise UsageError("not a JSON object")
            record = JournalRecord.from_json(cast("dict[str, object]", raw))
        except (ValueError, UsageError) as exc:
            raise InvalidRequestError(
                f"{INDEX_PATH} line {number} is not an index entry ({exc})"
            ) from None
        if record.key in seen:
            raise InvalidRequestError(
                f"{INDEX_PATH} names row {record.row_index} run {record.run_index} twice"
            )
        seen.add(record.key)
        path = f"trajectories/row_{record.row_index}_run_{record.run_index}.json"
        trajectory_key = None
        tokens = record.tokens
        if path in uploaded:
            trajectory_key = import_key(run.id, path)
            document = _document(store, trajectory_key)
            if document.get("session_id") != record.rollout_id:
                raise InvalidRequestError(
                    f"{path} is the trajectory of another rollout, not {record.rollout_id}",
                    code="TRAJECTORY_MISMATCH",
                )
            if tokens is None:
                from osmosis_ai.eval.projections import trajectory_tokens

                tokens = trajectory_tokens(document)
        samples.append(
            RunSample(
                run_id=run.id,
                row_index=record.row_index,
                run_index=record.run_index,
                rollout_id=record.rollout_id,
                status=record.status,
                reward=record.reward,
                tokens=tokens,
                duration_ms=record.duration_ms,
                error_type=record.error_type,
                trajectory_key=trajectory_key,
                attempt=1,
                created_at=now,
            )
        )
    return samples


def _index_lines(store: ObjectStore, key: str) -> Iterator[str]:
    """The index's lines, read a line at a time (never the whole file at once)."""
    with store.open(key) as handle:
        for raw in handle:
            yield raw.decode("utf-8", errors="replace").rstrip("\r\n")


def _document(store: ObjectStore, key: str) -> dict[str, object]:
    with store.open(key) as handle:
        try:
            document = json.loads(handle.read())
        except ValueError:
            document = None
    if not isinstance(document, dict):
        raise InvalidRequestError(f"{key.rsplit('/', 1)[-1]} is not a JSON trajectory")
    return cast("dict[str, object]", document)


def import_session(imported: EvalImport, run: Run) -> dict[str, object]:
    """The session as ``POST …/imports`` answers it."""
    files = [
        {"path": f["path"], "size": f["size"], "state": f.get("state", "pending")}
        for f in imported.files
    ]
    return {
        "session_id": imported.id,
        "status": imported.status,
        "expected_files": len(files),
        "uploaded_files": sum(1 for f in files if f["state"] == "uploaded"),
        "files": files,
        "expires_at": imported.expires_at,
        "eval_run_id": run.id,
        "eval_run_name": run.name,
    }
