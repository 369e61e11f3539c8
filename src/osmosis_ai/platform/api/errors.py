"""Every error the API answers with is the envelope ``{error, message, code?, field?, details?}``.

Platform errors carry their own status and code; request validation failures become 400
``VALIDATION`` with the offending ``field`` and an ``issues`` list (``{key, message}``);
unknown routes 404, wrong methods 405, and anything unexpected 500 ``INTERNAL`` (logged
here, never described to the caller).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from osmosis_ai.platform.api.limits import RateLimitedError
from osmosis_ai.platform.errors import AuthenticationError, InvalidRequestError, PlatformError

logger = logging.getLogger("osmosis_ai.platform")

_HTTP_CODES = {
    400: "VALIDATION",
    401: "TOKEN_MISSING",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    409: "CONFLICT",
    413: "PAYLOAD_TOO_LARGE",
    429: "RATE_LIMITED",
}


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(PlatformError, _platform_error)  # pyright: ignore[reportArgumentType]
    app.add_exception_handler(RequestValidationError, _validation_error)  # pyright: ignore[reportArgumentType]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # pyright: ignore[reportArgumentType]
    app.add_exception_handler(Exception, _internal_error)


def error_response(error: PlatformError, *, extra: dict[str, object] | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if isinstance(error, AuthenticationError) else None
    if isinstance(error, RateLimitedError):
        headers = {"Retry-After": str(error.retry_after)}
    body = {**error.envelope(), **(extra or {})}
    return JSONResponse(body, status_code=error.status_code, headers=headers)


async def _platform_error(request: Request, exc: PlatformError) -> JSONResponse:
    return error_response(exc)


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    issues: list[dict[str, object]] = []
    for raw in exc.errors():
        location = [str(part) for part in raw.get("loc", ())]
        if location and location[0] in ("body", "query", "path", "header", "cookie"):
            location = location[1:]
        issues.append({"key": ".".join(location) or "body", "message": str(raw.get("msg", ""))})
    summary = "; ".join(f"{issue['key']}: {issue['message']}" for issue in issues[:5])
    error = InvalidRequestError(
        f"Invalid request: {summary}" if summary else "Invalid request.",
        field=str(issues[0]["key"]) if issues else None,
        details={"issues": issues},
    )
    return error_response(error, extra={"issues": issues})


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        message = f"No such endpoint: {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"Method {request.method} is not allowed on {request.url.path}"
    else:
        message = str(exc.detail)
    code = _HTTP_CODES.get(exc.status_code, "PLATFORM_ERROR")
    body: dict[str, object] = {"error": message, "message": message, "code": code}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unexpected error answering %s %s", request.method, request.url.path)
    message = "The platform hit an internal error; its log has the details."
    body: dict[str, object] = {"error": message, "message": message, "code": "INTERNAL"}
    return JSONResponse(body, status_code=500)
