"""The CLI's client of a platform's ``/api/cli/*`` surface (reference §3.3, §6).

One :class:`PlatformClient` per command: it sends the CLI's headers, maps every failure to
a :class:`PlatformClientError` carrying a CLI error code (§3.3), surfaces the platform's
version signal as warnings, walks offset-paginated lists, runs the device-code login, and
moves dataset files through presigned URLs without reading them whole. Light on purpose:
httpx, pydantic and the standard library, never server code.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from ipaddress import ip_address
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit, urlunsplit

import httpx
from pydantic import BaseModel, ConfigDict, ValidationError

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.platform.client.errors import PlatformClientError

DEFAULT_PLATFORM_URL = "https://platform.osmosis.ai"
PAGE_LIMIT = 50  # the server's cap for resource lists
LOG_PAGE_LIMIT = 200  # ... and for log pages
VERSION_STATUS_HEADER = "X-Osmosis-Version-Status"
VERSION_MESSAGE_HEADER = "X-Osmosis-Version-Message"
UPGRADE_FALLBACK = "This version of the Osmosis CLI is no longer supported: upgrade osmosis-ai."

JSONObject = dict[str, Any]
Warn = Callable[[str, str], None]  # (code, message)
Progress = Callable[[int, int], None]  # (bytes done, bytes total)
M = TypeVar("M", bound=BaseModel)


# --- platform URLs --------------------------------------------------------------------------


def is_loopback_host(host: str) -> bool:
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def normalize_platform_url(url: str | None) -> str:
    """The canonical form used for requests and as the credentials key.

    Lower-cased scheme and host, default ports and trailing slashes dropped; a bare
    ``host:port`` gets ``http://`` for loopback hosts and ``https://`` otherwise.
    """
    raw = (url or "").strip().rstrip("/") or DEFAULT_PLATFORM_URL
    if "://" not in raw.split("?", 1)[0]:
        host = urlsplit(f"//{raw}").hostname or ""
        raw = f"{'http' if is_loopback_host(host) else 'https'}://{raw}"
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise PlatformClientError(
            "VALIDATION",
            f"Invalid platform URL {raw!r}: {exc}. Use e.g. https://platform.example.com "
            "or http://127.0.0.1:8080.",
            details={"platform_url": raw},
        ) from None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in ("http", "https") or not host:
        raise PlatformClientError(
            "VALIDATION",
            f"Invalid platform URL {raw!r}: it needs an http:// or https:// scheme and a host.",
            details={"platform_url": raw},
        )
    netloc = f"[{host}]" if ":" in host else host
    if port is not None and (scheme, port) not in (("https", 443), ("http", 80)):
        netloc = f"{netloc}:{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), "", ""))


def is_insecure_url(url: str) -> bool:
    """True when credentials or data would cross the network in plaintext."""
    parts = urlsplit(url)
    return parts.scheme.lower() != "https" and not is_loopback_host(parts.hostname or "")


def segment(value: str) -> str:
    """``value`` as one URL path segment (a name may hold ``/`` or ``..``)."""
    return quote(value, safe="")


# --- wire models ----------------------------------------------------------------------------


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class User(_Wire):
    id: str
    email: str
    name: str | None = None


class Workspace(_Wire):
    id: str | None = None
    name: str = ""
    role: str | None = None


class Verification(_Wire):
    """``GET /api/cli/verify``: whose token this is, until when, in which workspace."""

    token_id: str | None = None
    user: User
    expires_at: str | None = None
    workspace: Workspace | None = None


class DeviceCode(_Wire):
    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str | None = None
    expires_in: int = 900
    interval: int = 5


class DeviceGrant(_Wire):
    token: str
    token_id: str | None = None
    user: User
    expires_at: str | None = None


class PartUrl(_Wire):
    part_number: int
    presigned_url: str
    size: int | None = None


class UploadInstructions(_Wire):
    """How to send a dataset's bytes: one presigned PUT, or numbered parts."""

    method: str = "simple"
    presigned_url: str | None = None
    upload_headers: dict[str, str] | None = None
    expires_in: int | None = None
    part_size: int | None = None
    total_parts: int | None = None
    presigned_urls: list[PartUrl] | None = None


