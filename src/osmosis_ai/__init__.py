"""osmosis-ai: build, evaluate and train LLM agents with reinforcement learning.

The rollout API lives in :mod:`osmosis_ai.rollout`; it is deliberately not re-exported here
so that ``import osmosis_ai`` stays cheap. The rubric names below load on first access.
"""

from __future__ import annotations

from osmosis_ai.consts import PACKAGE_VERSION as __version__
from osmosis_ai.lazy import lazy_exports as _lazy_exports

# Not typing.TYPE_CHECKING: importing typing would slow down `osmosis --help`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from osmosis_ai.eval.judge import MissingAPIKeyError, ModelNotFoundError, ProviderRequestError
    from osmosis_ai.eval.rubric import RubricResult, evaluate_rubric

# Resolved on first access (PEP 562): ``import osmosis_ai`` must not import httpx.
_LAZY: dict[str, str] = {
    "MissingAPIKeyError": "osmosis_ai.eval.judge",
    "ModelNotFoundError": "osmosis_ai.eval.judge",
    "ProviderRequestError": "osmosis_ai.eval.judge",
    "RubricResult": "osmosis_ai.eval.rubric",
    "evaluate_rubric": "osmosis_ai.eval.rubric",
}

__all__ = [
    "MissingAPIKeyError",
    "ModelNotFoundError",
    "ProviderRequestError",
    "RubricResult",
    "__version__",
    "evaluate_rubric",
]


__getattr__, __dir__ = _lazy_exports(__name__, _LAZY)
