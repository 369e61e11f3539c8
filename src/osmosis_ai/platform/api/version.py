"""CLI version signalling: every ``/api/`` answer says how the caller's CLI version stands.

The CLI sends ``X-Osmosis-CLI-Version``; answers carry ``X-Osmosis-Version-Status``
(``current``, ``upgrade_available``, ``deprecated``) and ``X-Osmosis-Version-Message``. A CLI
older than :data:`MIN_SUPPORTED_CLI_VERSION` gets 426 with the error envelope plus
``status: "unsupported"`` and the message in the body, before any route runs. A header that is
not a version (longer than :data:`MAX_VERSION_CHARS`, or one ``packaging`` cannot read) is
400 ``INVALID_CLI_VERSION``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.platform.errors import InvalidRequestError, PlatformError, UpgradeRequiredError

# The oldest CLI whose calls this platform still answers: the /api/cli contract of 0.3.
MIN_SUPPORTED_CLI_VERSION = "0.3.0"
# CLIs older than this still work but are told to upgrade soon.
DEPRECATED_BELOW_VERSION = "0.3.0"

CLI_VERSION_HEADER = "x-osmosis-cli-version"
STATUS_HEADER = "X-Osmosis-Version-Status"
MESSAGE_HEADER = "X-Osmosis-Version-Message"
UPGRADE_HINT = "Run: osmosis upgrade"
MAX_VERSION_CHARS = 64  # "0.3.10.dev12+g1234abcd" is 22


@dataclass(frozen=True)
class VersionSignal:
    status: str  # current | upgrade_available | deprecated | unsupported
    message: str


def classify(client_version: str, *, server_version: str = PACKAGE_VERSION) -> VersionSignal | None:
    """How ``client_version`` stands against this platform; ``None`` if it is not a version."""
    text = client_version.strip()
    if len(text) > MAX_VERSION_CHARS:
        return None
    try:
        client = Version(text)
    except (InvalidVersion, ValueError):  # ValueError: a number past int()'s digit limit
        return None
    if client < Version(MIN_SUPPORTED_CLI_VERSION):
        return VersionSignal(
            "unsupported",
            f"osmosis-ai {client} is no longer supported by this platform (the oldest "
            f"supported is {MIN_SUPPORTED_CLI_VERSION}). {UPGRADE_HINT}",
        )
    if client < Version(DEPRECATED_BELOW_VERSION):
        return VersionSignal(
            "deprecated",
            f"osmosis-ai {client} is deprecated and will stop working with this platform; "
            f"upgrade to {server_version} or newer. {UPGRADE_HINT}",
        )
    server = Version(server_version)
    # A development or pre-release server is nothing a CLI could upgrade to from an index.
    if client < server and not server.is_prerelease:
        return VersionSignal(
            "upgrade_available",
            f"osmosis-ai {server_version} is available (you have {client}). {UPGRADE_HINT}",
        )
    return VersionSignal("current", f"osmosis-ai {client} is current.")


class VersionSignalMiddleware:
    """Adds the version headers to ``/api/`` answers; answers 426 to unsupported CLIs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not str(scope.get("path", "")).startswith("/api/"):
            await self.app(scope, receive, send)
            return
        signal = None
        for name, value in scope.get("headers", ()):
            if name == CLI_VERSION_HEADER.encode():
                text = value.decode("latin-1")
                signal = classify(text)
                if signal is None:
                    await _send_error(send, _malformed(text), [])
                    return
                break
        if signal is None:
            await self.app(scope, receive, send)
            return
        headers = [
            (STATUS_HEADER.lower().encode(), signal.status.encode()),
            (MESSAGE_HEADER.lower().encode(), signal.message.encode("latin-1", "replace")),
        ]
        if signal.status == "unsupported":
            await _send_upgrade_required(send, signal, headers)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), *headers]}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _malformed(text: str) -> InvalidRequestError:
    shown = text if len(text) <= MAX_VERSION_CHARS else text[:MAX_VERSION_CHARS] + "…"
    return InvalidRequestError(
        f"The {CLI_VERSION_HEADER} header {shown!r} is not a version: send the osmosis-ai "
        "version, such as 0.3.8, or leave the header out.",
        code="INVALID_CLI_VERSION",
        field="X-Osmosis-CLI-Version",
    )


async def _send_upgrade_required(
    send: Send, signal: VersionSignal, headers: list[tuple[bytes, bytes]]
) -> None:
    error = UpgradeRequiredError(
        signal.message,
        details={
            "min_version": MIN_SUPPORTED_CLI_VERSION,
            "server_version": PACKAGE_VERSION,
        },
    )
    await _send_error(send, error, headers, status=signal.status)


async def _send_error(
    send: Send,
    error: PlatformError,
    headers: list[tuple[bytes, bytes]],
    *,
    status: str | None = None,
) -> None:
    envelope = error.envelope()
    body = json.dumps(envelope if status is None else {**envelope, "status": status}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status_code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
