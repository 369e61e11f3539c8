"""Every rollout type in one import path (``osmosis_ai.rollout.types``)."""

from osmosis_ai.rollout.config import (
    AgentWorkflowConfig,
    BaseConfig,
    ConcurrencyConfig,
    GraderConfig,
)
from osmosis_ai.rollout.execution import ExecutionOutcome, ExecutionRequest, ExecutionResult
from osmosis_ai.rollout.output import AgentWorkflowOutput
from osmosis_ai.rollout.protocol import (
    POLLING_LEASE_HEADER,
    ROLLOUT_PROTOCOL_VERSION,
    CancelRolloutsRequest,
    CancelRolloutsResponse,
    GraderCompleteRequest,
    GraderInitRequest,
    GraderInitResponse,
    RolloutCompleteRequest,
    RolloutInitRequest,
    RolloutInitResponse,
    RolloutLifecycle,
    RolloutResultResponse,
    RolloutStatusResponse,
)
from osmosis_ai.rollout.sample import MessageDict, Messages, RolloutSample
from osmosis_ai.rollout.status import GraderStatus, RolloutErrorCategory, RolloutStatus

__all__ = [
    "POLLING_LEASE_HEADER",
    "ROLLOUT_PROTOCOL_VERSION",
    "AgentWorkflowConfig",
    "AgentWorkflowOutput",
    "BaseConfig",
    "CancelRolloutsRequest",
    "CancelRolloutsResponse",
    "ConcurrencyConfig",
    "ExecutionOutcome",
    "ExecutionRequest",
    "ExecutionResult",
    "GraderCompleteRequest",
    "GraderConfig",
    "GraderInitRequest",
    "GraderInitResponse",
    "GraderStatus",
    "MessageDict",
    "Messages",
    "RolloutCompleteRequest",
    "RolloutErrorCategory",
    "RolloutInitRequest",
    "RolloutInitResponse",
    "RolloutLifecycle",
    "RolloutResultResponse",
    "RolloutSample",
    "RolloutStatus",
    "RolloutStatusResponse",
]
