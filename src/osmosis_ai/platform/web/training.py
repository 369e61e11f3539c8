"""A training run's page: overview figures, a chart for every metric the run logs (grouped, live
while it runs; the first group is fetched on its own so it draws first), CSV per chart,
checkpoints with deploy and undeploy, logs that follow, the submitted configuration and
commit. The charts' data comes from ``metrics.json``, downsampled on the server; the page
polls it every few seconds while the run is active. Logs (of either kind of run) come from
``logs.json`` after a cursor."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from osmosis_ai.platform import training_metrics
from osmosis_ai.platform.api.deps import PlatformDep
from osmosis_ai.platform.errors import InvalidRequestError, PlatformError
from osmosis_ai.platform.services import deployments, runs
from osmosis_ai.platform.services.accounts import WorkspaceAccess
from osmosis_ai.platform.services.training_results import duration_ms
from osmosis_ai.platform.store.orm import Model, Run, RunCheckpoint, RunLog, RunMetric
from osmosis_ai.platform.web import charts, session
from osmosis_ai.platform.web.dashboard import ACTIVE, Page, open_data, open_page, safe_next

router = APIRouter(include_in_schema=False)

POLL_MS = 3000
LOG_PAGE = 500
MAX_NOTICES = 5
CONFIG_SECTIONS = (
    ("experiment", "experiment_config"),
    ("training", "training_config"),
    ("evaluation", "evaluation_config"),
    ("sampling", "sampling_config"),
    ("checkpoints", "checkpoints_config"),
    ("advanced", "advanced_config"),
)


def configuration(run: Run) -> list[tuple[str, object]]:
    """The submitted config sections, in order; env values are shown by name only."""
    sections: list[tuple[str, object]] = []
    for title, attribute in CONFIG_SECTIONS:
        value = getattr(run, attribute)
        if value:
            sections.append((title, value))
    if run.env_config:
        sections.append(("env (names)", sorted(run.env_config)))
    if run.required_secrets:
        sections.append(("secrets (names)", list(run.required_secrets)))
    return sections


@router.get("/w/{workspace_name}/trainings/{run_ref}")
def training_page(
    workspace_name: str, run_ref: str, request: Request, platform: PlatformDep
) -> Response:
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    now = platform.now()
    try:
        with platform.read() as db:
            run = runs.get_run(db, page.workspace, "training", run_ref)
            reward_key = training_metrics.WIRE_KEYS["training_reward"]
            summary = charts.latest_summary(db, run.id, reward_key)
            groups = charts.chart_groups(charts.metric_keys(db, run.id))
            notices = _notices(db, run)
            checkpoints = list(
                db.scalars(
                    select(RunCheckpoint)
                    .where(RunCheckpoint.run_id == run.id)
                    .order_by(RunCheckpoint.step)
                )
            )
            models = {
                m.checkpoint_step: m
                for m in db.scalars(select(Model).where(Model.training_run_id == run.id))
            }
            creator = runs.people(db, [run]).get(run.creator_id or "")
    except PlatformError as exc:
        return page.error(exc)
    rows = [
        {
            "step": c.step,
            "name": c.name,
            "status": c.status,
            "reward": training_metrics.finite(c.reward),
            "created_at": c.created_at,
            "model": models.get(c.step),
            "deployed": (m := models.get(c.step)) is not None and deployments.is_active(m),
        }
        for c in checkpoints
    ]
    return page.render(
        "training.html",
        "runs",
        run=run,
        creator=creator.name if creator else "—",
        duration=duration_ms(run, now),
        summary=summary,
        active=run.status in ACTIVE,
        checkpoints=rows,
        config=configuration(run),
        groups=groups,
        first_keys=groups[0][1][0][0],  # the reward chart, fetched on its own and drawn first
        notices=notices,
        poll_ms=POLL_MS,
    )


def _notices(db: Session, run: Run) -> list[dict[str, object]]:
    """What the top of the page warns about: a stretch of steps without learning signal (the
    latest ``steps_without_signal``) and the run's distinct warning lines, newest first."""
    notices: list[dict[str, object]] = []
    streak = db.scalar(
        select(RunMetric.value)
        .where(RunMetric.run_id == run.id, RunMetric.key == "steps_without_signal")
        .order_by(RunMetric.step.desc())
        .limit(1)
    )
    if streak:
        notices.append(
            {
                "kind": "no-signal",
                "message": f"No learning signal for the last {int(streak)} step"
                f"{'' if int(streak) == 1 else 's'}: every group's rewards were equal or the "
                "gradients were zero, so those updates changed nothing.",
            }
        )
    seen: set[str] = set()
    for line in db.scalars(
        select(RunLog)
        .where(RunLog.run_id == run.id, RunLog.level.in_(("warning", "warn")))
        .order_by(RunLog.id.desc())
        .limit(200)
    ):
        if line.message in seen:
            continue
        seen.add(line.message)
        notices.append({"kind": "warning", "message": line.message, "step": line.step})
        if len(seen) >= MAX_NOTICES:
            break
    return notices


