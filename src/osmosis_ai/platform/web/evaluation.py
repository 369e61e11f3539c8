"""An evaluation run's pages: pass rate, pass@k, the reward histogram, the per-sample table
(sorted and filtered in SQL, a page at a time, so 10,000 samples stay fast; another run's
result on the same rows beside it), and one sample's trajectory as a conversation with its
artifacts folder as a tree with previews."""

from __future__ import annotations

import json
import mimetypes
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response
from sqlalchemy import and_, func, or_, select, tuple_
from sqlalchemy.orm import Session

from osmosis_ai.platform.api.deps import Platform, PlatformDep
from osmosis_ai.platform.api.objects import object_store
from osmosis_ai.platform.errors import InvalidRequestError, NotFoundError, PlatformError
from osmosis_ai.platform.objects import (
    InvalidObjectKeyError,
    ObjectNotFoundError,
    ObjectStore,
    check_key,
)
from osmosis_ai.platform.services import runs
from osmosis_ai.platform.services.accounts import WorkspaceAccess
from osmosis_ai.platform.services.datasets import object_key as dataset_object_key
from osmosis_ai.platform.services.eval_results import duration_ms, evaluation_settings, run_prefix
from osmosis_ai.platform.store.orm import Dataset, Run, RunSample
from osmosis_ai.platform.web import charts
from osmosis_ai.platform.web.dashboard import ACTIVE, Page, open_data, open_page

router = APIRouter(include_in_schema=False)

SAMPLES_PAGE = 100
SORTS = {
    "row": (RunSample.row_index, RunSample.run_index),
    "reward": (RunSample.reward, RunSample.row_index, RunSample.run_index),
    "tokens": (RunSample.tokens, RunSample.row_index, RunSample.run_index),
    "duration": (RunSample.duration_ms, RunSample.row_index, RunSample.run_index),
    "status": (RunSample.status, RunSample.row_index, RunSample.run_index),
}
SHOWS = ("all", "failures", "errors", "passed")
MAX_TRAJECTORY_BYTES = 8 * 1024 * 1024
MAX_EXPECTED_ROW = 200_000  # past this row the expected answer is not read from the file
MAX_MESSAGE_CHARS = 100_000
PREVIEW_BYTES = 64 * 1024
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
}
RAW_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}


@dataclass(frozen=True)
class _Scored:
    row_index: int
    status: str
    reward: float | None
    tokens: int | None


def _summary(db: Session, run: Run) -> dict[str, Any]:
    from osmosis_ai.eval.metrics import aggregate_metrics

    threshold, n = evaluation_settings(run)
    rows = db.execute(
        select(RunSample.row_index, RunSample.status, RunSample.reward, RunSample.tokens).where(
            RunSample.run_id == run.id
        )
    ).all()
    scored = [_Scored(r[0], r[1], r[2], r[3]) for r in rows]
    summary: dict[str, Any] = dict(aggregate_metrics(scored, threshold, n).to_json())
    for optional in ("reward_stats", "n_runs", "pass_at_k"):
        summary.setdefault(optional, None)
    rewards = [s.reward for s in scored if s.reward is not None]
    summary["histogram"] = charts.histogram(rewards)
    # "Failed" is what the failures filter lists: every completed sample that did not pass
    # (errors and rewards under the threshold); "errors" those whose rollout failed.
    summary["not_passed"] = summary["completed_samples"] - summary["passed"]
    if not summary["completed_samples"]:
        summary["pass_rate"] = None  # nothing completed: no rate, not 0 %
    return summary


def _failing(threshold: float) -> Any:
    """Not passed, as the pass rate counts: completed (not skipped) with no reward or a
    reward under the threshold."""
    return and_(
        RunSample.status != "skipped",
        or_(RunSample.reward.is_(None), RunSample.reward < threshold),
    )


def _sample_query(run: Run, show: str, sort: str, descending: bool) -> Any:
    threshold, _ = evaluation_settings(run)
    query = select(RunSample).where(RunSample.run_id == run.id)
    if show == "failures":
        query = query.where(_failing(threshold))
    elif show == "errors":
        query = query.where(RunSample.status == "failed")
    elif show == "passed":
        query = query.where(RunSample.status != "skipped", RunSample.reward >= threshold)
    columns = SORTS[sort]
    first = columns[0].desc() if descending else columns[0].asc()
    if sort in ("reward", "tokens", "duration"):
        first = first.nulls_last()
    return query.order_by(first, *columns[1:])


