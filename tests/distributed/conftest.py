"""Fixtures of the Ray tier: a local two-node cluster (127.0.0.2 head, 127.0.0.3 worker), each
node its own ``ray start`` process, shared by the session; skips with a named reason when Ray
is missing or cannot start here."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from osmosis_ai.distributed.cluster import ClusterError, LocalCluster, RayConnection, connect


def ray_missing_reason() -> str | None:
    """Why the Ray tier cannot run here, or ``None``."""
    if importlib.util.find_spec("ray") is None:
        return "Ray is not installed: pip install 'osmosis-ai[distributed]' (make test-ray)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = ray_missing_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@dataclass
class RayCluster:
    """The session's local cluster and this process's driver connection to it."""

    cluster: LocalCluster
    connection: RayConnection

    @property
    def address(self) -> str:
        return self.cluster.address


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A local two-node Ray cluster, this test process connected to it as a driver."""
    if reason := ray_missing_reason():
        pytest.skip(reason)
    cluster = LocalCluster()
    try:
        cluster.start()
        connection = connect(cluster.address, auth_token=cluster.auth_token)
    except ClusterError as exc:
        cluster.stop()
        pytest.skip(f"Ray cannot start a local cluster here: {exc}")
    try:
        connection.wait_for_nodes(len(cluster.nodes), timeout_sec=90.0)
        yield RayCluster(cluster, connection)
    finally:
        connection.close()
        cluster.stop()