class DownloadLink(_Wire):
    presigned_url: str
    expires_in: int | None = None
    file_name: str | None = None


class SubmitResult(_Wire):
    id: str
    name: str
    status: str
    created_at: str | None = None
    platform_url: str | None = None


@dataclass
class Page:
    """One page of a list, or every page when fetched with ``fetch_all``."""

    items: list[JSONObject]
    total_count: int
    has_more: bool
    next_offset: int | None
    body: JSONObject = field(default_factory=dict[str, Any])  # the first page's whole answer


@dataclass
class LogsPage:
    logs: list[JSONObject]
    next_cursor: str | None


def parse_timestamp(value: str | None, *, default: datetime | None = None) -> datetime:
    """An ISO 8601 instant as an aware datetime (``Z`` accepted); naive values are UTC."""
    if not value:
        if default is None:
            raise ValueError("missing timestamp")
        return default
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


# --- errors from answers --------------------------------------------------------------------

_ENVELOPE_KEYS = {"error", "message", "code", "field", "details", "issues"}
_ENV_TOKEN_MESSAGES = {
    "TOKEN_EXPIRED": "The OSMOSIS_TOKEN environment variable has expired. Set OSMOSIS_TOKEN "
    "to a new token, or unset it to use saved credentials.",
    "TOKEN_REVOKED": "The OSMOSIS_TOKEN environment variable has been revoked. Set "
    "OSMOSIS_TOKEN to a new token, or unset it to use saved credentials.",
}
_ENV_TOKEN_INVALID = (
    "The OSMOSIS_TOKEN environment variable is invalid or expired. Set it to a valid "
    "token, or unset it to use saved credentials."
)
_SESSION_MESSAGES = {
    "TOKEN_REVOKED": "Your session has been revoked. Run 'osmosis auth login' to log in again.",
}
SESSION_EXPIRED = "Your session has expired. Run 'osmosis auth login' to log in again."
_SCOPE_MESSAGES = {
    "GIT_SCOPE_REQUIRED": "This command must run in a workspace directory (a Git clone of "
    "a repository connected to a platform workspace).",
    "GIT_SCOPE_HEADER_REQUIRED": "This command must run in a workspace directory (a Git "
    "clone of a repository connected to a platform workspace).",
    "GIT_SCOPE_INVALID": "The workspace directory's Git identity (origin owner/repo) is invalid.",
    "GIT_REPOSITORY_NOT_CONNECTED": "No platform workspace you can see is connected to this "
    "repository's origin. Connect it on the platform, or run from a clone of a connected "
    "repository.",
    "GIT_REPOSITORY_ACCESS_DENIED": "Your account is not a member of the platform workspace "
    "connected to this repository. Log in with an account that is, or ask to be added.",
}


