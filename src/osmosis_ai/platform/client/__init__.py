"""What the CLI talks to a platform with: light on purpose (httpx, pydantic, the standard
library), never server code, so a client needs no ``platform`` extra.

    errors.py       PlatformClientError and its subclasses, each naming its CLI error code
    api.py          PlatformClient: the ``/api/cli`` calls, the §3.3 error codes, version
                    signals, pagination, device login; the wire models of its answers
    credentials.py  the platform URL, the ``OSMOSIS_TOKEN`` binding, saved logins (OS
                    keyring or an owner-only v2 file)
    transfer.py     bytes through presigned URLs (one PUT or parts up, a streamed GET down)
    local_repo.py   the clone's ``origin`` owner/repo, unpushed work
    submit.py       the submit: preflight, rows and stored secrets looked up, payload, POST
    login.py        login (a token verified, or a device login), logout, token revocation
    datasets.py     a dataset's upload (validated, created, sent, completed) and download
    checkpoints.py  a training checkpoint's download
    eval_runs.py    an eval run's download into a local run dir; a local run's upload

Each command of the CLI's platform group parses its options, calls one of these, and shows
the result; these raise the errors of ``errors.py`` and never print.

This package re-exports ``api.py`` and ``errors.py``, the import path the CLI has always used.
"""

from __future__ import annotations

from osmosis_ai.platform.client.api import (
    DEFAULT_PLATFORM_URL,
    LOG_PAGE_LIMIT,
    PAGE_LIMIT,
    SESSION_EXPIRED,
    UPGRADE_FALLBACK,
    VERSION_MESSAGE_HEADER,
    VERSION_STATUS_HEADER,
    DeviceCode,
    DeviceGrant,
    DownloadLink,
    JSONObject,
    LogsPage,
    Page,
    PartUrl,
    PlatformClient,
    Progress,
    SubmitResult,
    UploadInstructions,
    User,
    Verification,
    Warn,
    Workspace,
    cli_headers,
    default_expiry,
    error_code_for,
    error_details,
    error_from_response,
    is_insecure_url,
    is_loopback_host,
    network_error,
    normalize_platform_url,
    parse_timestamp,
    segment,
    surface_version_signal,
)
from osmosis_ai.platform.client.errors import PlatformClientError

__all__ = [
    "DEFAULT_PLATFORM_URL",
    "LOG_PAGE_LIMIT",
    "PAGE_LIMIT",
    "SESSION_EXPIRED",
    "UPGRADE_FALLBACK",
    "VERSION_MESSAGE_HEADER",
    "VERSION_STATUS_HEADER",
    "DeviceCode",
    "DeviceGrant",
    "DownloadLink",
    "JSONObject",
    "LogsPage",
    "Page",
    "PartUrl",
    "PlatformClient",
    "PlatformClientError",
    "Progress",
    "SubmitResult",
    "UploadInstructions",
    "User",
    "Verification",
    "Warn",
    "Workspace",
    "cli_headers",
    "default_expiry",
    "error_code_for",
    "error_details",
    "error_from_response",
    "is_insecure_url",
    "is_loopback_host",
    "network_error",
    "normalize_platform_url",
    "parse_timestamp",
    "segment",
    "surface_version_signal",
]
