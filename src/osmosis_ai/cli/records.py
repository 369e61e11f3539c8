"""Platform records as the CLI's JSON shows them: fixed key sets, pinned by golden files.

The platform may send more (or fewer) fields than a record shows; a missing field is
``null``, an extra one is dropped, so ``--json`` consumers see one stable shape (the
0.3.8 CLI's serializers). Secret values are never part of any record.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DATASET_KEYS = (
    "id",
    "file_name",
    "file_size",
    "status",
    "file_format",
    "original_file_format",
    "row_count",
    "original_file_size",
    "creator_name",
    "created_at",
    "updated_at",
)
ROLLOUT_KEYS = (
    "id",
    "name",
    "description",
    "repo_full_name",
    "last_synced_commit_sha",
    "last_synced_at",
    "created_at",
)
BASE_MODEL_KEYS = ("id", "model_name", "base_model", "creator_name", "created_at", "updated_at")
LORA_MODEL_KEYS = (
    "id",
    "model_name",
    "base_model",
    "training_run_name",
    "checkpoint_step",
    "reward",
)
LORA_DEPLOYMENT_KEYS = ("deployment_status", "deployed_at", "deployed_by")
SECRET_KEYS = ("id", "name", "scope", "created_at", "updated_at", "creator_name", "updater_name")
LOG_KEYS = ("timestamp", "level", "step", "message", "details")

# The platform's wire scope of a personal secret is "user"; people say "personal".
WIRE_PERSONAL = "user"
# The scope a secret is set in or deleted from, as people say it -> as the platform takes it.
SECRET_SCOPES = {"personal": WIRE_PERSONAL, "workspace": "workspace"}


def pick(record: Mapping[str, Any], keys: tuple[str, ...]) -> dict[str, object]:
    return {key: record.get(key) for key in keys}


def with_platform_url(data: dict[str, object], record: Mapping[str, Any]) -> dict[str, object]:
    url = record.get("platform_url")
    if isinstance(url, str) and url:
        data["platform_url"] = url
    return data


def dataset(record: Mapping[str, Any]) -> dict[str, object]:
    return with_platform_url(pick(record, DATASET_KEYS), record)


def rollout(record: Mapping[str, Any]) -> dict[str, object]:
    return pick(record, ROLLOUT_KEYS)


def base_model(record: Mapping[str, Any]) -> dict[str, object]:
    return pick(record, BASE_MODEL_KEYS)


def lora_model(record: Mapping[str, Any]) -> dict[str, object]:
    """Deployment keys only when the platform sent them (inference available)."""
    data = pick(record, LORA_MODEL_KEYS)
    if record.get("checkpoint_type") is not None:  # lora or full, where the platform says
        data["checkpoint_type"] = record["checkpoint_type"]
    if "deployment_status" in record:
        data.update(pick(record, LORA_DEPLOYMENT_KEYS))
    data["created_at"] = record.get("created_at")
    return data


def display_scope(scope: object) -> object:
    return "personal" if scope == WIRE_PERSONAL else scope


def secret(record: Mapping[str, Any]) -> dict[str, object]:
    data = pick(record, SECRET_KEYS)
    data["scope"] = display_scope(data["scope"])
    return data


def log_entry(record: Mapping[str, Any]) -> dict[str, object]:
    return pick(record, LOG_KEYS)


def size_text(size: object) -> str | None:
    """``1.5 MB``-style sizes for humans (JSON keeps bytes)."""
    if not isinstance(size, int | float) or isinstance(size, bool):
        return None
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024:
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TB"


# --- waiting for a run to end ------------------------------------------------------------------

#: The states a platform run does not leave (eval and training runs alike).
ENDED = frozenset({"finished", "failed", "crashed", "stopped", "killed"})
WAIT_POLL_S = 2.0


def add_wait_argument(parser: Any, what: str) -> None:
    """``--wait SECONDS``: poll until the run ends, at most that long."""
    parser.add_argument(
        "--wait",
        type=_seconds,
        metavar="SECONDS",
        help=f"wait until the {what} ends (finished, failed, stopped), at most SECONDS; "
        "exit 1 unless it finished, or at the deadline naming its status",
    )


def _seconds(text: str) -> float:
    from osmosis_ai.cli.errors import CLIUsageError

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise CLIUsageError(f"--wait {text!r}: give a number of seconds above 0, e.g. --wait 600")
    return value


def wait_until_ended(status_of: Any, *, what: str, name: str, timeout_s: float) -> str:
    """Call ``status_of()`` every 2 s until it answers an ended state; return that state.

    Past ``timeout_s`` raises a ``CLIError`` naming the run, its last status and the option.
    """
    import time

    from osmosis_ai.cli.errors import CLIError, CLIErrorCode

    deadline = time.monotonic() + timeout_s
    while True:
        status = str(status_of())
        if status in ENDED:
            return status
        left = deadline - time.monotonic()
        if left <= 0:
            raise CLIError(
                CLIErrorCode.CONFLICT,
                f"The {what} {name} is still {status} after --wait {timeout_s:g} s. Wait "
                "longer (a larger --wait), or look at it with its logs command.",
                {"name": name, "status": status, "wait_s": timeout_s},
            )
        time.sleep(min(WAIT_POLL_S, left))