def _body(response: httpx.Response) -> JSONObject:
    try:
        parsed = response.json()
    except (ValueError, UnicodeDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _body_message(body: JSONObject) -> str | None:
    for key in ("message", "error"):
        value = body.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _issue_lines(body: JSONObject) -> str:
    issues = body.get("issues")
    if not isinstance(issues, list):
        return ""
    lines: list[str] = []
    for issue in issues:
        if isinstance(issue, str):
            lines.append(issue)
        elif isinstance(issue, dict):
            key, text = issue.get("key"), issue.get("message")
            line = ": ".join(str(p) for p in (key, text) if isinstance(p, str) and p)
            correction = issue.get("key_correction")
            if isinstance(correction, str) and correction:
                line += f" (did you mean '{correction}'?)"
            if line:
                lines.append(line)
    return "".join(f"\n  - {line}" for line in lines)


def error_details(body: JSONObject, status_code: int) -> dict[str, object]:
    """``details`` of a platform error: platform code, field, the body's details, status."""
    details: dict[str, object] = {}
    code = body.get("code")
    if isinstance(code, str) and code:
        details["platform_code"] = code
    elif "deployment_conflict" in (body.get("error"), body.get("code")):
        details["platform_code"] = "deployment_conflict"
    field_name = body.get("field")
    if isinstance(field_name, str) and field_name:
        details["field"] = field_name
    nested = body.get("details")
    if isinstance(nested, dict):
        for key, value in nested.items():
            details.setdefault(str(key), value)
    for key, value in body.items():
        if key not in _ENVELOPE_KEYS:
            details.setdefault(key, value)
    if isinstance(body.get("issues"), list):
        details["issues"] = body["issues"]
    details["status_code"] = status_code
    return details


def error_code_for(status: int, platform_code: str | None, message: str) -> str:
    """The CLI error code of an HTTP failure (reference §3.3)."""
    if status == 403:
        if platform_code in ("SUBSCRIPTION_REQUIRED", "BILLING_REQUIRED"):
            return platform_code
        return "SUBSCRIPTION_REQUIRED" if "subscription" in message.lower() else "PLATFORM_ERROR"
    return {
        400: "VALIDATION",
        401: "AUTH_REQUIRED",
        404: "NOT_FOUND",
        409: "CONFLICT",
        422: "VALIDATION",
        426: "UPGRADE_REQUIRED",
        429: "RATE_LIMITED",
    }.get(status, "PLATFORM_ERROR")


def error_from_response(
    response: httpx.Response, *, using_env_token: bool = False
) -> PlatformClientError:
    """The :class:`PlatformClientError` that reports a failed answer."""
    status = response.status_code
    body = _body(response)
    details = error_details(body, status)
    platform_code = details.get("platform_code")
    platform_code = platform_code if isinstance(platform_code, str) else None
    message = _body_message(body)
    if status == 401:
        if using_env_token:
            message = _ENV_TOKEN_MESSAGES.get(platform_code or "", _ENV_TOKEN_INVALID)
        else:
            message = _SESSION_MESSAGES.get(platform_code or "", SESSION_EXPIRED)
    elif status == 426:
        signal = body.get("message") if body.get("status") in _VERSION_WARNINGS else None
        message = message or (signal if isinstance(signal, str) else None) or UPGRADE_FALLBACK
        details.pop("platform_code", None)
    elif platform_code in _SCOPE_MESSAGES:
        message = _SCOPE_MESSAGES[platform_code]
    elif message is None:
        request = response.request
        text = response.text.strip()[:200]
        tail = f": {text}" if text else ""
        message = (
            f"The platform answered HTTP {status} to {request.method} {request.url.path}{tail}"
        )
    message += _issue_lines(body)
    return PlatformClientError(
        error_code_for(status, platform_code, message),
        message,
        status_code=status,
        details=details,
    )


def network_error(exc: httpx.HTTPError, base_url: str) -> PlatformClientError:
    if isinstance(exc, httpx.TimeoutException):
        message = f"The platform at {base_url} did not answer in time. Check the connection."
    else:
        message = f"Could not reach the platform at {base_url}: {exc}"
    details: dict[str, object] = {"platform_url": base_url}
    if isinstance(exc, httpx.TimeoutException):
        details["timeout"] = True
    return PlatformClientError("NETWORK", message, details=details)


# --- version signal -------------------------------------------------------------------------

_VERSION_WARNINGS = {
    "upgrade_available": "UPGRADE_AVAILABLE",
    "deprecated": "DEPRECATED",
    "unsupported": "UPGRADE_REQUIRED",
    "current": "",
}
_signalled: set[str] = set()  # each status is reported once per process


def surface_version_signal(headers: httpx.Headers, warn: Warn | None) -> None:
    status = headers.get(VERSION_STATUS_HEADER, "")
    message = headers.get(VERSION_MESSAGE_HEADER, "")
    code = _VERSION_WARNINGS.get(status)
    if not code or not message or warn is None or status in _signalled:
        return
    _signalled.add(status)
    warn(code, message)


# --- the client -----------------------------------------------------------------------------


def cli_headers(token: str | None = None) -> dict[str, str]:
    headers = {
        "User-Agent": f"osmosis-cli/{PACKAGE_VERSION}",
        "X-Osmosis-CLI-Version": PACKAGE_VERSION,
        "Accept": "application/json",
    }
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class PlatformClient:
    """Calls to one platform as one caller; ``git_identity`` scopes repo-scoped calls.

    ``transport`` lets tests talk to an ASGI app in process; ``sleep`` and ``clock`` are
    the waits of device-code polling and upload retries.
    """

    def __init__(
        self,
        base_url: str,
        token: str | None = None,
        *,
        git_identity: str | None = None,
        using_env_token: bool = False,
        allow_insecure_transfers: bool = False,
        warn: Warn | None = None,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.base_url = normalize_platform_url(base_url)
        self.token = token
        self.git_identity = git_identity
        self.using_env_token = using_env_token
        self.allow_insecure_transfers = allow_insecure_transfers
        self.warn = warn
        self.sleep = sleep
        self.clock = clock
        self._transport = transport
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=cli_headers(token),
            timeout=timeout,
            transport=transport,
            follow_redirects=False,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> PlatformClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- plain calls ----------------------------------------------------------------------

    def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: object = None,
        scoped: bool = True,
        timeout: float | None = None,
    ) -> httpx.Response:
        """One request; raises :class:`PlatformClientError` for network errors only."""
        headers: dict[str, str] = {}
        if scoped and self.git_identity:
            headers["X-Osmosis-Git"] = self.git_identity
        try:
            response = self._http.request(
                method,
                path,
                params=dict(params) if params else None,
                json=json,
                headers=headers,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT,
            )
        except httpx.HTTPError as exc:
            raise network_error(exc, self.base_url) from exc
        surface_version_signal(response.headers, self.warn)
        return response

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json: object = None,
        scoped: bool = True,
        timeout: float | None = None,
    ) -> JSONObject:
        """One request whose answer must be a JSON object (``{}`` for an empty answer)."""
        response = self.send(method, path, params=params, json=json, scoped=scoped, timeout=timeout)
        if response.is_error:
            raise error_from_response(response, using_env_token=self.using_env_token)
        if response.status_code == 204 or not response.content:
            return {}
        body = _body(response)
        if not body and response.content.strip() not in (b"{}",):
            raise PlatformClientError(
                "PLATFORM_ERROR",
                f"The platform answered {method} {path} with something other than a JSON "
                "object; check that the platform URL points at an Osmosis platform.",
                status_code=response.status_code,
                details={"status_code": response.status_code},
            )
        return body

    def model(self, cls: type[M], body: JSONObject, what: str) -> M:
        try:
            return cls.model_validate(body)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise PlatformClientError(
                "PLATFORM_ERROR",
                f"The platform's answer to {what} is not what this CLI understands ({problems}).",
            ) from None

    # --- lists ----------------------------------------------------------------------------

    def page(
        self,
        path: str,
        items_key: str,
        *,
        limit: int = PAGE_LIMIT,
        offset: int = 0,
        params: Mapping[str, str | int] | None = None,
    ) -> Page:
        body = self.call("GET", path, params={**(params or {}), "limit": limit, "offset": offset})
        raw = body.get(items_key, [])
        items = [item for item in raw if isinstance(item, dict)] if isinstance(raw, list) else []
        total = body.get("total_count")
        next_offset = body.get("next_offset")
        return Page(
            items=items,
            total_count=total if isinstance(total, int) else len(items),
            has_more=bool(body.get("has_more", False)),
            next_offset=next_offset if isinstance(next_offset, int) else None,
            body=body,
        )

    def fetch(
        self,
        path: str,
        items_key: str,
        *,
        limit: int = PAGE_LIMIT,
        fetch_all: bool = False,
        params: Mapping[str, str | int] | None = None,
    ) -> Page:
        """One page of ``limit`` items, or (``fetch_all``) every page, walked by offset."""
        first = self.page(path, items_key, limit=PAGE_LIMIT if fetch_all else limit, params=params)
        if not fetch_all:
            return first
        items = list(first.items)
        total, offset, current = first.total_count, 0, first
        while current.next_offset is not None and current.items and current.next_offset > offset:
            offset = current.next_offset
            current = self.page(path, items_key, limit=PAGE_LIMIT, offset=offset, params=params)
            items.extend(current.items)
            total = current.total_count
        return Page(
            items=items, total_count=total, has_more=False, next_offset=None, body=first.body
        )

    def logs(
        self, path: str, *, limit: int, cursor: str | None = None, direction: str = "older"
    ) -> LogsPage:
        params: dict[str, str | int] = {"limit": limit, "direction": direction}
        if cursor is not None:
            params["cursor"] = cursor
        body = self.call("GET", path, params=params)
        raw = body.get("logs", [])
        logs = [entry for entry in raw if isinstance(entry, dict)] if isinstance(raw, list) else []
        next_cursor = body.get("next_cursor")
        return LogsPage(logs, next_cursor if isinstance(next_cursor, str) and next_cursor else None)

    # --- authentication -------------------------------------------------------------------

    def verify(self) -> Verification:
        body = self.call("GET", "/api/cli/verify")
        return self.model(Verification, body, "GET /api/cli/verify")

    def revoke(self, token_id: str) -> str | None:
        """Revoke a token; ``None`` when gone (401 counts: already revoked), else why not."""
        try:
            response = self.send("DELETE", f"/api/cli/tokens/{segment(token_id)}", scoped=False)
        except PlatformClientError as exc:
            return exc.message
        if response.is_success or response.status_code == 401:
            return None
        return f"the platform answered HTTP {response.status_code}"

    def device_authorize(self, device_name: str | None = None) -> DeviceCode:
        name = device_name or socket.gethostname() or "unknown"
        body = self.call(
            "POST", "/api/cli/device/authorize", json={"deviceName": name}, scoped=False
        )
        return self.model(DeviceCode, body, "POST /api/cli/device/authorize")

    def device_poll(
        self,
        code: DeviceCode,
        *,
        max_wait: float = 900.0,
        on_wait: Callable[[], None] | None = None,
    ) -> DeviceGrant:
        """Poll until the user approves; ``slow_down`` adds 5 s to the interval (RFC 8628)."""
        deadline = self.clock() + min(max_wait, float(code.expires_in))
        interval = max(1.0, float(code.interval))
        path = "/api/cli/device/token"
        while True:
            remaining = deadline - self.clock()
            if remaining <= 0:
                raise PlatformClientError(
                    "AUTH_REQUIRED", "The login code expired before it was approved. Try again."
                )
            try:
                response = self.send(
                    "POST",
                    path,
                    json={"device_code": code.device_code},
                    scoped=False,
                    timeout=min(30.0, remaining),
                )
            except PlatformClientError as exc:
                if not exc.details.get("timeout"):
                    raise  # one stalled poll is not fatal; the deadline bounds the loop
                self.sleep(min(interval, max(0.0, deadline - self.clock())))
                continue
            if response.is_success:
                return self.model(DeviceGrant, _body(response), f"POST {path}")
            body = _body(response)
            state = body.get("error") if isinstance(body.get("error"), str) else body.get("code")
            if response.status_code in (400, 428) and state in (
                "authorization_pending",
                "slow_down",
            ):
                if state == "slow_down":
                    interval = min(interval + 5, 30.0)
                if on_wait is not None:
                    on_wait()
                self.sleep(min(interval, max(0.0, deadline - self.clock())))
                continue
            if state == "expired_token":
                raise PlatformClientError(
                    "AUTH_REQUIRED",
                    "The login code expired before it was approved. Try again.",
                    status_code=response.status_code,
                    details=error_details(body, response.status_code),
                )
            if state == "access_denied":
                raise PlatformClientError(
                    "AUTH_REQUIRED",
                    "The login was denied in the browser.",
                    status_code=response.status_code,
                    details=error_details(body, response.status_code),
                )
            raise error_from_response(response)


def default_expiry() -> datetime:
    """What a token without ``expires_at`` is assumed to live until (90 days)."""
    return datetime.now(UTC) + timedelta(days=90)
