"""Whether a run on Ray fits its cluster, decided before anything is placed: the topology a
local cluster is sized for, and the named error for a request no arrangement of a cluster's
nodes can hold (what was asked, what the cluster has). Pure functions: no Ray needed."""

from __future__ import annotations

import os

import pytest

from osmosis_ai.distributed.fleet import SERVER_CPUS
from osmosis_ai.train.errors import PlacementError
from osmosis_ai.train.plan import RayPlacement
from osmosis_ai.train.ray.placement import Ask, check_fits, local_cpus


def node(cpus: float, gpus: float = 0.0) -> dict[str, object]:
    return {"Alive": True, "Resources": {"CPU": cpus, "GPU": gpus, "memory": 1e9}}


def ask(workers: int, servers: int, *, gpu: bool = False) -> Ask:
    worker = {"CPU": 1.0, "GPU": 1.0} if gpu else {"CPU": 1.0}
    return Ask(workers, servers, gpu, SERVER_CPUS, worker)


def test_the_demo_topology_fits_the_cluster_the_command_starts_on_two_cores():
    placement = RayPlacement("local", trainer_workers=2, rollout_servers=2, max_failures=0)
    cpus = local_cpus(placement)
    assert cpus >= max(os.cpu_count() or 1, 3)  # 2 trainers × 1 CPU + 2 servers × 0.25
    check_fits(ask(2, 2), "local", [node(cpus)])
    # the servers' hosts used to take a whole CPU each: on a 2-CPU node nothing was left
    with pytest.raises(PlacementError):
        check_fits(Ask(2, 2, False, 1.0, {"CPU": 1.0}), "local", [node(2)])


def test_an_infeasible_request_names_what_was_asked_and_what_the_cluster_has():
    nodes = [node(2), node(2)]
    check_fits(ask(3, 4), "10.0.0.1:6379", nodes)  # 3 + 1 CPU over two 2-CPU nodes
    with pytest.raises(PlacementError) as caught:
        check_fits(ask(4, 2), "10.0.0.1:6379", nodes)
    message = str(caught.value)
    assert "the Ray cluster at 10.0.0.1:6379" in message
    assert "4 trainer worker(s) × 1 CPU and 2 rollout server(s) × 0.25 CPU" in message
    assert "(4.5 CPU, 0 GPU in all)" in message
    assert "2 node(s) with 4 CPU, 0 GPU in all (the largest 2 CPU, 0 GPU)" in message
    assert "--trainer-workers" in message and "--rollout-servers" in message


def test_gpu_workers_and_the_vllm_engine_each_need_a_gpu():
    check_fits(ask(1, 1, gpu=True), "auto", [node(8, 2)])
    with pytest.raises(PlacementError, match="a vLLM engine × 1 CPU, 1 GPU") as caught:
        check_fits(ask(2, 1, gpu=True), "auto", [node(8, 1), node(8, 1)])
    assert "2 node(s) with 16 CPU, 2 GPU in all" in str(caught.value)
    # a whole node's CPUs are not enough when they are split over two nodes
    with pytest.raises(PlacementError, match="no node has room left for a trainer worker"):
        check_fits(ask(1, 0), "auto", [node(0.5), node(0.5)])
