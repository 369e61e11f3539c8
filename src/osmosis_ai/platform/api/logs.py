"""The ``GET …/{name_or_id}/logs`` route of a resource with a log (datasets, eval and training
runs): a cursor page of the log, older or newer entries first."""

from __future__ import annotations

from typing import Annotated, Protocol

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from osmosis_ai.platform.api.deps import PlatformDep, WorkspaceDep
from osmosis_ai.platform.api.wire import LogsOut, logs_out
from osmosis_ai.platform.services.accounts import WorkspaceAccess
from osmosis_ai.platform.services.paging import MAX_PAGE, CursorPage
from osmosis_ai.platform.store.orm import DatasetLog, RunLog


class LogReader(Protocol):
    def __call__(
        self,
        session: Session,
        workspace: WorkspaceAccess,
        name_or_id: str,
        *,
        limit: int,
        direction: str,
        cursor: str | None,
    ) -> CursorPage[DatasetLog] | CursorPage[RunLog]: ...


def add_logs_route(router: APIRouter, name: str, read: LogReader) -> None:
    """Add the logs route named ``name`` to ``router``; ``read`` fetches the page."""

    @router.get("/{name_or_id}/logs", name=name)
    def logs(
        name_or_id: str,
        *,
        platform: PlatformDep,
        workspace: WorkspaceDep,
        limit: Annotated[int, Query()] = MAX_PAGE,
        direction: Annotated[str, Query()] = "older",
        cursor: Annotated[str | None, Query()] = None,
    ) -> LogsOut:
        with platform.read() as session:
            page = read(
                session, workspace, name_or_id, limit=limit, direction=direction, cursor=cursor
            )
            return logs_out(page)
