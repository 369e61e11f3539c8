"""The server's table of admitted rollouts: status, polling leases, results, retention.

One entry per rollout id. Polling-generation entries hold a lease (only its SHA-256 digest
is kept) that every poll renews; when polls stop for longer than the lease, a timer fails
the rollout with ``lease_expired``. Terminal results are kept, pre-encoded, for the
retention period, after which the id is forgotten and may be admitted again.

An entry admitted from a body that carries an ``llm_api_key`` also keeps a keyed BLAKE2b
digest of that body and the lease sealed under a pad that only that body yields, so
:meth:`Registry.replay` can hand the lease back to whoever sends the very same body again,
while nothing the registry holds yields the lease without that body.

A long poll returns at every status change. A progress change (``running``, ``grading``)
wakes it once it has lasted :data:`PROGRESS_COALESCE_SEC`, so a rollout that moves on at
once (a quick grader) answers its poll with the later state, and the poll that a
short-lived ``grading`` would cost is saved; a terminal result wakes it at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from osmosis_ai.errors import OsmosisError
from osmosis_ai.rollout.protocol import Generation
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus

PROGRESS_COALESCE_SEC = 0.05
_TOKEN_BYTES = 32


class DuplicateRolloutError(OsmosisError):
    """A polling-generation request reused an id the server still holds."""


@dataclass
class Entry:
    """One admitted rollout."""

    rollout_id: str
    generation: Generation
    status: RolloutStatus = RolloutStatus.QUEUED
    task: asyncio.Task[None] | None = None
    lease_digest: bytes | None = None
    replay_digest: bytes | None = None
    """Keyed digest of the admitting body (set when it may be replayed, see Registry.replay)."""
    sealed_lease: bytes | None = None
    """The lease token's bytes XOR a pad that only the admitting body yields."""
    lease_deadline: float = 0.0
    lease_timer: asyncio.TimerHandle | None = None
    progress_timer: asyncio.TimerHandle | None = None
    reward: float | None = None
    err_message: str | None = None
    result_body: bytes | None = None
    cancel_disposition: str | None = None
    concluding: bool = False
    """Execution has ended; the result is being saved and published (no longer cancellable)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def terminal(self) -> bool:
        return self.result_body is not None

    def progress_body(self) -> bytes:
        return json.dumps(
            {
                "rollout_id": self.rollout_id,
                "status": self.status.value,
                "sample": None,
                "err_message": None,
                "err_category": None,
            }
        ).encode()


def _token_text(raw: bytes) -> str:
    """A lease token as sent: URL-safe base64 without padding (43 characters)."""
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _xor(data: bytes, pad: bytes) -> bytes:
    return (int.from_bytes(data) ^ int.from_bytes(pad)).to_bytes(len(data))


def result_body(
    rollout_id: str,
    status: RolloutStatus,
    sample: RolloutSample | None,
    err_message: str | None,
    err_category: RolloutErrorCategory | None,
) -> bytes:
    """Encode a terminal result, nulling the reward unless the rollout succeeded and counts."""
    body: dict[str, Any] = {
        "rollout_id": rollout_id,
        "status": status.value,
        "sample": _counted(sample.wire_dict(), sample, status) if sample is not None else None,
        "err_message": err_message,
        "err_category": None if err_category is None else err_category.value,
    }
    try:
        return json.dumps(body, allow_nan=False).encode()
    except (TypeError, ValueError):  # the sample's own data cannot be sent as JSON
        body["sample"] = _minimal(body["sample"])
        return json.dumps(body, allow_nan=False).encode()


def wire_sample(sample: RolloutSample | None, status: RolloutStatus) -> dict[str, Any] | None:
    """The sample as sent: reward nulled unless ``success`` and not removed; a sample whose
    messages cannot be JSON-encoded is replaced by a minimal one so an earned reward arrives."""
    if sample is None:
        return None
    data = _counted(sample.wire_dict(), sample, status)
    try:
        json.dumps(data, allow_nan=False)
    except (TypeError, ValueError):
        data = _minimal(data)
    return data


def _counted(data: dict[str, Any], sample: RolloutSample, status: RolloutStatus) -> dict[str, Any]:
    if status != RolloutStatus.SUCCESS or sample.remove_sample:
        data["reward"] = None
    return data


def _minimal(data: dict[str, Any]) -> dict[str, Any]:
    return {
        "messages": [],
        "label": data["label"],
        "reward": data["reward"],
        "remove_sample": data["remove_sample"],
        "metrics": {},
        "extra_fields": {},
    }


class Registry:
    """Admitted rollouts by id, with lease and retention timers on the running loop."""

    def __init__(
        self,
        *,
        polling_lease_timeout_sec: float,
        result_retention_sec: float,
        on_lease_expired: Callable[[Entry], None],
    ) -> None:
        self.lease_timeout = polling_lease_timeout_sec
        self.retention = result_retention_sec
        self._on_lease_expired = on_lease_expired
        self.entries: dict[str, Entry] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self._replay_key = secrets.token_bytes(32)

    # -- admission -----------------------------------------------------------------------

    def admit(
        self, rollout_id: str, generation: Generation, *, body: bytes | None = None
    ) -> tuple[Entry, str | None]:
        """Register a rollout; returns the entry and, for the polling generation, its lease.

        ``body``: the raw request that admitted it, when a replay of it may recover the
        lease (see :meth:`replay`); ``None`` keeps the lease unrecoverable.
        """
        existing = self.entries.get(rollout_id)
        if existing is not None and (generation == "polling" or existing.generation == "polling"):
            raise DuplicateRolloutError(rollout_id)
        entry = Entry(rollout_id, generation)
        token: str | None = None
        if generation == "polling":
            raw = secrets.token_bytes(_TOKEN_BYTES)
            token = _token_text(raw)
            entry.lease_digest = hashlib.sha256(token.encode()).digest()
            if body is not None:
                entry.replay_digest, pad = self._replay_keys(body)
                entry.sealed_lease = _xor(raw, pad)
            entry.lease_deadline = time.monotonic() + self.lease_timeout
            entry.lease_timer = asyncio.get_running_loop().call_at(
                entry.lease_deadline, self._lease_check, entry
            )
        self.entries[rollout_id] = entry
        return entry, token

    def replay(self, rollout_id: str, body: bytes) -> str | None:
        """The lease of the held rollout ``rollout_id`` when ``body`` is, byte for byte, the
        request that admitted it (admitted with ``body=``); else ``None``. A replay renews
        an unexpired lease, as a poll does: its sender is about to poll."""
        entry = self.entries.get(rollout_id)
        if entry is None or entry.replay_digest is None or entry.sealed_lease is None:
            return None
        digest, pad = self._replay_keys(body)
        if not hmac.compare_digest(entry.replay_digest, digest):
            return None
        now = time.monotonic()
        if not entry.terminal and now < entry.lease_deadline:
            entry.lease_deadline = now + self.lease_timeout
        return _token_text(_xor(entry.sealed_lease, pad))

    def _replay_keys(self, body: bytes) -> tuple[bytes, bytes]:
        """``(digest, pad)`` of a request body: two halves of one keyed BLAKE2b, so the
        digest kept for comparison says nothing of the pad that seals the lease."""
        both = hashlib.blake2b(body, digest_size=2 * _TOKEN_BYTES, key=self._replay_key).digest()
        return both[:_TOKEN_BYTES], both[_TOKEN_BYTES:]

    def attach(self, entry: Entry, task: asyncio.Task[None]) -> None:
        entry.task = task
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    @property
    def active(self) -> int:
        return len(self.tasks)

    # -- status and results ----------------------------------------------------------------

    def set_status(self, entry: Entry, status: RolloutStatus) -> None:
        if entry.terminal or entry.status == status:
            return
        entry.status = status
        if entry.progress_timer is None:  # (pollers then see the state of that moment)
            entry.progress_timer = asyncio.get_running_loop().call_later(
                PROGRESS_COALESCE_SEC, self._progressed, entry
            )

    def _progressed(self, entry: Entry) -> None:
        entry.progress_timer = None
        if not entry.terminal:
            self._notify(entry)

    def finish(
        self,
        entry: Entry,
        status: RolloutStatus,
        sample: RolloutSample | None,
        err_message: str | None,
        err_category: RolloutErrorCategory | None,
    ) -> bool:
        """Publish the terminal result once; later calls are ignored (returns False)."""
        if entry.terminal:
            return False
        entry.result_body = result_body(entry.rollout_id, status, sample, err_message, err_category)
        entry.status = status
        entry.reward = (
            sample.reward
            if sample is not None and status == RolloutStatus.SUCCESS and not sample.remove_sample
            else None
        )
        entry.err_message = err_message
        if entry.lease_timer is not None:
            entry.lease_timer.cancel()
            entry.lease_timer = None
        if entry.progress_timer is not None:
            entry.progress_timer.cancel()
            entry.progress_timer = None
        asyncio.get_running_loop().call_later(self.retention, self._retire, entry)
        self._notify(entry)
        return True

    def _notify(self, entry: Entry) -> None:
        entry.changed.set()
        entry.changed = asyncio.Event()

    # -- polling ---------------------------------------------------------------------------

    def lease_matches(self, entry: Entry, token: str) -> bool:
        if entry.lease_digest is None:
            return False
        return hmac.compare_digest(entry.lease_digest, hashlib.sha256(token.encode()).digest())

    async def poll(self, entry: Entry, wait_sec: float) -> bytes:
        """Renew the lease, then wait for a status change or ``wait_sec``; return the state."""
        if entry.terminal:
            assert entry.result_body is not None
            return entry.result_body
        now = time.monotonic()
        if now >= entry.lease_deadline:
            self._expire(entry)
        else:
            entry.lease_deadline = now + self.lease_timeout
            seen = entry.status
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_sec):
                    # (a coalesced progress wake for a state this poll started in is no news)
                    while not entry.terminal and entry.status == seen:
                        await entry.changed.wait()
            entry.lease_deadline = max(entry.lease_deadline, time.monotonic() + self.lease_timeout)
        return entry.result_body if entry.result_body is not None else entry.progress_body()

    def _lease_check(self, entry: Entry) -> None:
        entry.lease_timer = None
        if entry.terminal:
            return
        now = time.monotonic()
        if now < entry.lease_deadline:
            entry.lease_timer = asyncio.get_running_loop().call_at(
                entry.lease_deadline, self._lease_check, entry
            )
            return
        self._expire(entry)

    def _expire(self, entry: Entry) -> None:
        if self.finish(
            entry,
            RolloutStatus.FAILURE,
            None,
            "polling lease expired",
            RolloutErrorCategory.LEASE_EXPIRED,
        ):
            self._on_lease_expired(entry)

    # -- retention -------------------------------------------------------------------------

    def _retire(self, entry: Entry) -> None:
        if entry.task is not None and not entry.task.done():
            entry.task.add_done_callback(lambda _task: self._drop(entry))
            return
        self._drop(entry)

    def _drop(self, entry: Entry) -> None:
        if self.entries.get(entry.rollout_id) is entry:
            del self.entries[entry.rollout_id]

    # -- selection -------------------------------------------------------------------------

    def select(
        self, ids: list[str] | None, prefix: str | None, all: bool
    ) -> list[tuple[str, Entry | None]]:
        """Entries named by a cancel selector; ``prefix``/``all`` pick only live rollouts."""
        if ids is not None:
            return [(i, self.entries.get(i)) for i in dict.fromkeys(ids)]
        live: list[tuple[str, Entry | None]] = [
            (i, e) for i, e in self.entries.items() if not e.terminal
        ]
        if prefix is not None:
            return [(i, e) for i, e in live if i.startswith(prefix)]
        return live if all else []
