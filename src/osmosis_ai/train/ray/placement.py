"""What a run on Ray places, and whether its cluster can hold it, decided before anything is
placed: ``N`` trainer workers, ``R`` rollout servers and, on GPUs, the vLLM engine
(:class:`Ask`); the logical CPUs a cluster started here declares (:func:`local_cpus`); the
named error for an ask no arrangement of a cluster's nodes can hold (:func:`check_fits`).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

from osmosis_ai.distributed.fleet import SERVER_CPUS
from osmosis_ai.train.errors import PlacementError
from osmosis_ai.train.plan import RayPlacement, TrainPlan, check_split


def alive_nodes() -> list[dict[str, Any]]:
    import ray

    return [node for node in ray.nodes() if node.get("Alive")]


def resolve_workers(placement: RayPlacement, completions: int) -> int:
    """The trainer workers to place; ``0`` asks for one per alive node (the most, up to
    that, that share a step's completions equally)."""
    nodes = max(1, len(alive_nodes()))
    workers = placement.trainer_workers or _largest_divisor(completions, nodes)
    check_split(completions, workers)
    return workers


def _largest_divisor(completions: int, at_most: int) -> int:
    return next(n for n in range(at_most, 0, -1) if completions % n == 0)


def cluster_has_gpus() -> bool:
    import ray

    return float(ray.cluster_resources().get("GPU", 0)) > 0


@dataclass(frozen=True)
class Ask:
    """What a run places on the cluster: ``workers`` trainer workers of ``worker``
    resources each, ``servers`` rollout servers of ``server_cpus`` each, and on GPUs the
    vLLM engine (one CPU, one GPU)."""

    workers: int
    servers: int
    gpu: bool
    server_cpus: float
    worker: dict[str, float] = field(default_factory=dict[str, float])

    def items(self) -> list[tuple[str, dict[str, float]]]:
        """Each placed thing: its kind and its resources."""
        engine = [("vLLM engine", {"CPU": 1.0, "GPU": 1.0})] if self.gpu else []
        return [
            *[("trainer worker", self.worker)] * self.workers,
            *engine,
            *[("rollout server", {"CPU": self.server_cpus})] * self.servers,
        ]

    def describe(self) -> str:
        parts = [
            f"{self.workers} trainer worker(s) × {amounts(self.worker)}",
            f"{self.servers} rollout server(s) × {amounts({'CPU': self.server_cpus})}",
        ]
        if self.gpu:
            parts.append("a vLLM engine × 1 CPU, 1 GPU")
        total = {"CPU": 0.0, "GPU": 0.0}
        for _, need in self.items():
            for key in total:
                total[key] += need.get(key, 0.0)
        return f"{' and '.join(parts)} ({amounts(total, always=True)} in all)"


def amounts(resources: dict[str, float], *, always: bool = False) -> str:
    shown = [
        f"{resources.get(key, 0.0):g} {key}"
        for key in ("CPU", "GPU")
        if always or resources.get(key, 0.0)
    ]
    return ", ".join(shown) or "nothing"


def local_cpus(placement: RayPlacement) -> int:
    """The logical CPUs a cluster started here declares: this machine's, or what the asked
    topology needs when that is more (a one-node cluster: ``0`` means one of each)."""
    workers = placement.trainer_workers or 1
    servers = placement.rollout_servers or 1
    need = workers * worker_resources(False)["CPU"] + servers * SERVER_CPUS
    return max(os.cpu_count() or 1, math.ceil(need))


def check_fits(ask: Ask, address: str, nodes: list[dict[str, Any]]) -> None:
    """Raise :class:`PlacementError` when no arrangement of ``nodes`` (Ray's records of the
    cluster's live nodes) holds ``ask``: each item goes, largest first, to the node with the
    most room left that fits it (the nodes' whole resources: what other work holds now only
    delays the start)."""
    sizes = [
        {key: float(node.get("Resources", {}).get(key, 0.0)) for key in ("CPU", "GPU")}
        for node in nodes
    ]
    room = [dict(size) for size in sizes]
    items = sorted(ask.items(), key=lambda i: (i[1].get("GPU", 0.0), i[1].get("CPU", 0.0)))
    misfit = ""
    for kind, need in reversed(items):
        fitting = [r for r in room if all(r[k] + 1e-9 >= v for k, v in need.items())]
        if not fitting:
            misfit = f"a {kind}, {amounts(need)}"
            break
        best = max(fitting, key=lambda r: (r["CPU"], r["GPU"]))
        for key, value in need.items():
            best[key] -= value
    if not misfit:
        return
    totals = {key: sum(size[key] for size in sizes) for key in ("CPU", "GPU")}
    largest = max(sizes, key=lambda r: (r["CPU"], r["GPU"]), default={"CPU": 0.0, "GPU": 0.0})
    raise PlacementError(
        f"this run asks the Ray cluster at {address} for {ask.describe()}, and the cluster "
        f"cannot hold it (no node has room left for {misfit}): it has "
        f"{len(sizes)} node(s) with {amounts(totals, always=True)} in all (the largest "
        f"{amounts(largest, always=True)}). Ask for fewer trainer workers (--trainer-workers) "
        "or rollout servers (--rollout-servers), or add nodes to the cluster"
    )


def ask_for(plan: TrainPlan, placement: RayPlacement) -> Ask:
    """What ``plan`` asks of the cluster the driver joined."""
    gpu = cluster_has_gpus() and (plan.options.device or "cuda").startswith("cuda")
    return Ask(
        workers=resolve_workers(placement, plan.batch * plan.group),
        servers=placement.rollout_servers or len(alive_nodes()),
        gpu=gpu,
        server_cpus=SERVER_CPUS,
        worker=worker_resources(gpu),
    )


def worker_resources(gpu: bool) -> dict[str, float]:
    return {"CPU": 1.0, **({"GPU": 1.0} if gpu else {})}
