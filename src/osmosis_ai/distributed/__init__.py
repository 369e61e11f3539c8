"""Running past one machine on Ray (extra ``distributed``).

:mod:`.cluster` connects to a Ray cluster (``auto``, an address, or a local one it starts)
and starts a local multi-node cluster on loopback for tests and development; :mod:`.fleet`
runs rollout servers as Ray actors spread over the nodes. Ray is
imported only when a function that needs it runs, so importing this package costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_ai.lazy import lazy_exports as _lazy_exports

_EXPORTS: dict[str, str] = {
    "LOCAL": "osmosis_ai.distributed.cluster",
    "LOOPBACK_NODES": "osmosis_ai.distributed.cluster",
    "ClusterError": "osmosis_ai.distributed.cluster",
    "LocalCluster": "osmosis_ai.distributed.cluster",
    "RayConnection": "osmosis_ai.distributed.cluster",
    "connect": "osmosis_ai.distributed.cluster",
    "require_ray": "osmosis_ai.distributed.cluster",
    "FleetSpec": "osmosis_ai.distributed.fleet",
    "RolloutFleet": "osmosis_ai.distributed.fleet",
    "ServerInfo": "osmosis_ai.distributed.fleet",
    "ServerState": "osmosis_ai.distributed.fleet",
}

if TYPE_CHECKING:
    from osmosis_ai.distributed.cluster import LOCAL as LOCAL
    from osmosis_ai.distributed.cluster import LOOPBACK_NODES as LOOPBACK_NODES
    from osmosis_ai.distributed.cluster import ClusterError as ClusterError
    from osmosis_ai.distributed.cluster import LocalCluster as LocalCluster
    from osmosis_ai.distributed.cluster import RayConnection as RayConnection
    from osmosis_ai.distributed.cluster import connect as connect
    from osmosis_ai.distributed.cluster import require_ray as require_ray
    from osmosis_ai.distributed.fleet import FleetSpec as FleetSpec
    from osmosis_ai.distributed.fleet import RolloutFleet as RolloutFleet
    from osmosis_ai.distributed.fleet import ServerInfo as ServerInfo
    from osmosis_ai.distributed.fleet import ServerState as ServerState

__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)

__all__ = [  # = sorted(_EXPORTS)
    "LOCAL",
    "LOOPBACK_NODES",
    "ClusterError",
    "FleetSpec",
    "LocalCluster",
    "RayConnection",
    "RolloutFleet",
    "ServerInfo",
    "ServerState",
    "connect",
    "require_ray",
]