def _sample_row(sample: RunSample, threshold: float) -> dict[str, Any]:
    passed = sample.status != "skipped" and sample.reward is not None and sample.reward >= threshold
    return {
        "row": sample.row_index,
        "n": sample.run_index,
        "status": sample.status,
        "reward": sample.reward,
        "tokens": sample.tokens,
        "duration_ms": sample.duration_ms,
        "error": sample.error_type,
        "passed": passed,
        "has_trajectory": bool(sample.trajectory_key),
    }


def _int(request: Request, name: str, default: int) -> int:
    try:
        return max(0, int(request.query_params.get(name, str(default))))
    except ValueError:
        return default


@router.get("/w/{workspace_name}/evals/{run_ref}")
def eval_page(
    workspace_name: str, run_ref: str, request: Request, platform: PlatformDep
) -> Response:
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    sort = request.query_params.get("sort", "row")
    sort = sort if sort in SORTS else "row"
    descending = request.query_params.get("order") == "desc"
    show = request.query_params.get("show", "all")
    show = show if show in SHOWS else "all"
    offset = _int(request, "offset", 0)
    compare_ref = request.query_params.get("compare", "").strip()
    now = platform.now()
    try:
        with platform.read() as db:
            run = runs.get_run(db, page.workspace, "eval", run_ref)
            threshold, n = evaluation_settings(run)
            summary = _summary(db, run)
            query = _sample_query(run, show, sort, descending)
            matching = db.scalar(select(func.count()).select_from(query.order_by(None).subquery()))
            samples = list(db.scalars(query.limit(SAMPLES_PAGE).offset(offset)))
            rows = [_sample_row(s, threshold) for s in samples]
            other, other_rows, other_summary = None, {}, None
            if compare_ref:
                other = runs.get_run(db, page.workspace, "eval", compare_ref)
                other_threshold, _ = evaluation_settings(other)
                other_summary = _summary(db, other)
                keys = [(s.row_index, s.run_index) for s in samples]
                if keys:
                    found = db.scalars(
                        select(RunSample).where(
                            RunSample.run_id == other.id,
                            tuple_(RunSample.row_index, RunSample.run_index).in_(keys),
                        )
                    )
                    other_rows = {
                        (s.row_index, s.run_index): _sample_row(s, other_threshold) for s in found
                    }
            # runs of the same dataset first (their rows are the same rows), newest first
            choices = list(
                db.execute(
                    select(Run.id, Run.name, Run.dataset_name)
                    .where(
                        Run.workspace_id == page.workspace.id, Run.kind == "eval", Run.id != run.id
                    )
                    .order_by((Run.dataset_name == run.dataset_name).desc(), Run.created_at.desc())
                    .limit(200)
                )
            )
            creator = runs.people(db, [run]).get(run.creator_id or "")
    except PlatformError as exc:
        return page.error(exc)
    for row in rows:
        row["other"] = other_rows.get((row["row"], row["n"]))
    return page.render(
        "evaluation.html",
        "runs",
        run=run,
        creator=creator.name if creator else "—",
        duration=duration_ms(run, now),
        summary=summary,
        threshold=threshold,
        n_runs=n,
        rows=rows,
        matching=matching or 0,
        offset=offset,
        page_size=SAMPLES_PAGE,
        sort=sort,
        descending=descending,
        show=show,
        shows=SHOWS,
        other=other,
        other_summary=other_summary,
        compare=compare_ref,
        choices=[(c[0], c[1], c[2], c[2] == run.dataset_name) for c in choices],
        active=run.status in ACTIVE,
    )


# --- one sample ----------------------------------------------------------------------------


@dataclass
class Turn:
    """One message of the conversation, ready to show."""

    source: str
    message: str
    reasoning: str | None = None
    tool_calls: list[dict[str, str]] = field(default_factory=list[dict[str, str]])
    results: list[dict[str, str]] = field(default_factory=list[dict[str, str]])
    tokens: dict[str, int] = field(default_factory=dict[str, int])
    truncated: bool = False


