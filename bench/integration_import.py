"""Import cost of each agent-framework integration beside the framework it wraps.

Median of N fresh interpreters (default 5), interleaved; budget: integration <= 1.2x framework.

    python bench/integration_import.py [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time
from typing import Any

# (framework, integration, held to the budget?). The framework-free client also imports
# httpx (its recording transport), which openai 3 no longer does: reported, not budgeted.
PAIRS = [
    ("agents", "osmosis_ai.rollout.integrations.agents.openai_agents", True),
    ("strands", "osmosis_ai.rollout.integrations.agents.strands", True),
    ("openai", "osmosis_ai.rollout.integrations.openai_client", False),
]
BUDGET = 1.2


def import_seconds(module: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", f"import {module}"], check=True, capture_output=True)
    return time.perf_counter() - start


def measure(framework: str, integration: str, runs: int) -> dict[str, float]:
    import_seconds(framework)  # warm the .pyc caches of both first
    import_seconds(integration)
    bare: list[float] = []
    wrapped: list[float] = []
    for _ in range(runs):
        bare.append(import_seconds(framework))
        wrapped.append(import_seconds(integration))
    framework_s, integration_s = statistics.median(bare), statistics.median(wrapped)
    return {
        "framework_s": round(framework_s, 3),
        "integration_s": round(integration_s, 3),
        "ratio": round(integration_s / framework_s, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    results: dict[str, dict[str, Any]] = {}
    for framework, integration, budgeted in PAIRS:
        if importlib.util.find_spec(framework) is None:
            print(f"skip {integration}: {framework} is not installed", file=sys.stderr)
            continue
        row = measure(framework, integration, args.runs)
        results[integration] = {"framework": framework, "budgeted": budgeted, **row}
    if args.json:
        print(json.dumps({"runs": args.runs, "budget_ratio": BUDGET, "results": results}))
        return
    for integration, row in results.items():
        if not row["budgeted"]:
            verdict = "informational"
        else:
            verdict = "ok" if row["ratio"] <= BUDGET else "OVER BUDGET"
        print(
            f"import {row['framework']:<8} {row['framework_s']:6.3f}s   "
            f"import {integration:<54} {row['integration_s']:6.3f}s   "
            f"ratio {row['ratio']:.2f} ({verdict})"
        )


if __name__ == "__main__":
    main()
