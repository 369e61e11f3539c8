"""The one timestamp format of run files and exports: ``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC."""

from __future__ import annotations

from datetime import UTC, datetime


def iso_utc(moment: datetime | None = None) -> str:
    """``moment`` (default: now) as ``YYYY-MM-DDTHH:MM:SS.mmmZ`` in UTC."""
    moment = datetime.now(UTC) if moment is None else moment.astimezone(UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"
