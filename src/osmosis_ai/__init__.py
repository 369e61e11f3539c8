"""osmosis-ai: build, evaluate and train LLM agents with reinforcement learning.

The rollout API lives in :mod:`osmosis_ai.rollout`; it is deliberately not re-exported here
so that ``import osmosis_ai`` stays cheap.
"""

from osmosis_ai.consts import PACKAGE_VERSION as __version__

__all__ = ["__version__"]
