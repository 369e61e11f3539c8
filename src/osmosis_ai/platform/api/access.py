"""A short-lived cache of who a token is and which workspace a request's header names.

Every API call authenticates its bearer token and most resolve their workspace from
``X-Osmosis-Git``: two reads whose transactions cost more than a list route's own query.
:class:`AccessCache` keeps what they found for at most :data:`ACCESS_CACHE_TTL_S`:

* a commit **in this process** that changes a token (anything but its last use), a user, a
  workspace or a membership drops every entry at once (:data:`ACCESS_CHANGES`, counted by
  SQLAlchemy session events on every ORM session of the process), so a token revoked through
  the API, or a member removed by code running in the server, is refused by the next request;
* a change **another process** commits (``osmosis platform token revoke`` beside a running
  server) reaches the server when the entry it changes is older than the TTL: within
  :data:`ACCESS_CACHE_TTL_S` seconds. Raw SQL that bypasses the ORM is seen the same way.

Only lookups that succeeded are kept, never failures; a token's expiry is checked against
the platform's clock on every request, cached or not. Entries are keyed by the token's
SHA-256, never the raw token.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Generic, TypeVar

from sqlalchemy import event, inspect
from sqlalchemy.orm import ORMExecuteState, Session, UOWTransaction

from osmosis_ai.platform.auth import Principal, last_use_due
from osmosis_ai.platform.services.accounts import WorkspaceAccess
from osmosis_ai.platform.store.orm import Membership, Token, User, Workspace

# How long another process's revoke or membership change can take to reach a running server.
ACCESS_CACHE_TTL_S = 1.0
MAX_ACCESS_CACHE_TTL_S = 2.0
MAX_ENTRIES = 10_000  # a full cache starts over rather than grow without bound

_WATCHED = (Token, User, Workspace, Membership)
_CHANGED = "osmosis_access_changed"  # Session.info flag: this transaction changed access
_TOKEN_USE_ONLY = frozenset({"last_used_at"})

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class ChangeCounter:
    """How many commits in this process changed who may do what (only ever grows)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = 0

    def bump(self) -> None:
        with self._lock:
            self.value += 1


ACCESS_CHANGES = ChangeCounter()


def _changes_access(obj: object, *, dirty: bool) -> bool:
    if not isinstance(obj, _WATCHED):
        return False
    if not dirty or not isinstance(obj, Token):
        return True
    # Writing a token's last use (once a minute per token) changes no one's access.
    state = inspect(obj)
    changed = {attr.key for attr in state.attrs if attr.history.has_changes()}
    return not changed <= _TOKEN_USE_ONLY


def _after_flush(session: Session, flush_context: UOWTransaction) -> None:
    if session.info.get(_CHANGED):
        return
    if any(_changes_access(obj, dirty=False) for obj in (*session.new, *session.deleted)) or any(
        _changes_access(obj, dirty=True) for obj in session.dirty
    ):
        session.info[_CHANGED] = True


def _do_orm_execute(state: ORMExecuteState) -> None:
    if (state.is_update or state.is_delete) and any(
        issubclass(mapper.class_, _WATCHED) for mapper in state.all_mappers
    ):
        state.session.info[_CHANGED] = True


def _after_commit(session: Session) -> None:
    if session.info.pop(_CHANGED, False):
        ACCESS_CHANGES.bump()


event.listen(Session, "after_flush", _after_flush)
event.listen(Session, "do_orm_execute", _do_orm_execute)
event.listen(Session, "after_commit", _after_commit)


@dataclass(slots=True)
class _Entry(Generic[V]):
    value: V
    generation: int
    fetched_at: float


@dataclass(slots=True)
class _Load(Generic[V]):
    future: asyncio.Future[V | None]
    generation: int


