"""``/api/cli/eval-runs`` and ``/api/cli/training-runs``: submit, list, detail, stop, logs.

Request bodies are exactly what ``osmosis eval submit`` / ``train submit`` send (reference
§6.1; unknown fields are refused); provided secret values are ``SecretStr`` so not even a
repr shows them. Answers carry what the CLI reads: a submit answers ``{id, name, status,
created_at, platform_url}``; list items and details carry the run's fields flat and, as the
CLI reads them, its model, dataset and rollout as objects. A thin layer over
:mod:`osmosis_ai.platform.services.runs`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from sqlalchemy.orm import Session

from osmosis_ai.platform.api.deps import Platform, PlatformDep, PrincipalDep, WorkspaceDep
from osmosis_ai.platform.api.logs import add_logs_route
from osmosis_ai.platform.api.secrets import secret_box
from osmosis_ai.platform.api.wire import WireModel, page_fields
from osmosis_ai.platform.services import runs as service
from osmosis_ai.platform.services import work
from osmosis_ai.platform.services.accounts import WorkspaceAccess
from osmosis_ai.platform.services.paging import MAX_PAGE, CursorPage
from osmosis_ai.platform.services.run_config import check_submission
from osmosis_ai.platform.store.orm import Run, RunLog

router = APIRouter(tags=["runs"])
eval_router = APIRouter(prefix="/api/cli/eval-runs")
training_router = APIRouter(prefix="/api/cli/training-runs")

Table = dict[str, Any]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SecretsIn(_Strict):
    required: list[str] = Field(default_factory=list[str], max_length=100)
    provided: dict[str, SecretStr] | None = None


class EvalRunIn(_Strict):
    experiment_config: Table
    evaluation_config: Table | None = None
    advanced_config: Table | None = None
    env_config: Table | None = None
    secrets: SecretsIn | None = None


class TrainingRunIn(_Strict):
    experiment_config: Table
    training_config: Table | None = None
    sampling_config: Table | None = None
    checkpoints_config: Table | None = None
    advanced_config: Table | None = None
    env_config: Table | None = None
    secrets: SecretsIn | None = None


class StopIn(_Strict):
    pass


class SubmittedOut(WireModel):
    id: str
    name: str
    status: str
    created_at: datetime
    platform_url: str | None = None


class StoppedOut(WireModel):
    id: str
    name: str
    status: str


class RefOut(WireModel):
    id: str | None = None
    name: str | None = None


class DatasetRefOut(RefOut):
    file_name: str | None = None


class ModelRefOut(RefOut):
    model_name: str | None = None


class RunFieldsOut(WireModel):
    """What every answer about a run says of it (the ``eval_run``/``training_run`` block)."""

    id: str
    name: str
    status: str
    created_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None
    creator_name: str | None = None
    creator_email: str | None = None
    platform_url: str | None = None
    error: str | None = None  # why a failed or crashed run ended (e.g. no_learning_signal: …)


class RunBlockOut(RunFieldsOut):
    """The run's fields with its model, dataset and rollout flat (reference §6.1)."""

    model_id: str | None = None
    model_name: str | None = None
    dataset_id: str | None = None
    dataset_name: str | None = None
    rollout_id: str | None = None
    rollout_name: str | None = None


class RunRowOut(RunBlockOut):
    model: ModelRefOut
    dataset: DatasetRefOut
    rollout: RefOut
    branch: str | None = None
    commit_sha: str | None = None
    config: Table


class EvalRunOut(RunRowOut):
    results: Table | None = None


class TrainingRunOut(RunRowOut):
    current_step: int | None = None
    total_steps: int | None = None
    reward: float | None = None


class EvalRunsPageOut(WireModel):
    eval_runs: list[EvalRunOut]
    total_count: int
    has_more: bool
    next_offset: int | None = None


class TrainingRunsPageOut(WireModel):
    training_runs: list[TrainingRunOut]
    total_count: int
    has_more: bool
    next_offset: int | None = None


class DetailOut(WireModel):
    model: ModelRefOut
    dataset: DatasetRefOut
    rollout: RefOut
    config: Table
    entrypoint: str
    branch: str | None = None
    commit_sha: str
    env_config: dict[str, str] | None = None
    resolved_secret_scopes: dict[str, str]
    required_secrets: list[str]
    advanced_config: Table | None = None


class EvalRunDetailOut(DetailOut):
    eval_run: RunBlockOut
    results: Table | None = None
    dataset_df_stats: Table | None = None


class TrainingRunBlockOut(RunBlockOut):
    current_step: int | None = None
    total_steps: int | None = None
    reward: float | None = None
    examples_processed_count: int | None = None
    notes: str | None = None