@dataclass
class Trajectory:
    turns: list[Turn]
    reward: object = None
    status: str | None = None
    error_category: str | None = None
    error_message: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    problem: str | None = None


def _text(value: object) -> tuple[str, bool]:
    text = value if isinstance(value, str) else json.dumps(value, indent=2, default=str)
    if len(text) > MAX_MESSAGE_CHARS:
        return text[:MAX_MESSAGE_CHARS], True
    return text, False


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _turn(step: dict[str, Any]) -> Turn:
    message, cut = _text(step.get("message") or "")
    turn = Turn(source=str(step.get("source") or "?"), message=message, truncated=cut)
    reasoning = step.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        turn.reasoning = _text(reasoning)[0]
    for call in step.get("tool_calls") or []:
        if isinstance(call, dict):
            turn.tool_calls.append(
                {
                    "id": str(call.get("tool_call_id") or ""),
                    "name": str(call.get("function_name") or "?"),
                    "arguments": _text(call.get("arguments") or {})[0],
                }
            )
    observation = step.get("observation")
    results = observation.get("results") if isinstance(observation, dict) else None
    for result in results if isinstance(results, list) else []:
        if isinstance(result, dict):
            turn.results.append(
                {
                    "id": str(result.get("source_call_id") or ""),
                    "content": _text(result.get("content") or "")[0],
                }
            )
    metrics = step.get("metrics")
    if isinstance(metrics, dict):
        for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            count = _int_or_none(metrics.get(name))
            if count is not None:
                turn.tokens[name] = count
    return turn


def parse_trajectory(document: object) -> Trajectory:
    """The conversation in an ATIF document: messages, tool calls and their results."""
    if not isinstance(document, dict):
        return Trajectory([], problem="The trajectory file is not a JSON object.")
    steps = document.get("steps")
    turns = [
        _turn(step) for step in (steps if isinstance(steps, list) else []) if isinstance(step, dict)
    ]
    prompt = sum(turn.tokens.get("prompt_tokens", 0) for turn in turns)
    completion = sum(turn.tokens.get("completion_tokens", 0) for turn in turns)
    trajectory = Trajectory(turns)
    final = document.get("final_metrics")
    if isinstance(final, dict):
        trajectory.prompt_tokens = _int_or_none(final.get("total_prompt_tokens"))
        trajectory.completion_tokens = _int_or_none(final.get("total_completion_tokens"))
    trajectory.prompt_tokens = trajectory.prompt_tokens or (prompt or None)
    trajectory.completion_tokens = trajectory.completion_tokens or (completion or None)
    extra = document.get("extra")
    osmosis = extra.get("osmosis") if isinstance(extra, dict) else None
    if isinstance(osmosis, dict):
        trajectory.reward = osmosis.get("reward")
        status, category, err = (
            osmosis.get("status"),
            osmosis.get("err_category"),
            osmosis.get("err_message"),
        )
        trajectory.status = status if isinstance(status, str) else None
        trajectory.error_category = category if isinstance(category, str) else None
        trajectory.error_message = _text(err)[0] if isinstance(err, str) and err else None
    return trajectory


def _load_trajectory(store: ObjectStore, run: Run, sample: RunSample) -> Trajectory | None:
    key = sample.trajectory_key
    if not key or not key.startswith(run_prefix(run.id) + "/"):
        return None
    try:
        info = store.stat(key)
        if info.size > MAX_TRAJECTORY_BYTES:
            return Trajectory(
                [],
                problem=f"The trajectory is {info.size:,} bytes, too large to show here; "
                "download it with osmosis eval download.",
            )
        with store.open(key) as handle:
            document = json.loads(handle.read().decode("utf-8", "replace"))
    except ObjectNotFoundError:
        return Trajectory([], problem="The trajectory file is missing from the object store.")
    except ValueError:
        return Trajectory([], problem="The trajectory file is not valid JSON.")
    return parse_trajectory(document)


def artifacts_prefix(run: Run, row: int, n: int) -> str:
    return f"{run_prefix(run.id)}/artifacts/row_{row}_run_{n}"


