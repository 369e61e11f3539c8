"""The controller side of the rollout protocol: proxy, upstreams, listener, dispatcher.

The proxy serves each rollout an OpenAI-compatible chat endpoint and records every call
(usage, token ids, logprobs); an upstream is the model behind it; the listener takes
callback-generation results; the dispatcher drives one rollout through either generation.

The names below load on first access (PEP 562), all at once, so that importing one
submodule (``controller.rollout_process``, which ``osmosis eval run`` needs before it can
start the rollout server) does not pay for httpx, the proxy and the dispatcher.
"""

from __future__ import annotations

import typing

from osmosis_ai.lazy import lazy_exports as _lazy_exports

_EXPORTS: dict[str, str] = {
    "CallRecord": "osmosis_ai.controller.calls",
    "CallbackListener": "osmosis_ai.controller.listener",
    "CallbackResult": "osmosis_ai.controller.listener",
    "CommitHook": "osmosis_ai.controller.dispatch",
    "CompletionHook": "osmosis_ai.controller.listener",
    "ControllerError": "osmosis_ai.controller.errors",
    "ControllerService": "osmosis_ai.controller.service",
    "ControllerServiceError": "osmosis_ai.controller.service",
    "DispatchOutcome": "osmosis_ai.controller.dispatch",
    "DispatchRequest": "osmosis_ai.controller.dispatch",
    "Dispatcher": "osmosis_ai.controller.dispatch",
    "LiteLLMUpstream": "osmosis_ai.controller.upstreams",
    "OpenAICompatibleUpstream": "osmosis_ai.controller.upstreams",
    "OutcomeKind": "osmosis_ai.controller.dispatch",
    "PolicyProxy": "osmosis_ai.controller.proxy",
    "Preflight": "osmosis_ai.controller.upstream",
    "TerminalHook": "osmosis_ai.controller.listener",
    "Upstream": "osmosis_ai.controller.upstream",
    "UpstreamAuthError": "osmosis_ai.controller.errors",
    "UpstreamConnectionError": "osmosis_ai.controller.errors",
    "UpstreamError": "osmosis_ai.controller.errors",
    "UpstreamNotFoundError": "osmosis_ai.controller.errors",
    "UpstreamRequestError": "osmosis_ai.controller.errors",
    "Usage": "osmosis_ai.controller.calls",
    "upstream_from_model_path": "osmosis_ai.controller.upstreams",
}

if typing.TYPE_CHECKING:
    from osmosis_ai.controller.calls import CallRecord as CallRecord
    from osmosis_ai.controller.calls import Usage as Usage
    from osmosis_ai.controller.dispatch import CommitHook as CommitHook
    from osmosis_ai.controller.dispatch import Dispatcher as Dispatcher
    from osmosis_ai.controller.dispatch import DispatchOutcome as DispatchOutcome
    from osmosis_ai.controller.dispatch import DispatchRequest as DispatchRequest
    from osmosis_ai.controller.dispatch import OutcomeKind as OutcomeKind
    from osmosis_ai.controller.errors import ControllerError as ControllerError
    from osmosis_ai.controller.errors import UpstreamAuthError as UpstreamAuthError
    from osmosis_ai.controller.errors import UpstreamConnectionError as UpstreamConnectionError
    from osmosis_ai.controller.errors import UpstreamError as UpstreamError
    from osmosis_ai.controller.errors import UpstreamNotFoundError as UpstreamNotFoundError
    from osmosis_ai.controller.errors import UpstreamRequestError as UpstreamRequestError
    from osmosis_ai.controller.listener import CallbackListener as CallbackListener
    from osmosis_ai.controller.listener import CallbackResult as CallbackResult
    from osmosis_ai.controller.listener import CompletionHook as CompletionHook
    from osmosis_ai.controller.listener import TerminalHook as TerminalHook
    from osmosis_ai.controller.proxy import PolicyProxy as PolicyProxy
    from osmosis_ai.controller.service import ControllerService as ControllerService
    from osmosis_ai.controller.service import ControllerServiceError as ControllerServiceError
    from osmosis_ai.controller.upstream import Preflight as Preflight
    from osmosis_ai.controller.upstream import Upstream as Upstream
    from osmosis_ai.controller.upstreams import LiteLLMUpstream as LiteLLMUpstream
    from osmosis_ai.controller.upstreams import OpenAICompatibleUpstream as OpenAICompatibleUpstream
    from osmosis_ai.controller.upstreams import upstream_from_model_path as upstream_from_model_path

__all__ = [  # = sorted(_EXPORTS)
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


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, together=True)
