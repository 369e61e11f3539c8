"""The dashboard at ``/``: sign-in and sign-out, the workspace's runs, and what every page
shares (the signed-in person, the workspace from the URL, the CSRF token, the error page).

Pages live under ``/w/<workspace name>/``; a workspace the person is not a member of answers
404 like one that does not exist. A page asked for without a session redirects to
``/login``; the JSON and CSV endpoints the pages poll answer 401 instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from osmosis_ai.platform.api.deps import Platform, PlatformDep
from osmosis_ai.platform.errors import PlatformError
from osmosis_ai.platform.services import accounts, runs
from osmosis_ai.platform.services.accounts import WorkspaceAccess
from osmosis_ai.platform.store.orm import Run
from osmosis_ai.platform.web import render, session
from osmosis_ai.platform.web.session import Viewer

router = APIRouter(include_in_schema=False)

RUNS_PAGE = 100
ACTIVE = ("pending", "queued", "running", "unknown")


@dataclass
class Page:
    """One signed-in page view in a workspace: renders with the shared context."""

    platform: Platform
    viewer: Viewer
    workspace: WorkspaceAccess
    workspaces: list[WorkspaceAccess]
    cookie: str
    extra_cookies: dict[str, str] = field(default_factory=dict[str, str])

    @property
    def base(self) -> str:
        return f"/w/{quote(self.workspace.name, safe='')}"

    @property
    def csrf(self) -> str:
        return session.csrf_token(self.platform, self.cookie)

    def render(self, template: str, section: str, status: int = 200, **context: Any) -> Response:
        answer = render.render(
            template,
            status,
            page=self,
            section=section,
            viewer=self.viewer,
            workspace=self.workspace,
            workspaces=self.workspaces,
            csrf=self.csrf,
            base=self.base,
            **context,
        )
        session.set_cookie(answer, self.platform, session.CSRF_COOKIE, self.cookie, max_age=None)
        return answer

    def error(self, exc: PlatformError) -> Response:
        return self.render("error.html", "", exc.status_code, message=exc.message, code=exc.code)


def login_redirect(request: Request) -> Response:
    raw = request.scope.get("raw_path")  # the path as sent, still percent-encoded
    path = raw.decode("latin-1") if isinstance(raw, bytes) else quote(request.url.path)
    target = path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def not_signed_in() -> Response:
    return JSONResponse(
        {"error": "UNAUTHORIZED", "message": "Sign in at /login first.", "code": "SIGNED_OUT"},
        status_code=401,
        headers={"Cache-Control": "no-store"},
    )


def open_page(request: Request, platform: Platform, workspace_name: str) -> Page | Response:
    """The page context for ``workspace_name``, or the answer to send instead (sign in, 404)."""
    viewer = session.current_viewer(request, platform)
    if viewer is None:
        return login_redirect(request)
    cookie = session.csrf_cookie(request)
    with platform.read() as db:
        mine = accounts.workspaces_of(db, viewer.user_id)
    found = next((w for w in mine if w.name == workspace_name), None)
    if found is None:
        fallback = mine[0] if mine else WorkspaceAccess("", workspace_name, "", "")
        page = Page(platform, viewer, fallback, mine, cookie)
        message = f"No workspace {workspace_name!r} that you belong to."
        return page.render("error.html", "", 404, message=message, code="WORKSPACE_NOT_FOUND")
    return Page(platform, viewer, found, mine, cookie)


def open_data(
    request: Request, platform: Platform, workspace_name: str
) -> WorkspaceAccess | Response:
    """The workspace of a JSON/CSV endpoint, or the 401/404 answer."""
    viewer = session.current_viewer(request, platform)
    if viewer is None:
        return not_signed_in()
    with platform.read() as db:
        found = accounts.workspace_for_name(db, viewer.user_id, workspace_name)
    if found is None:
        return JSONResponse(
            {"error": "NOT_FOUND", "message": f"No workspace {workspace_name!r} of yours."},
            status_code=404,
        )
    return found


def safe_next(target: str | None) -> str:
    """A redirect target on this site only (a path), else ``/``."""
    if not target:
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


# --- sign-in ---------------------------------------------------------------------------------


@router.get("/")
def index(request: Request, platform: PlatformDep) -> Response:
    viewer = session.current_viewer(request, platform)
    if viewer is None:
        return RedirectResponse("/login", status_code=303)
    with platform.read() as db:
        mine = accounts.workspaces_of(db, viewer.user_id)
    if not mine:
        cookie = session.csrf_cookie(request)
        page = Page(platform, viewer, WorkspaceAccess("", "", "", ""), [], cookie)
        return page.render("no_workspace.html", "")
    return RedirectResponse(f"/w/{quote(mine[0].name, safe='')}/runs", status_code=303)


@router.get("/login")
def login_page(request: Request, platform: PlatformDep) -> Response:
    return _login(request, platform, error=None, status=200)


def _login(
    request: Request,
    platform: Platform,
    *,
    error: str | None,
    status: int,
    form: Mapping[str, str] | None = None,
) -> Response:
    """The sign-in page; after a refused sign-in (``form``) it keeps the email and the page the
    person was going to, so that only the token has to be typed again."""
    fields = form if form is not None else request.query_params
    cookie = session.csrf_cookie(request)
    answer = render.render(
        "login.html",
        status,
        csrf=session.csrf_token(platform, cookie),
        next=safe_next(fields.get("next")),
        error=error,
        email=fields.get("email", "").strip(),
    )
    session.set_cookie(answer, platform, session.CSRF_COOKIE, cookie, max_age=None)
    return answer


@router.post("/login")
async def login(request: Request, platform: PlatformDep) -> Response:
    form = await session.read_form(request, platform)
    target = safe_next(form.get("next"))
    try:
        value, max_age = session.DASHBOARD.sign_in(
            platform, form.get("email", ""), form.get("token", "").strip()
        )
    except PlatformError as exc:
        return _login(request, platform, error=exc.message, status=401, form=form)
    answer = RedirectResponse(target, status_code=303, headers={"Cache-Control": "no-store"})
    session.set_cookie(answer, platform, session.SESSION_COOKIE, value, max_age=max_age)
    return answer


@router.post("/logout")
async def logout(request: Request, platform: PlatformDep) -> Response:
    await session.read_form(request, platform)
    answer = RedirectResponse("/login", status_code=303, headers={"Cache-Control": "no-store"})
    session.DASHBOARD.sign_out(request, platform, answer)  # a copy of the cookie is refused too
    return answer


# --- runs ------------------------------------------------------------------------------------

FILTERS = ("kind", "status", "rollout", "model", "creator")


def _filtered(workspace_id: str, chosen: Mapping[str, str]) -> Any:
    query = select(Run).where(Run.workspace_id == workspace_id)
    if chosen.get("kind") in ("eval", "training"):
        query = query.where(Run.kind == chosen["kind"])
    if chosen.get("status"):
        query = query.where(Run.status == chosen["status"])
    if chosen.get("rollout"):
        query = query.where(Run.rollout_name == chosen["rollout"])
    if chosen.get("model"):
        query = query.where(Run.model_path == chosen["model"])
    if chosen.get("creator"):
        query = query.where(Run.creator_id == chosen["creator"])
    return query.order_by(Run.created_at.desc(), Run.id.desc())


def _options(db: Session, workspace_id: str) -> dict[str, list[tuple[str, str]]]:
    def values(column: Any) -> list[str]:
        found = db.scalars(select(column).where(Run.workspace_id == workspace_id).distinct())
        return sorted(str(v) for v in found if v)

    creators = values(Run.creator_id)
    names = accounts.display_names(db, creators)
    return {
        "status": [(s, s) for s in values(Run.status)],
        "rollout": [(r, r) for r in values(Run.rollout_name)],
        "model": [(m, m) for m in values(Run.model_path)],
        "creator": sorted(((c, names.get(c, c)) for c in creators), key=lambda p: p[1]),
    }


def run_progress(run: Run) -> dict[str, object]:
    """Progress read the same for either kind: done of total work (training steps, eval work
    items), with the percentage when the total is known."""
    done = run.current_step
    if done is None and run.kind == "eval":
        done = run.examples_processed_count
    total = run.total_steps
    percent = min(100, round(100 * done / total)) if done is not None and total else None
    return {"done": done, "total": total, "percent": percent}


def run_result(run: Run) -> tuple[str, float | None]:
    """What a run reached: an eval's pass rate (from its results), a training's latest reward."""
    if run.kind == "eval":
        if not (run.current_step or run.examples_processed_count):
            return "pass rate", None  # nothing completed: no rate, not 0 %
        rate = (run.results or {}).get("pass_rate")
        if isinstance(rate, int | float) and not isinstance(rate, bool):
            return "pass rate", float(rate)
    return "reward", run.reward


def run_duration_ms(run: Run, now: datetime) -> int | None:
    if run.started_at is None:
        return None
    started = (
        run.started_at.replace(tzinfo=UTC) if run.started_at.tzinfo is None else run.started_at
    )
    end = run.completed_at or now
    end = end.replace(tzinfo=UTC) if end.tzinfo is None else end
    return max(0, round((end - started).total_seconds() * 1000))


def run_row(
    run: Run, creators: Mapping[str, runs.Person], now: datetime | None = None
) -> dict[str, object]:
    person = creators.get(run.creator_id or "")
    result_kind, result = run_result(run)
    return {
        "id": run.id,
        "kind": run.kind,
        "name": run.name,
        "status": run.status,
        "rollout": run.rollout_name,
        "model": run.model_path,
        "dataset": run.dataset_name,
        "reward": run.reward,
        "step": run.current_step,
        "total_steps": run.total_steps,
        "processed": run.examples_processed_count,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "creator": person.name if person else "—",
        "active": run.status in ACTIVE,
        "progress": run_progress(run),
        "result_kind": result_kind,
        "result": result,
        "duration_ms": run_duration_ms(run, now) if now is not None else None,
        "error": run.error if run.status in ("failed", "crashed", "error") else None,
    }


@router.get("/w/{workspace_name}/runs")
def runs_page(workspace_name: str, request: Request, platform: PlatformDep) -> Response:
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    chosen = {k: request.query_params.get(k, "") for k in FILTERS}
    try:
        offset = max(0, int(request.query_params.get("offset", "0")))
    except ValueError:
        offset = 0
    with platform.read() as db:
        query = _filtered(page.workspace.id, chosen)
        found = list(db.scalars(query.limit(RUNS_PAGE + 1).offset(offset)))
        more = len(found) > RUNS_PAGE
        found = found[:RUNS_PAGE]
        creators = runs.people(db, found)
        options = _options(db, page.workspace.id)
    now = platform.now()
    rows = [run_row(r, creators, now) for r in found]
    return page.render(
        "runs.html",
        "runs",
        rows=rows,
        chosen=chosen,
        options=options,
        offset=offset,
        more=more,
        page_size=RUNS_PAGE,
    )


@router.get("/w/{workspace_name}/runs/status.json")
def runs_status(workspace_name: str, request: Request, platform: PlatformDep) -> Response:
    """The live fields of the runs ``ids`` (comma-separated), for the pages' polling."""
    workspace = open_data(request, platform, workspace_name)
    if not isinstance(workspace, WorkspaceAccess):
        return workspace
    ids = [i for i in request.query_params.get("ids", "").split(",") if i][:500]
    with platform.read() as db:
        found = db.scalars(select(Run).where(Run.workspace_id == workspace.id, Run.id.in_(ids)))
        now = platform.now()
        answer = {
            r.id: {
                "status": r.status,
                "reward": r.reward,
                "result_kind": run_result(r)[0],
                "result": run_result(r)[1],
                "progress": run_progress(r),
                "duration_ms": run_duration_ms(r, now),
                "error": r.error,
                "step": r.current_step,
                "total_steps": r.total_steps,
                "processed": r.examples_processed_count,
                "active": r.status in ACTIVE,
            }
            for r in found
        }
    return JSONResponse(answer, headers={"Cache-Control": "no-store"})


@router.post("/w/{workspace_name}/runs/{kind}/{run_id}/stop")
async def stop(
    workspace_name: str, kind: str, run_id: str, request: Request, platform: PlatformDep
) -> Response:
    form = await session.read_form(request, platform)
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    try:
        with platform.transaction() as db:
            runs.stop_run(db, page.workspace, page.viewer.user_id, kind, run_id, now=platform.now())
    except PlatformError as exc:
        return page.error(exc)
    return RedirectResponse(safe_next(form.get("next")), status_code=303)
