"""``HarborBackend`` (extra ``harbor``): rollouts as Harbor trials in a sandbox or container.

Importing this package is cheap and works without Harbor; constructing a
:class:`HarborBackend` checks that Harbor (Python 3.12+) is installed and raises
:class:`HarborUnavailableError` naming the extra when it is not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_ai.lazy import lazy_exports

_EXPORTS = {
    "HarborBackend": "osmosis_ai.rollout.backend.harbor.backend",
    "HarborBackendV2": "osmosis_ai.rollout.backend.harbor.backend",
    "HarborUnavailableError": "osmosis_ai.rollout.backend.harbor.options",
    "TaskMode": "osmosis_ai.rollout.backend.harbor.options",
}

if TYPE_CHECKING:
    from osmosis_ai.rollout.backend.harbor.backend import HarborBackend as HarborBackend
    from osmosis_ai.rollout.backend.harbor.backend import HarborBackendV2 as HarborBackendV2
    from osmosis_ai.rollout.backend.harbor.options import (
        HarborUnavailableError as HarborUnavailableError,
    )
    from osmosis_ai.rollout.backend.harbor.options import TaskMode as TaskMode

__all__ = ["HarborBackend", "HarborBackendV2", "HarborUnavailableError", "TaskMode"]

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
