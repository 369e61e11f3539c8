"""Trial overhead of the local Harbor sandbox: start + stop with no agent work.

Measures, over N sequential trials of a minimal task (``FROM ubuntu`` + ``WORKDIR /app``):

* ``sandbox``: :class:`LocalSandboxEnvironment` start + one ``true`` exec + stop (ms p50/p95),
  for the ``public`` and ``no-network`` (with one forwarded endpoint) policies;
* ``docker``: Harbor's own ``docker`` environment on the same task, in the same run, where
  a Docker engine answers and Compose V2 is installed (else it says which is missing);
* ``concurrent``: 8 sandboxes started, used and stopped at once, K rounds; errors counted;
* ``phase switch``: one sandbox started ``public`` with a restricted phase announced (as
  Harbor does for ``[agent] network_mode``), switched to ``no-network`` (with a forwarded
  endpoint) or ``allowlist`` (a host name: forwarding and ``/etc/hosts`` change) and back,
  each switch timed alone (ms p50/p95), and the trial with both switches and an exec in
  each phase.

With ``--baseline-src DIR`` (the ``src`` folder of another checkout, e.g. from ``git archive
REV src``), that checkout's sandbox runs in the same process, its trials interleaved with
this one's (alternating which goes first), and each series prints both p50s and their ratio:
a before/after comparison under the same machine load.

Targets: sandbox p50 <= 150 ms; a phase switch p50 <= 50 ms. Needs Python >= 3.12 with the
harbor extra, Linux, root and bubblewrap:
``.venv-harbor/bin/python bench/harbor_sandbox.py [--trials 30]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

TARGET_P50_MS = 150.0
TARGET_SWITCH_MS = 50.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def write_task(root: Path) -> Path:
    task = root / "bench-task"
    (task / "environment").mkdir(parents=True)
    (task / "tests").mkdir()
    (task / "task.toml").write_text(
        'version = "1.0"\n\n[agent]\ntimeout_sec = 60.0\n\n[verifier]\ntimeout_sec = 60.0\n'
    )
    (task / "instruction.md").write_text("Nothing to do.\n")
    (task / "environment" / "Dockerfile").write_text("FROM ubuntu:24.04\nWORKDIR /app\n")
    test_sh = task / "tests" / "test.sh"
    test_sh.write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    test_sh.chmod(0o755)
    return task


BASELINE_MODULE = "osmosis_baseline_sandbox"


def load_baseline(src: Path) -> str:
    """Import another checkout's sandbox module; returns its Harbor import path."""
    import importlib.util

    path = src / "osmosis_ai" / "rollout" / "backend" / "harbor" / "sandbox.py"
    if not path.is_file():
        raise SystemExit(f"--baseline-src {src}: no {path} (give a checkout's src folder)")
    spec = importlib.util.spec_from_file_location(BASELINE_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[BASELINE_MODULE] = module
    spec.loader.exec_module(module)
    return f"{BASELINE_MODULE}:LocalSandboxEnvironment"


def make_env(
    kind: str, task_dir: Path, work: Path, import_path: str | None = None, **kwargs: Any
) -> Any:
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.environment_type import EnvironmentType
    from harbor.models.task.task import Task
    from harbor.models.trial.config import EnvironmentConfig
    from harbor.models.trial.paths import TrialPaths

    from osmosis_ai.rollout.backend.harbor.sandbox import SANDBOX_IMPORT_PATH

    task = Task(task_dir)
    policy = kwargs.pop("network_policy", None)
    phases = kwargs.pop("phase_network_policies", None)
    name = uuid.uuid4().hex[:8]
    paths = TrialPaths(work / "trials" / name)
    paths.mkdir()
    if kind == "docker":
        config = EnvironmentConfig(type=EnvironmentType.DOCKER)
    else:
        config = EnvironmentConfig(import_path=import_path or SANDBOX_IMPORT_PATH, kwargs=kwargs)
    return EnvironmentFactory.create_environment_from_config(
        config,
        environment_dir=task.paths.environment_dir,
        environment_name="bench-task",
        session_id=f"bench-{name}__env",
        trial_paths=paths,
        task_env_config=task.config.environment,
        **({"network_policy": policy} if policy is not None else {}),
        **({"phase_network_policies": phases} if phases is not None else {}),
    )


async def one_trial(
    kind: str, task_dir: Path, work: Path, import_path: str | None = None, **kwargs: Any
) -> float:
    env = make_env(kind, task_dir, work, import_path, **kwargs)
    started = time.perf_counter()
    await env.start(force_build=False)
    try:
        result = await env.exec("true")
        if result.return_code != 0:
            raise RuntimeError(f"exec failed in {kind}: {result}")
    finally:
        await env.stop(delete=True)
    return (time.perf_counter() - started) * 1000


async def series(label: str, kind: str, n: int, task_dir: Path, work: Path, **kwargs: Any) -> None:
    await one_trial(kind, task_dir, work, **dict(kwargs))  # warm-up, not counted
    times = [await one_trial(kind, task_dir, work, **dict(kwargs)) for _ in range(n)]
    p50, p95 = statistics.median(times), percentile(times, 0.95)
    print(f"{label:<28} n={n:<4} p50={p50:7.1f} ms  p95={p95:7.1f} ms  max={max(times):7.1f} ms")
    if kind == "sandbox" and label.startswith("sandbox public"):
        verdict = "met" if p50 <= TARGET_P50_MS else "MISSED"
        print(f"{'':<28} target p50 <= {TARGET_P50_MS:.0f} ms: {verdict}")


async def compared(
    label: str, baseline: str, n: int, task_dir: Path, work: Path, **kwargs: Any
) -> None:
    """The baseline checkout's sandbox and this one, trial for trial, alternating order."""
    for path in (baseline, None):  # warm-up, not counted
        await one_trial("sandbox", task_dir, work, path, **dict(kwargs))
    times: dict[str | None, list[float]] = {baseline: [], None: []}
    for i in range(n):
        for path in (baseline, None) if i % 2 == 0 else (None, baseline):
            times[path].append(await one_trial("sandbox", task_dir, work, path, **dict(kwargs)))
    before, after = statistics.median(times[baseline]), statistics.median(times[None])
    for name, values in (("baseline", times[baseline]), ("this checkout", times[None])):
        p50, p95 = statistics.median(values), percentile(values, 0.95)
        print(f"{label + ' ' + name:<40} n={n:<4} p50={p50:7.1f} ms  p95={p95:7.1f} ms")
    print(f"{label + ' this/baseline p50':<40} {after / before:.2f}x")
    if label.startswith("sandbox public"):
        verdict = "met" if after <= TARGET_P50_MS else "MISSED"
        print(f"{'':<40} target p50 <= {TARGET_P50_MS:.0f} ms: {verdict}")


async def concurrent(rounds: int, width: int, task_dir: Path, work: Path) -> None:
    errors = 0
    times: list[float] = []
    for _ in range(rounds):
        started = time.perf_counter()
        results = await asyncio.gather(
            *(one_trial("sandbox", task_dir, work) for _ in range(width)), return_exceptions=True
        )
        times.append((time.perf_counter() - started) * 1000)
        for result in results:
            if isinstance(result, BaseException):
                errors += 1
                print(f"  error: {type(result).__name__}: {result}")
    mounts = await asyncio.to_thread(leftover_mounts)
    print(
        f"{'sandbox x' + str(width) + ' concurrent':<28} rounds={rounds} errors={errors} "
        f"wall p50={statistics.median(times):7.1f} ms per round of {width}; "
        f"leftover mounts={mounts}"
    )


async def phase_switches(label: str, n: int, task_dir: Path, work: Path, phase: Any) -> None:
    """Switch one public sandbox to ``phase`` and back ``n`` times, each switch timed; then
    ``n`` trials of start, exec, switch, exec, switch back, exec, stop."""
    from harbor.models.task.config import NetworkMode, NetworkPolicy

    public = NetworkPolicy(network_mode=NetworkMode.PUBLIC)
    kwargs: dict[str, Any] = {
        "network_policy": public,
        "phase_network_policies": [phase],
        "forward_endpoints": ["http://127.0.0.1:9/v1"],
    }
    env = make_env("sandbox", task_dir, work, **dict(kwargs))
    await env.start(force_build=False)
    took: dict[str, list[float]] = {"restrict": [], "widen": []}
    try:
        for i in range(n + 1):
            for name, policy in (("restrict", phase), ("widen", public)):
                started = time.perf_counter()
                await env.set_network_policy(policy)
                if i:  # the first round warms up, not counted
                    took[name].append((time.perf_counter() - started) * 1000)
    finally:
        await env.stop(delete=True)
    for name, values in took.items():
        p50, p95 = statistics.median(values), percentile(values, 0.95)
        verdict = "met" if p50 <= TARGET_SWITCH_MS else "MISSED"
        print(
            f"{label + ' ' + name:<40} n={n:<4} p50={p50:7.1f} ms  p95={p95:7.1f} ms  "
            f"(target p50 <= {TARGET_SWITCH_MS:.0f} ms: {verdict})"
        )
    trials: list[float] = []
    for _ in range(n):
        env = make_env("sandbox", task_dir, work, **dict(kwargs))
        started = time.perf_counter()
        await env.start(force_build=False)
        try:
            for policy in (phase, public, None):
                result = await env.exec("true")
                if result.return_code != 0:
                    raise RuntimeError(f"exec failed in a {label} sandbox: {result}")
                if policy is not None:
                    await env.set_network_policy(policy)
        finally:
            await env.stop(delete=True)
        trials.append((time.perf_counter() - started) * 1000)
    p50, p95 = statistics.median(trials), percentile(trials, 0.95)
    label = f"{label} trial (3 execs, 2 switches)"
    print(f"{label:<40} n={n:<4} p50={p50:7.1f} ms  p95={p95:7.1f} ms")


def docker_baseline_missing(engine_answers: bool) -> str | None:
    """Why Harbor's docker environment cannot run here, or None. Harbor drives it with
    ``docker compose`` (Compose V2). ``scripts/docker_tier.sh start DIR`` starts an engine
    where one can run; export the ``DOCKER_HOST`` it prints."""
    import subprocess

    if not engine_answers:
        return "no Docker engine answers `docker info` (scripts/docker_tier.sh start DIR)"
    compose = subprocess.run(
        ["docker", "compose", "version"], capture_output=True, text=True, check=False
    )
    if compose.returncode != 0:
        return "`docker compose` (Compose V2) is not installed; Debian 12 ships only 1.29"
    return None


def leftover_mounts() -> int:
    lines = Path("/proc/self/mountinfo").read_text().splitlines()
    return sum("osmosis-sandbox" in line for line in lines)


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30, help="sequential trials per series")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of concurrent sandboxes")
    parser.add_argument("--width", type=int, default=8, help="sandboxes per concurrent round")
    parser.add_argument(
        "--baseline-src",
        type=Path,
        help="another checkout's src folder: compare its sandbox with this one, interleaved",
    )
    args = parser.parse_args()

    if sys.version_info < (3, 12):
        print("harbor_sandbox: Harbor needs Python >= 3.12; run with .venv-harbor/bin/python")
        return 2
    from harbor.models.task.config import NetworkMode, NetworkPolicy

    from osmosis_ai.rollout.backend.harbor.sandbox import (
        docker_engine_answers,
        sandbox_missing_reason,
    )

    if reason := sandbox_missing_reason():
        print(f"harbor_sandbox: the sandbox cannot run here: {reason}")
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        task_dir = write_task(work)
        print(f"trial overhead (start + one exec + stop, no agent), {os.cpu_count()} CPUs")
        no_network: dict[str, Any] = {
            "network_policy": NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
            "forward_endpoints": ["http://127.0.0.1:9/v1"],
        }
        if args.baseline_src is not None:
            baseline = load_baseline(args.baseline_src.resolve())
            print(f"baseline: {args.baseline_src}")
            await compared("sandbox public", baseline, args.trials, task_dir, work)
            await compared(
                "sandbox no-network+forward", baseline, args.trials, task_dir, work, **no_network
            )
        else:
            await series("sandbox public", "sandbox", args.trials, task_dir, work)
            await series(
                "sandbox no-network+forward", "sandbox", args.trials, task_dir, work, **no_network
            )
        if (missing := docker_baseline_missing(docker_engine_answers())) is None:
            await series(
                "docker (Harbor's own)", "docker", max(3, args.trials // 5), task_dir, work
            )
        else:
            print(f"{'docker (Harbor own env)':<28} baseline unavailable: {missing}")
        await concurrent(args.rounds, args.width, task_dir, work)
        await phase_switches(
            "phase switch public<->no-network",
            args.trials,
            task_dir,
            work,
            NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
        )
        await phase_switches(
            "phase switch public<->allowlist",
            args.trials,
            task_dir,
            work,
            NetworkPolicy(network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["example.com"]),
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
