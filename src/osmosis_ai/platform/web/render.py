"""Rendering the dashboard: Jinja2 templates with autoescaping, its security headers, and the
static files shipped inside the package (``static/``: the dashboard's own CSS and JS, and the
vendored uPlot charting library; no CDN, no Node build)."""

from __future__ import annotations

import json
import mimetypes
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, Response

from osmosis_ai.errors import MissingExtraError

try:
    import jinja2
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtraError("platform", "The platform dashboard", exc.name) from exc

HERE = Path(__file__).parent
STATIC = HERE / "static"
TEMPLATES = HERE / "templates"

# Scripts and styles only from this server: a string that slipped into a page unescaped still
# could not run. uPlot sizes its elements through the CSSOM, which style-src does not govern.
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".txt": "text/plain"}

router = APIRouter(include_in_schema=False)


def _when(value: object) -> str:
    from datetime import datetime

    if not isinstance(value, datetime):
        return "—"
    return value.strftime("%Y-%m-%d %H:%M:%S UTC")


def _duration(ms: object) -> str:
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return "—"
    if ms < 1000:  # a sample's duration is often under a second: not "0s"
        return f"{int(ms)} ms"
    if ms < 10_000:
        return f"{ms / 1000:.1f}s"
    seconds = int(ms) // 1000
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m {secs:02d}s"
    return f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def _number(value: object, digits: int = 3) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:.{digits}f}"


def _percent(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "—"
    return f"{value * 100:.1f}%"


def _pretty(value: object) -> str:
    """Indented JSON as plain text (escaped like any other string where it is shown)."""
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _url(value: object) -> str:
    return quote(str(value), safe="")


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        when=_when,
        duration=_duration,
        number=_number,
        percent=_percent,
        u=_url,
        pretty=_pretty,
    )
    globals_: dict[str, Any] = env.globals  # jinja2's stub types the defaults only
    globals_["asset"] = asset_url
    return env


def render(template: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = environment().get_template(template).render(**context)
    return HTMLResponse(html, status_code=status, headers=HEADERS)


@cache
def _static_index() -> dict[str, tuple[bytes, str, str]]:
    """Every static file, by path under ``static/``: (bytes, media type, content hash)."""
    import hashlib

    files: dict[str, tuple[bytes, str, str]] = {}
    for path in sorted(STATIC.rglob("*")):
        if not path.is_file():
            continue
        name = path.relative_to(STATIC).as_posix()
        data = path.read_bytes()
        media = STATIC_TYPES.get(path.suffix) or mimetypes.guess_type(name)[0] or "text/plain"
        files[name] = (data, media, hashlib.sha256(data).hexdigest()[:12])
    return files


def asset_url(name: str) -> str:
    """The URL of static file ``name``, versioned by its content so browsers may cache it."""
    found = _static_index().get(name)
    if found is None:
        raise KeyError(f"no static file {name!r} under {STATIC}")
    return f"/static/{name}?v={found[2]}"


@router.get("/static/{name:path}")
def static_file(name: str) -> Response:
    found = _static_index().get(name)
    if found is None:
        return Response("Not found", status_code=404, media_type="text/plain")
    data, media, digest = found
    return Response(
        data,
        media_type=media,
        headers={
            "Cache-Control": "public, max-age=31536000, immutable",
            "ETag": f'"{digest}"',
            "X-Content-Type-Options": "nosniff",
        },
    )