class _Entries(Generic[K, V]):
    def __init__(self, cache: AccessCache) -> None:
        self._cache = cache
        self._entries: dict[K, _Entry[V]] = {}
        self._loading: dict[K, _Load[V]] = {}

    async def fetch(self, key: K, load: Callable[[], Awaitable[V | None]]) -> V | None:
        """The value of ``key``: cached, else what ``load`` answers (kept unless ``None``).

        Requests that miss the same key at once share one load, so an entry expiring under
        fifty clients costs one lookup, not fifty. A request joins a load only while no
        access change has been committed since it began; after one, it loads for itself.
        """
        value = self.get(key)
        if value is not None:
            return value
        loop = asyncio.get_running_loop()
        running = self._loading.get(key)
        generation = self._cache.generation()
        if (
            running is not None
            and running.generation == generation
            and running.future.get_loop() is loop
        ):
            shared = await asyncio.shield(running.future)
            if shared is not None and self._cache.generation() == generation:
                return shared
            return await load()  # it failed, found nothing, or access changed meanwhile
        mine = _Load[V](loop.create_future(), generation)
        self._loading[key] = mine
        try:
            value = await load()
            if value is not None:
                self.put(key, value, generation)
            return value
        finally:
            if self._loading.get(key) is mine:
                del self._loading[key]
            mine.future.set_result(value)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if (
            entry.generation != self._cache.changes.value
            or self._cache.clock() - entry.fetched_at >= self._cache.ttl_s
        ):
            del self._entries[key]
            return None
        return entry.value

    def put(self, key: K, value: V, generation: int) -> None:
        """Keep ``value``, read after :meth:`AccessCache.generation` answered ``generation``."""
        if generation != self._cache.changes.value:
            return  # access changed while it was read: it may be stale already
        if len(self._entries) >= MAX_ENTRIES:
            self._entries.clear()
        self._entries[key] = _Entry(value, generation, self._cache.clock())

    def peek(self, key: K) -> V | None:
        """The value kept for ``key``, however old (for bookkeeping, never for access)."""
        entry = self._entries.get(key)
        return None if entry is None else entry.value

    def update(self, key: K, change: Callable[[V], V]) -> None:
        entry = self._entries.get(key)
        if entry is not None:
            entry.value = change(entry.value)

    def __len__(self) -> int:
        return len(self._entries)


class AccessCache:
    """Principals by token hash and workspaces by (user, header), for ``ttl_s`` seconds.

    ``clock`` is monotonic seconds (injected in tests); ``changes`` counts this process's
    commits that change access. Read :meth:`generation` before the lookup a value comes
    from and pass it to ``put``: a change committed in between keeps the value out.
    """

    def __init__(
        self,
        ttl_s: float = ACCESS_CACHE_TTL_S,
        *,
        clock: Callable[[], float] = time.monotonic,
        changes: ChangeCounter = ACCESS_CHANGES,
    ) -> None:
        if not 0 <= ttl_s <= MAX_ACCESS_CACHE_TTL_S:
            raise ValueError(
                f"An access cache TTL of {ttl_s} s is out of range: pick 0 (no cache) to "
                f"{MAX_ACCESS_CACHE_TTL_S} s, the longest a revoke elsewhere may take to apply."
            )
        self.ttl_s = ttl_s
        self.clock = clock
        self.changes = changes
        self.principals: _Entries[str, Principal] = _Entries(self)
        self.workspaces: _Entries[tuple[str, str, str], WorkspaceAccess] = _Entries(self)

    def generation(self) -> int:
        return self.changes.value

    def claim_touch(self, token_hash: str, now: datetime) -> bool:
        """Whether this request writes the token's last use as ``now``: ``False`` when the
        cached principal says another request has already claimed it."""
        cached = self.principals.peek(token_hash)
        if cached is None:
            return True
        if not last_use_due(cached.last_used_at, now):
            return False
        self.principals.update(
            token_hash, lambda principal: replace(principal, last_used_at=now, touch_due=False)
        )
        return True
