"""The local two-node cluster: both nodes live on loopback, work lands on each, traffic stays
on loopback, and stopping it ends only its own processes."""

from __future__ import annotations

import ipaddress

import psutil
import pytest

from osmosis_ai.distributed.cluster import LOOPBACK_NODES, LocalCluster, connect
from osmosis_ai.errors import UsageError

pytestmark = pytest.mark.ray


def cluster_processes(cluster: LocalCluster) -> list[psutil.Process]:
    found: list[psutil.Process] = []
    for pid in cluster.pids:
        node = psutil.Process(pid)
        found += [node, *node.children(recursive=True)]
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.partition("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.2, as dual-stack sockets show IPv4 peers
    return ip.is_loopback


def off_loopback(processes: list[psutil.Process]) -> list[str]:
    """Connections of these processes whose far end is not a loopback address."""
    bad: list[str] = []
    for proc in processes:
        try:
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        for conn in conns:
            if conn.raddr and not is_loopback(conn.raddr.ip):
                bad.append(f"{proc.name()} {conn.laddr} -> {conn.raddr}")
    return bad


def test_two_nodes_on_loopback_take_work_and_talk_only_over_loopback(ray_cluster):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = ray_cluster.connection.nodes()
    assert sorted(n["NodeManagerAddress"] for n in nodes) == sorted(LOOPBACK_NODES)

    @ray.remote(num_cpus=1)
    def where() -> str:
        return str(ray.util.get_node_ip_address())

    placed = ray.get(
        [
            where.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote()
            for n in nodes
        ]
    )
    assert sorted(placed) == sorted(LOOPBACK_NODES)
    assert off_loopback([psutil.Process(), *cluster_processes(ray_cluster.cluster)]) == []


def test_a_second_connect_shares_the_drivers_connection(ray_cluster):
    again = connect(ray_cluster.address)
    assert not again.joined
    again.close()  # leaves the session's connection alone
    import ray

    assert ray.is_initialized()
    with pytest.raises(UsageError, match="already connected"):
        connect("10.9.8.7:6379")


def test_bad_addresses_are_named():
    with pytest.raises(UsageError, match="not HOST:PORT"):
        connect("head-node")
