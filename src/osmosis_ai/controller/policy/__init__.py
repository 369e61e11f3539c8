"""The local policy: a Hugging Face checkpoint served in-process (``model_path =
"local:<dir>"``), as an :class:`~osmosis_ai.controller.upstream.Upstream` of the policy
proxy or as its own OpenAI-compatible app. Needs the ``train`` extra; names resolve on
first access, so the torch-free pieces import without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_ai.lazy import lazy_exports as _lazy_exports

_EXPORTS: dict[str, str] = {
    "LocalPolicy": "osmosis_ai.controller.policy.engine",
    "LocalPolicyUpstream": "osmosis_ai.controller.policy.upstream",
    "PolicyRequestError": "osmosis_ai.controller.policy.requests",
    "Sample": "osmosis_ai.controller.policy.responses",
    "SamplingParams": "osmosis_ai.controller.policy.requests",
    "create_policy_app": "osmosis_ai.controller.policy.app",
    "open_local_upstream": "osmosis_ai.controller.policy.upstream",
}

if TYPE_CHECKING:
    from osmosis_ai.controller.policy.app import create_policy_app as create_policy_app
    from osmosis_ai.controller.policy.engine import LocalPolicy as LocalPolicy
    from osmosis_ai.controller.policy.requests import PolicyRequestError as PolicyRequestError
    from osmosis_ai.controller.policy.requests import SamplingParams as SamplingParams
    from osmosis_ai.controller.policy.responses import Sample as Sample
    from osmosis_ai.controller.policy.upstream import LocalPolicyUpstream as LocalPolicyUpstream
    from osmosis_ai.controller.policy.upstream import open_local_upstream as open_local_upstream

__all__ = [
    "LocalPolicy",
    "LocalPolicyUpstream",
    "PolicyRequestError",
    "Sample",
    "SamplingParams",
    "create_policy_app",
    "open_local_upstream",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