class TrainingRunDetailOut(DetailOut):
    training_run: TrainingRunBlockOut


# --- shaping answers -----------------------------------------------------------------------


def run_config(run: Run) -> Table:
    """The run's configuration as ``eval info`` / ``train info`` show it."""
    if run.kind == "eval":
        return {"model_path": run.model_path, **(run.evaluation_config or {})}
    config: Table = {"model_path": run.model_path}
    for key, table in (
        ("training", run.training_config),
        ("sampling", run.sampling_config),
        ("checkpoints", run.checkpoints_config),
    ):
        if table:
            config[key] = table
    return config


def _fields(run: Run, people: dict[str, service.Person]) -> Table:
    creator = people.get(run.creator_id or "")
    return {
        "id": run.id,
        "name": run.name,
        "status": run.status,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "completed_at": run.completed_at,
        "creator_name": creator.name if creator else None,
        "creator_email": creator.email if creator else None,
        "error": run.error,
    }


def _refs(run: Run, models: dict[str, str]) -> Table:
    model_name = models.get(run.model_id or "") or run.model_path
    return {
        "model": ModelRefOut(id=run.model_id, name=model_name, model_name=model_name),
        "dataset": DatasetRefOut(
            id=run.dataset_id, name=run.dataset_name, file_name=run.dataset_name
        ),
        "rollout": RefOut(id=run.rollout_id, name=run.rollout_name),
    }


def _block(run: Run, people: dict[str, service.Person], models: dict[str, str]) -> Table:
    return {
        **_fields(run, people),
        "model_id": run.model_id,
        "model_name": models.get(run.model_id or "") or run.model_path,
        "dataset_id": run.dataset_id,
        "dataset_name": run.dataset_name,
        "rollout_id": run.rollout_id,
        "rollout_name": run.rollout_name,
    }


def _row(run: Run, people: dict[str, service.Person], models: dict[str, str]) -> Table:
    return {
        **_block(run, people, models),
        **_refs(run, models),
        "branch": run.branch,
        "commit_sha": run.commit_sha,
        "config": run_config(run),
    }


def _detail(run: Run, models: dict[str, str]) -> Table:
    return {
        **_refs(run, models),
        "config": run_config(run),
        "entrypoint": run.entrypoint,
        "branch": run.branch,
        "commit_sha": run.commit_sha,
        "env_config": run.env_config,
        "resolved_secret_scopes": run.secret_scopes,
        "required_secrets": run.required_secrets,
        "advanced_config": run.advanced_config,
    }


