"""The public API rollout authors import: workflows, graders, contexts, samples, backends.

``osmosis_ai.rollout.server`` (extra ``server``) serves a backend over HTTP; the agent
framework integrations live under ``osmosis_ai.rollout.integrations``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_ai.lazy import lazy_exports as _lazy_exports

# Names resolve on first access (PEP 562) so that importing one piece does not pay for all.
_EXPORTS: dict[str, str] = {
    "AgentWorkflow": "osmosis_ai.rollout.agent_workflow",
    "AgentWorkflowConfig": "osmosis_ai.rollout.config",
    "AgentWorkflowContext": "osmosis_ai.rollout.context",
    "AgentWorkflowOutput": "osmosis_ai.rollout.output",
    "BaseConfig": "osmosis_ai.rollout.config",
    "ConcurrencyConfig": "osmosis_ai.rollout.config",
    "ExecutionBackend": "osmosis_ai.rollout.backend.base",
    "ExecutionOutcome": "osmosis_ai.rollout.execution",
    "ExecutionRequest": "osmosis_ai.rollout.execution",
    "ExecutionResult": "osmosis_ai.rollout.execution",
    "Grader": "osmosis_ai.rollout.grader",
    "GraderCompleteRequest": "osmosis_ai.rollout.protocol",
    "GraderConfig": "osmosis_ai.rollout.config",
    "GraderContext": "osmosis_ai.rollout.context",
    "GraderInitRequest": "osmosis_ai.rollout.protocol",
    "GraderInitResponse": "osmosis_ai.rollout.protocol",
    "GraderStatus": "osmosis_ai.rollout.status",
    "LocalBackend": "osmosis_ai.rollout.backend.local",
    "MessageDict": "osmosis_ai.rollout.sample",
    "RolloutCompleteRequest": "osmosis_ai.rollout.protocol",
    "RolloutContext": "osmosis_ai.rollout.context",
    "RolloutErrorCategory": "osmosis_ai.rollout.status",
    "RolloutInitRequest": "osmosis_ai.rollout.protocol",
    "RolloutInitResponse": "osmosis_ai.rollout.protocol",
    "RolloutResultResponse": "osmosis_ai.rollout.protocol",
    "RolloutSample": "osmosis_ai.rollout.sample",
    "RolloutStatus": "osmosis_ai.rollout.status",
    "SampleSource": "osmosis_ai.rollout.context",
    "get_rollout_context": "osmosis_ai.rollout.context",
}

if TYPE_CHECKING:
    from osmosis_ai.rollout.agent_workflow import AgentWorkflow as AgentWorkflow
    from osmosis_ai.rollout.backend.base import ExecutionBackend as ExecutionBackend
    from osmosis_ai.rollout.backend.local import LocalBackend as LocalBackend
    from osmosis_ai.rollout.config import AgentWorkflowConfig as AgentWorkflowConfig
    from osmosis_ai.rollout.config import BaseConfig as BaseConfig
    from osmosis_ai.rollout.config import ConcurrencyConfig as ConcurrencyConfig
    from osmosis_ai.rollout.config import GraderConfig as GraderConfig
    from osmosis_ai.rollout.context import AgentWorkflowContext as AgentWorkflowContext
    from osmosis_ai.rollout.context import GraderContext as GraderContext
    from osmosis_ai.rollout.context import RolloutContext as RolloutContext
    from osmosis_ai.rollout.context import SampleSource as SampleSource
    from osmosis_ai.rollout.context import get_rollout_context as get_rollout_context
    from osmosis_ai.rollout.execution import ExecutionOutcome as ExecutionOutcome
    from osmosis_ai.rollout.execution import ExecutionRequest as ExecutionRequest
    from osmosis_ai.rollout.execution import ExecutionResult as ExecutionResult
    from osmosis_ai.rollout.grader import Grader as Grader
    from osmosis_ai.rollout.output import AgentWorkflowOutput as AgentWorkflowOutput
    from osmosis_ai.rollout.protocol import GraderCompleteRequest as GraderCompleteRequest
    from osmosis_ai.rollout.protocol import GraderInitRequest as GraderInitRequest
    from osmosis_ai.rollout.protocol import GraderInitResponse as GraderInitResponse
    from osmosis_ai.rollout.protocol import RolloutCompleteRequest as RolloutCompleteRequest
    from osmosis_ai.rollout.protocol import RolloutInitRequest as RolloutInitRequest
    from osmosis_ai.rollout.protocol import RolloutInitResponse as RolloutInitResponse
    from osmosis_ai.rollout.protocol import RolloutResultResponse as RolloutResultResponse
    from osmosis_ai.rollout.sample import MessageDict as MessageDict
    from osmosis_ai.rollout.sample import RolloutSample as RolloutSample
    from osmosis_ai.rollout.status import GraderStatus as GraderStatus
    from osmosis_ai.rollout.status import RolloutErrorCategory as RolloutErrorCategory
    from osmosis_ai.rollout.status import RolloutStatus as RolloutStatus

__all__ = [
    "AgentWorkflow",
    "AgentWorkflowConfig",
    "AgentWorkflowContext",
    "AgentWorkflowOutput",
    "BaseConfig",
    "ConcurrencyConfig",
    "ExecutionBackend",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "Grader",
    "GraderCompleteRequest",
    "GraderConfig",
    "GraderContext",
    "GraderInitRequest",
    "GraderInitResponse",
    "GraderStatus",
    "LocalBackend",
    "MessageDict",
    "RolloutCompleteRequest",
    "RolloutContext",
    "RolloutErrorCategory",
    "RolloutInitRequest",
    "RolloutInitResponse",
    "RolloutResultResponse",
    "RolloutSample",
    "RolloutStatus",
    "SampleSource",
    "get_rollout_context",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
