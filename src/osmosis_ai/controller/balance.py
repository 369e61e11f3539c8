"""``BalancedDispatcher``: one dispatcher over several rollout servers (a fleet).

Each attempt goes to the live server with the lowest load for its advertised ``/health``
capacity (in flight ÷ capacity), through that server's own :class:`Dispatcher`. The fleet's
servers are named by URL: :meth:`BalancedDispatcher.slot_for` adds one once it answers
``/health``, and :meth:`BalancedDispatcher.follow` keeps the balance over exactly the URLs a
fleet lists (new ones join, ones no longer listed leave). A server that dies mid-run is
marked dead (by whoever watches the servers, or by the first attempt whose transport fails
while the server no longer answers ``/health``): its attempts in flight are cancelled, which
stops each one's commit before it can start, and each ends as ``lost_in_transit`` with
nothing committed, so the caller runs the item again under a fresh id on another server. An
attempt whose result was already committed keeps that result: no sample is counted twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol

import httpx

from osmosis_ai.controller.attempt import CommitHook, DispatchOutcome, DispatchRequest
from osmosis_ai.controller.dispatch import Dispatcher
from osmosis_ai.controller.service import ControllerService
from osmosis_ai.errors import RolloutProtocolError
from osmosis_ai.rollout.protocol import Generation

__all__ = ["LEFT_FLEET", "BalancedDispatcher", "RunsAttempts", "ServerSlot", "server_capacity"]

_HEALTH_PROBE_SEC = 3.0
LEFT_FLEET = "it left the fleet"
"""The death of a server :meth:`BalancedDispatcher.follow` no longer found listed."""


def server_capacity(health: Mapping[str, Any]) -> int | None:
    """The capacity ``/health`` advertises: ``concurrency.max_concurrent``, else
    ``max_queue_depth``; ``None`` when it advertises neither."""
    nested: Any = health.get("concurrency")
    if not isinstance(nested, dict):
        nested = {}
    for value in (nested.get("max_concurrent"), health.get("max_queue_depth")):
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


class RunsAttempts(Protocol):
    """What a worker pool needs of a dispatcher: run one attempt to its outcome."""

    async def run(
        self, request: DispatchRequest, *, commit: CommitHook | None = None
    ) -> DispatchOutcome: ...


@dataclass(eq=False)
class ServerSlot:
    """One rollout server behind a :class:`BalancedDispatcher`."""

    name: str
    dispatcher: Dispatcher
    capacity: int = 1
    alive: bool = True
    death: str = ""
    in_flight: int = 0
    dispatched: int = 0
    attempts: set[asyncio.Task[DispatchOutcome]] = field(default_factory=set, repr=False)


class BalancedDispatcher:
    """Runs attempts over its servers by capacity; see the module docstring.

    Args:
        service: the started controller service (proxy and listener) the rollouts use.
        generation: each server's :class:`Dispatcher` starts with it (``"auto"``: until
            :meth:`pin` says which generation the fleet speaks).
        on_dead: told of each server marked dead, once.
    """

    def __init__(
        self,
        service: ControllerService,
        *,
        generation: Literal["auto", "polling", "callback"] = "auto",
        on_dead: Callable[[ServerSlot], None] | None = None,
    ) -> None:
        self.service = service
        self.choice: Literal["auto", "polling", "callback"] = generation
        self.generation: Generation | None = None if generation == "auto" else generation
        self.slots: list[ServerSlot] = []
        self.on_dead = on_dead
        self._joining = asyncio.Lock()  # one new server at a time: a URL joins once

    async def slot_for(self, url: str) -> ServerSlot:
        """Server ``url``'s slot: the one it has, else a new one once the server answers
        ``/health`` (its advertised capacity, at least 1); raises what that probe raised."""
        async with self._joining:
            for slot in self.slots:
                if slot.name == url:
                    return slot
            dispatcher = Dispatcher(url, self.service, generation=self.choice)
            if self.generation is not None:
                dispatcher.generation = self.generation
            try:
                capacity = server_capacity(await dispatcher.health()) or 1
            except BaseException:
                await dispatcher.aclose()
                raise
            slot = ServerSlot(url, dispatcher, capacity)
            self.slots.append(slot)
            return slot

    async def follow(
        self, urls: Sequence[str]
    ) -> tuple[list[ServerSlot], list[tuple[str, Exception]]]:
        """Balance over exactly ``urls`` from now on: each new one joins once it answers
        ``/health``, each live server not listed leaves (marked dead with
        :data:`LEFT_FLEET`: its attempts in flight run again elsewhere); a server once dead
        never joins again. Returns the servers that joined, and the URLs not reachable from
        here (yet) with why: the next call tries them again."""
        known = {slot.name for slot in self.slots}
        joined: list[ServerSlot] = []
        unreachable: list[tuple[str, Exception]] = []
        for url in urls:
            if url in known:
                continue
            try:
                joined.append(await self.slot_for(url))
            except Exception as exc:  # whatever the probe met: the next call retries
                unreachable.append((url, exc))
            known.add(url)
        for slot in self.live():
            if slot.name not in urls:
                self.mark_dead(slot.name, LEFT_FLEET)
        return joined, unreachable

    def pin(self, generation: Generation) -> None:
        """Every server of the fleet, and each that joins, speaks ``generation``."""
        self.generation = generation
        for slot in self.slots:
            slot.dispatcher.generation = generation

    async def aclose(self) -> None:
        """Close every server's dispatcher."""
        await asyncio.gather(*(slot.dispatcher.aclose() for slot in self.slots))

    @property
    def capacity(self) -> int:
        """The advertised capacity of the live servers together."""
        return sum(slot.capacity for slot in self.slots if slot.alive)

    def live(self) -> list[ServerSlot]:
        return [slot for slot in self.slots if slot.alive]

    def mark_dead(self, name: str, why: str) -> None:
        """Take server ``name`` out: its in-flight attempts are cancelled and come back as
        lost in transit (nothing committed) for the caller to run again elsewhere."""
        for slot in self.slots:
            if slot.name == name and slot.alive:
                slot.alive, slot.death = False, why
                for attempt in slot.attempts:
                    attempt.cancel()
                if self.on_dead is not None:
                    self.on_dead(slot)

    def _choose(self) -> ServerSlot | None:
        live = self.live()
        if not live:
            return None
        return min(live, key=lambda s: ((s.in_flight + 1) / max(s.capacity, 1), s.dispatched))

    async def run(
        self, request: DispatchRequest, *, commit: CommitHook | None = None
    ) -> DispatchOutcome:
        """Run one attempt on the least loaded live server."""
        slot = self._choose()
        if slot is None:
            deaths = "; ".join(f"{s.name}: {s.death}" for s in self.slots)
            return DispatchOutcome(
                rollout_id=request.rollout_id or "",
                generation=None,
                kind="transport_error",
                admitted=False,
                detail=f"every rollout server of the fleet died ({deaths})",
            )
        committed: list[DispatchOutcome] = []

        async def record(outcome: DispatchOutcome) -> None:
            if commit is not None:
                await commit(outcome)
            committed.append(outcome)

        attempt = asyncio.ensure_future(slot.dispatcher.run(request, commit=record))
        slot.attempts.add(attempt)
        slot.in_flight += 1
        slot.dispatched += 1
        try:
            try:
                await asyncio.wait({attempt})
            except asyncio.CancelledError:  # the caller's cancel: the attempt's own rules
                attempt.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await attempt
                raise
        finally:
            slot.attempts.discard(attempt)
            slot.in_flight -= 1
        if attempt.cancelled():  # its server was marked dead
            return committed[-1] if committed else self._lost(slot, request)
        outcome = attempt.result()
        if outcome.kind == "transport_error" and not committed and await self._died(slot):
            return self._lost(slot, request, outcome)
        return outcome

    async def _died(self, slot: ServerSlot) -> bool:
        """Whether the server no longer answers (then it is marked dead)."""
        if not slot.alive:
            return True
        try:
            async with asyncio.timeout(_HEALTH_PROBE_SEC):
                await slot.dispatcher.health()
        except (httpx.HTTPError, RolloutProtocolError, TimeoutError, ValueError) as exc:
            self.mark_dead(slot.name, f"it stopped answering /health ({type(exc).__name__})")
            return True
        return False

    def _lost(
        self, slot: ServerSlot, request: DispatchRequest, outcome: DispatchOutcome | None = None
    ) -> DispatchOutcome:
        why = (slot.death.splitlines() or ["gone"])[0]
        detail = (
            f"rollout server {slot.name} died mid-rollout ({why}); "
            "the item runs again on another server under a fresh id"
        )
        if outcome is not None:
            return replace(outcome, lost_in_transit=True, detail=detail)
        return DispatchOutcome(
            rollout_id=request.rollout_id or "",
            generation=slot.dispatcher.generation,
            kind="transport_error",
            admitted=True,
            detail=detail,
            lost_in_transit=True,
        )
