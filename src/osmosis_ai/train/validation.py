"""Validation beside asynchronous training: with ``max_staleness >= 1`` a validation's
rollouts run while the trainer goes on, answered by a copy of the policy pinned at the
version validated (the served one moves on with every optimizer step). Each is collected
at a later step's end once its rollouts are done, and waited for (or abandoned) when the
run ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from osmosis_ai.train.bridge import RolloutBatch, RolloutBridge
from osmosis_ai.train.collect import RolloutCollector, eval_summary
from osmosis_ai.train.events import EvalSummary

if TYPE_CHECKING:
    from osmosis_ai.controller.policy import LocalPolicy


@dataclass(frozen=True)
class _Running:
    step: int
    version: int
    batch: RolloutBatch


class PinnedValidations:
    """The validations running beside training, oldest first; each holds its pinned policy
    in the bridge's upstream until it is collected or abandoned."""

    def __init__(self, bridge: RolloutBridge, collector: RolloutCollector) -> None:
        self.bridge = bridge
        self.collector = collector
        self._running: list[_Running] = []

    @property
    def pending(self) -> int:
        return len(self._running)

    def launch(self, step: int, policy: LocalPolicy, indices: Sequence[int], samples: int) -> None:
        """Start validating ``step`` on ``policy`` (a frozen copy at that step's version)
        without waiting for it."""
        fields = self.bridge.upstream.pin(policy)
        try:
            requests = self.collector.eval_requests(indices, samples, step, fields)
            batch = self.bridge.launch(requests)
        except BaseException:
            self.bridge.upstream.unpin(policy.version)
            raise
        self._running.append(_Running(step, policy.version, batch))

    def collect(self, *, wait: bool = False) -> list[EvalSummary]:
        """The validations whose rollouts are done, in launch order (``wait``: all of them,
        each wait ended by the bridge's stall deadline); their pinned policies are dropped."""
        summaries: list[EvalSummary] = []
        while self._running and (wait or self._running[0].batch.outcomes.done()):
            running = self._running.pop(0)
            try:
                outcomes = self.bridge.finish(running.batch)
            finally:
                self.bridge.upstream.unpin(running.version)
            summaries.append(eval_summary(running.step, outcomes, running.version))
        return summaries

    def abandon(self) -> int:
        """Cancel every validation still running (the run failed); returns how many."""
        running, self._running = self._running, []
        for item in running:
            self.bridge.abandon(item.batch)
            self.bridge.upstream.unpin(item.version)
        return len(running)
