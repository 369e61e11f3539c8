"""The controller side of the rollout protocol: proxy, upstreams, listener, dispatcher.

The proxy serves each rollout an OpenAI-compatible chat endpoint and records every call
(usage, token ids, logprobs); an upstream is the model behind it; the listener takes
callback-generation results; the dispatcher drives one rollout through either generation.
"""

from __future__ import annotations

from osmosis_ai.controller.calls import CallRecord, Usage
from osmosis_ai.controller.dispatch import (
    CommitHook,
    Dispatcher,
    DispatchOutcome,
    DispatchRequest,
    OutcomeKind,
)
from osmosis_ai.controller.errors import (
    ControllerError,
    UpstreamAuthError,
    UpstreamConnectionError,
    UpstreamError,
    UpstreamNotFoundError,
    UpstreamRequestError,
)
from osmosis_ai.controller.listener import (
    CallbackListener,
    CallbackResult,
    CompletionHook,
    TerminalHook,
)
from osmosis_ai.controller.litellm_upstream import LiteLLMUpstream
from osmosis_ai.controller.proxy import PolicyProxy
from osmosis_ai.controller.service import ControllerService, ControllerServiceError
from osmosis_ai.controller.upstream import (
    OpenAICompatibleUpstream,
    Preflight,
    Upstream,
    upstream_from_model_path,
)

__all__ = [
    "CallRecord",
    "CallbackListener",
    "CallbackResult",
    "CommitHook",
    "CompletionHook",
    "ControllerError",
    "ControllerService",
    "ControllerServiceError",
    "DispatchOutcome",
    "DispatchRequest",
    "Dispatcher",
    "LiteLLMUpstream",
    "OpenAICompatibleUpstream",
    "OutcomeKind",
    "PolicyProxy",
    "Preflight",
    "TerminalHook",
    "Upstream",
    "UpstreamAuthError",
    "UpstreamConnectionError",
    "UpstreamError",
    "UpstreamNotFoundError",
    "UpstreamRequestError",
    "Usage",
    "upstream_from_model_path",
]