def artifact_tree(store: ObjectStore, prefix: str) -> list[dict[str, Any]]:
    """The artifacts folder as nested ``{name, path, size?, children?}`` entries (folders
    first, then files, by name)."""
    root: dict[str, Any] = {}
    for info in store.list(prefix):
        relative = info.key[len(prefix) + 1 :]
        parts = relative.split("/")
        node = root
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = info.size

    def build(node: dict[str, Any], base: str) -> list[dict[str, Any]]:
        folders = sorted(k for k, v in node.items() if isinstance(v, dict))
        files = sorted(k for k, v in node.items() if not isinstance(v, dict))
        entries: list[dict[str, Any]] = []
        for name in folders:
            path = f"{base}{name}"
            entries.append({"name": name, "path": path, "children": build(node[name], path + "/")})
        entries.extend(
            {"name": name, "path": f"{base}{name}", "size": node[name]} for name in files
        )
        return entries

    return build(root, "")


def _preview(store: ObjectStore, prefix: str, path: str) -> dict[str, Any] | None:
    if not path:
        return None
    try:
        key = check_key(f"{prefix}/{path}")
        info = store.stat(key)
    except (InvalidObjectKeyError, ObjectNotFoundError):
        return {"path": path, "kind": "missing"}
    suffix = "." + path.rsplit(".", 1)[-1].lower() if "." in path else ""
    if suffix in IMAGE_TYPES:
        return {"path": path, "kind": "image", "size": info.size}
    with store.open(key) as handle:
        head = handle.read(PREVIEW_BYTES)
    if b"\x00" in head:
        return {"path": path, "kind": "binary", "size": info.size}
    return {
        "path": path,
        "kind": "text",
        "size": info.size,
        "text": head.decode("utf-8", "replace"),
        "truncated": info.size > PREVIEW_BYTES,
    }


def _sample(db: Session, run: Run, row: int, n: int) -> RunSample:
    sample = db.get(RunSample, (run.id, row, n))
    if sample is None:
        raise NotFoundError(
            f"Evaluation run {run.name!r} has no sample at row {row}, run {n}.",
            code="SAMPLE_NOT_FOUND",
        )
    return sample


@dataclass
class Pane:
    run: Run
    sample: RunSample | None
    trajectory: Trajectory | None
    tree: list[dict[str, Any]]
    preview: dict[str, Any] | None
    passed: bool
    expected: str | None = None
    answer: str | None = None


EXPECTED_KEYS = ("ground_truth", "expected", "answer")


def expected_answer(db: Session, store: ObjectStore, run: Run, sample: RunSample) -> str | None:
    """The ground truth of the sample's dataset row: from the dataset's stored preview when
    the row is in it, else read from the dataset file; ``None`` when neither has it."""
    row = sample.source_row_index if sample.source_row_index is not None else sample.row_index
    dataset = db.scalar(
        select(Dataset)
        .where(
            Dataset.workspace_id == run.workspace_id,
            Dataset.file_name == run.dataset_name,
            Dataset.status == "uploaded",
        )
        .order_by(Dataset.created_at.desc())
        .limit(1)
    )
    if dataset is None or row < 0:
        return None
    preview = dataset.data_preview or []
    record: dict[str, object] | None = preview[row] if row < len(preview) else None
    if record is None and row < MAX_EXPECTED_ROW:
        from osmosis_ai.errors import MissingExtraError
        from osmosis_ai.workspace import read_rows
        from osmosis_ai.workspace.rows import DatasetError

        key = dataset.object_key or dataset_object_key(dataset)
        try:
            rows = read_rows(store.path(store.stat(key).key), limit=row + 1)
        except (ObjectNotFoundError, DatasetError, MissingExtraError, OSError):
            return None
        record = rows[row] if row < len(rows) else None
    if record is None:
        return None
    for name in EXPECTED_KEYS:
        value = record.get(name)
        if value is not None:
            return value if isinstance(value, str) else json.dumps(value, default=str)
    return None


def final_answer(trajectory: Trajectory | None) -> str | None:
    """The model's last message in the conversation."""
    if trajectory is None:
        return None
    for turn in reversed(trajectory.turns):
        if turn.source == "agent" and turn.message:
            return turn.message
    return None