def eval_results(run: Run) -> Table | None:
    """An eval run's results (reference §5.7), with the names a 0.3.8 CLI reads beside them:
    ``score`` (the mean reward), ``total_tokens`` (``tokens_used``), and its progress as
    ``total_runs`` work items done of ``sampled_rows`` rows times ``n``, so that CLI shows
    the reward, tokens and progress of a run, a running one included."""
    results: Table = dict(run.results or {})
    stats = results.get("reward_stats")
    mean = stats.get("mean") if isinstance(stats, dict) else None  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    if "score" not in results and isinstance(mean, int | float):
        results["score"] = mean
    if "total_tokens" not in results and "tokens_used" in results:
        results["total_tokens"] = results["tokens_used"]
    if "total_runs" not in results and run.total_steps:
        n = (run.evaluation_config or {}).get("n")
        per_row = n if isinstance(n, int) and n > 0 else 1
        results["total_runs"] = run.current_step or 0
        results["sampled_rows"] = -(-run.total_steps // per_row)
    return results or None


def _progress(run: Run) -> Table:
    return {"current_step": run.current_step, "total_steps": run.total_steps, "reward": run.reward}


# --- shared handlers -----------------------------------------------------------------------


def _submit(
    platform: Platform,
    workspace: WorkspaceAccess,
    user_id: str,
    kind: str,
    body: EvalRunIn | TrainingRunIn,
) -> SubmittedOut:
    sections: dict[str, Table | None] = {"advanced": body.advanced_config}
    if isinstance(body, EvalRunIn):
        sections["evaluation"] = body.evaluation_config
    else:
        sections |= {
            "training": body.training_config,
            "sampling": body.sampling_config,
            "checkpoints": body.checkpoints_config,
        }
    secrets = body.secrets or SecretsIn()
    provided = {k: v.get_secret_value() for k, v in (secrets.provided or {}).items()}
    submission = check_submission(
        kind,
        experiment_config=body.experiment_config,
        sections=sections,
        env_config=body.env_config,
        required_secrets=secrets.required,
        provided_secrets=provided,
    )
    run = service.submit_run(
        platform.database,
        platform.settings,
        workspace,
        user_id,
        submission,
        box=secret_box(platform),
        now=platform.now,
    )
    work.wake_workers(platform.database, now=platform.now())
    return SubmittedOut(id=run.id, name=run.name, status=run.status, created_at=run.created_at)


def _add_stop_and_logs(router: APIRouter, kind: str) -> None:
    """``POST …/{name_or_id}/stop`` and ``GET …/{name_or_id}/logs`` of the runs of ``kind``
    (named ``stop_<kind>_run`` and ``<kind>_run_logs``)."""

    @router.post("/{name_or_id}/stop", name=f"stop_{kind}_run")
    def stop_run(
        name_or_id: str,
        platform: PlatformDep,
        principal: PrincipalDep,
        workspace: WorkspaceDep,
        body: Annotated[StopIn | None, Body()] = None,
    ) -> StoppedOut:
        with platform.transaction() as session:
            run = service.stop_run(
                session, workspace, principal.user_id, kind, name_or_id, now=platform.now()
            )
            return StoppedOut(id=run.id, name=run.name, status=run.status)

    def read_logs(
        session: Session,
        workspace: WorkspaceAccess,
        name_or_id: str,
        *,
        limit: int,
        direction: str,
        cursor: str | None,
    ) -> CursorPage[RunLog]:
        return service.run_logs(
            session, workspace, kind, name_or_id, limit=limit, direction=direction, cursor=cursor
        )

    add_logs_route(router, f"{kind}_run_logs", read_logs)


# --- eval runs -----------------------------------------------------------------------------


@eval_router.post("", status_code=201)
def submit_eval_run(
    body: EvalRunIn, platform: PlatformDep, principal: PrincipalDep, workspace: WorkspaceDep
) -> SubmittedOut:
    return _submit(platform, workspace, principal.user_id, "eval", body)


@eval_router.get("")
def list_eval_runs(
    platform: PlatformDep,
    workspace: WorkspaceDep,
    limit: Annotated[int, Query()] = MAX_PAGE,
    offset: Annotated[int, Query()] = 0,
) -> EvalRunsPageOut:
    with platform.read() as session:
        page = service.list_runs(session, workspace, "eval", limit=limit, offset=offset)
        people = service.people(session, page.items)
    return EvalRunsPageOut(
        eval_runs=[EvalRunOut(**_row(r, people, {}), results=eval_results(r)) for r in page.items],
        **page_fields(page),
    )


@eval_router.get("/{name_or_id}")
def get_eval_run(
    name_or_id: str, platform: PlatformDep, workspace: WorkspaceDep
) -> EvalRunDetailOut:
    with platform.read() as session:
        run = service.get_run(session, workspace, "eval", name_or_id)
        people = service.people(session, [run])
    return EvalRunDetailOut(
        eval_run=RunBlockOut(**_block(run, people, {})),
        results=eval_results(run),
        **_detail(run, {}),
    )


_add_stop_and_logs(eval_router, "eval")


# --- training runs -------------------------------------------------------------------------


@training_router.post("", status_code=201)
def submit_training_run(
    body: TrainingRunIn, platform: PlatformDep, principal: PrincipalDep, workspace: WorkspaceDep
) -> SubmittedOut:
    return _submit(platform, workspace, principal.user_id, "training", body)


@training_router.get("")
def list_training_runs(
    platform: PlatformDep,
    workspace: WorkspaceDep,
    limit: Annotated[int, Query()] = MAX_PAGE,
    offset: Annotated[int, Query()] = 0,
) -> TrainingRunsPageOut:
    with platform.read() as session:
        page = service.list_runs(session, workspace, "training", limit=limit, offset=offset)
        people = service.people(session, page.items)
        models = service.model_names(session, page.items)
    return TrainingRunsPageOut(
        training_runs=[
            TrainingRunOut(**_row(r, people, models), **_progress(r)) for r in page.items
        ],
        **page_fields(page),
    )


@training_router.get("/{name_or_id}")
def get_training_run(
    name_or_id: str, platform: PlatformDep, workspace: WorkspaceDep
) -> TrainingRunDetailOut:
    with platform.read() as session:
        run = service.get_run(session, workspace, "training", name_or_id)
        people = service.people(session, [run])
        models = service.model_names(session, [run])
    return TrainingRunDetailOut(
        training_run=TrainingRunBlockOut(
            **_block(run, people, models),
            **_progress(run),
            examples_processed_count=run.examples_processed_count,
            notes=run.notes,
        ),
        **_detail(run, models),
    )


_add_stop_and_logs(training_router, "training")


router.include_router(eval_router)
router.include_router(training_router)