def _points(request: Request) -> int:
    raw = request.query_params.get("points", str(charts.DEFAULT_POINTS))
    try:
        points = int(raw)
    except ValueError:
        raise InvalidRequestError(f"points {raw!r} is not a number", field="points") from None
    return max(3, min(points, charts.MAX_POINTS))


@router.get("/w/{workspace_name}/trainings/{run_ref}/metrics.json")
def training_metrics_json(
    workspace_name: str, run_ref: str, request: Request, platform: PlatformDep
) -> Response:
    workspace = open_data(request, platform, workspace_name)
    if not isinstance(workspace, WorkspaceAccess):
        return workspace
    points = _points(request)
    raw_keys = request.query_params.get("keys", "")
    keys = [training_metrics.wire_key(k) for k in raw_keys.split(",") if k] or None
    now = platform.now()
    with platform.read() as db:
        run = runs.get_run(db, workspace, "training", run_ref)
        series = charts.read_points(db, run.id, keys)
    return JSONResponse(
        {
            "status": run.status,
            "active": run.status in ACTIVE,
            "step": run.current_step,
            "total_steps": run.total_steps,
            "processed": run.examples_processed_count,
            "duration_ms": duration_ms(run, now),
            "charts": charts.chart_payload(series, points, keys),
        },
        headers={"Cache-Control": "no-store"},
    )


@router.get("/w/{workspace_name}/trainings/{run_ref}/metrics.csv")
def training_metrics_csv(
    workspace_name: str, run_ref: str, request: Request, platform: PlatformDep
) -> Response:
    workspace = open_data(request, platform, workspace_name)
    if not isinstance(workspace, WorkspaceAccess):
        return workspace
    key = training_metrics.wire_key(request.query_params.get("key", ""))
    if not key:
        raise InvalidRequestError("name the metric: ?key=training_reward", field="key")
    with platform.read() as db:
        run = runs.get_run(db, workspace, "training", run_ref)
        stored = charts.read_series(db, run.id, [key]).get(key, [])
    name = f"{run.name}-{training_metrics.export_key(key).replace('/', '_')}.csv"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return Response(
        charts.series_csv(key, stored),
        media_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": f'attachment; filename="{safe}"',
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        },
    )


@router.get("/w/{workspace_name}/runs/{kind}/{run_ref}/logs.json")
def run_logs(
    workspace_name: str, kind: str, run_ref: str, request: Request, platform: PlatformDep
) -> Response:
    """Log lines after cursor ``after`` (a line id), oldest first, at most 500."""
    workspace = open_data(request, platform, workspace_name)
    if not isinstance(workspace, WorkspaceAccess):
        return workspace
    try:
        after = int(request.query_params.get("after", "0"))
    except ValueError:
        raise InvalidRequestError("after must be a log line id", field="after") from None
    with platform.read() as db:
        run = runs.get_run(db, workspace, kind, run_ref)
        lines = list(
            db.scalars(
                select(RunLog)
                .where(RunLog.run_id == run.id, RunLog.id > after)
                .order_by(RunLog.id)
                .limit(LOG_PAGE)
            )
        )
    return JSONResponse(
        {
            "status": run.status,
            "active": run.status in ACTIVE,
            "lines": [
                {
                    "id": line.id,
                    "time": line.timestamp.isoformat(),
                    "level": line.level,
                    "step": line.step,
                    "message": line.message,
                }
                for line in lines
            ],
            "cursor": lines[-1].id if lines else after,
            "more": len(lines) == LOG_PAGE,
        },
        headers={"Cache-Control": "no-store"},
    )


@router.post("/w/{workspace_name}/deployments")
async def deploy_action(workspace_name: str, request: Request, platform: PlatformDep) -> Response:
    """Deploy or undeploy a LoRA model (a checkpoint of a training run), then go back."""
    form = await session.read_form(request, platform)
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    action, model_name = form.get("action", ""), form.get("model", "")
    if action not in ("deploy", "undeploy"):
        return page.error(InvalidRequestError(f"unknown action {action!r}: deploy or undeploy"))
    try:
        with platform.transaction() as db:
            if action == "deploy":
                deployments.deploy(
                    db,
                    page.workspace.id,
                    model_name,
                    user_id=page.viewer.user_id,
                    now=platform.now(),
                    limit=deployments.max_active_deployments(),
                )
            else:
                deployments.undeploy(db, page.workspace, page.viewer.user_id, model_name)
    except PlatformError as exc:
        return page.error(exc)
    deployments.notify_changed(platform.extras)
    return RedirectResponse(safe_next(form.get("next")), status_code=303)