def _pane(platform: Platform, db: Session, run: Run, where: tuple[int, int], file: str) -> Pane:
    row, n = where
    store = object_store(platform)
    threshold, _ = evaluation_settings(run)
    sample = db.get(RunSample, (run.id, row, n))
    if sample is None:
        return Pane(run, None, None, [], None, False)
    prefix = artifacts_prefix(run, row, n)
    passed = sample.status != "skipped" and sample.reward is not None and sample.reward >= threshold
    trajectory = _load_trajectory(store, run, sample)
    return Pane(
        run,
        sample,
        trajectory,
        artifact_tree(store, prefix),
        _preview(store, prefix, file),
        passed,
        expected_answer(db, store, run, sample),
        final_answer(trajectory),
    )


@router.get("/w/{workspace_name}/evals/{run_ref}/samples/{row}/{n}")
def sample_page(
    workspace_name: str, run_ref: str, row: int, n: int, *, request: Request, platform: PlatformDep
) -> Response:
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    file = request.query_params.get("file", "")
    compare_ref = request.query_params.get("compare", "").strip()
    try:
        with platform.read() as db:
            run = runs.get_run(db, page.workspace, "eval", run_ref)
            _sample(db, run, row, n)
            panes = [_pane(platform, db, run, (row, n), file)]
            if compare_ref:
                other = runs.get_run(db, page.workspace, "eval", compare_ref)
                panes.append(_pane(platform, db, other, (row, n), ""))
            neighbours = {
                "previous": db.execute(
                    select(RunSample.row_index, RunSample.run_index)
                    .where(
                        RunSample.run_id == run.id,
                        tuple_(RunSample.row_index, RunSample.run_index) < (row, n),
                    )
                    .order_by(RunSample.row_index.desc(), RunSample.run_index.desc())
                    .limit(1)
                ).first(),
                "next": db.execute(
                    select(RunSample.row_index, RunSample.run_index)
                    .where(
                        RunSample.run_id == run.id,
                        tuple_(RunSample.row_index, RunSample.run_index) > (row, n),
                    )
                    .order_by(RunSample.row_index, RunSample.run_index)
                    .limit(1)
                ).first(),
            }
    except PlatformError as exc:
        return page.error(exc)
    return page.render(
        "sample.html",
        "runs",
        run=run,
        row=row,
        n=n,
        panes=panes,
        file=file,
        compare=compare_ref,
        neighbours={k: (tuple(v) if v is not None else None) for k, v in neighbours.items()},
    )


@router.get("/w/{workspace_name}/evals/{run_ref}/samples/{row}/{n}/artifact")
def artifact_file(
    workspace_name: str, run_ref: str, row: int, n: int, *, request: Request, platform: PlatformDep
) -> Response:
    """One artifact's bytes: images inline, everything else as a download (never as HTML)."""
    workspace = open_data(request, platform, workspace_name)
    if not isinstance(workspace, WorkspaceAccess):
        return workspace
    path = request.query_params.get("path", "")
    with platform.read() as db:
        run = runs.get_run(db, workspace, "eval", run_ref)
        _sample(db, run, row, n)
    store = object_store(platform)
    try:
        key = check_key(f"{artifacts_prefix(run, row, n)}/{path}")
    except InvalidObjectKeyError:
        raise InvalidRequestError(
            f"artifact path {path!r} is not a path inside the sample's folder", field="path"
        ) from None
    info = store.stat(key)  # 404 before any byte is sent; the file streams from disk
    name = path.rsplit("/", 1)[-1]
    suffix = "." + name.rsplit(".", 1)[-1].lower() if "." in name else ""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "artifact"
    if suffix in IMAGE_TYPES:
        return FileResponse(
            store.path(info.key), media_type=IMAGE_TYPES[suffix], headers=RAW_HEADERS
        )
    media = (
        "text/plain; charset=utf-8"
        if (mimetypes.guess_type(name)[0] or "").startswith("text/")
        else "application/octet-stream"
    )
    return FileResponse(
        store.path(info.key),
        media_type=media,
        headers={**RAW_HEADERS, "Content-Disposition": f'attachment; filename="{safe}"'},
    )
