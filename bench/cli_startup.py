"""Startup time of the ``osmosis`` console script beside a bare interpreter.

Median wall time of N subprocess runs each of ``python -c pass`` (the floor),
``osmosis --version`` and ``osmosis --help``. Budget: help <= 100 ms, version below it.

    python bench/cli_startup.py [--runs 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def osmosis_command() -> list[str]:
    """The installed console script beside this interpreter, else ``python -m``."""
    script = Path(sys.executable).with_name("osmosis")
    if script.exists():
        return [str(script)]
    found = shutil.which("osmosis")
    return [found] if found else [sys.executable, "-m", "osmosis_ai.cli.main"]


def median_ms(command: list[str], runs: int) -> float:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "0"}
    subprocess.run(command, capture_output=True, check=True, env=env)  # warm caches, .pyc
    times: list[float] = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True, env=env)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    osmosis = osmosis_command()
    results = {
        "python -c pass": median_ms([sys.executable, "-c", "pass"], args.runs),
        "osmosis --version": median_ms([*osmosis, "--version"], args.runs),
        "osmosis --help": median_ms([*osmosis, "--help"], args.runs),
    }
    if args.json:
        print(json.dumps({"runs": args.runs, "median_ms": results}))
        return
    baseline = results["python -c pass"]
    print(f"median of {args.runs} runs ({os.cpu_count()} CPUs)")
    for name, ms in results.items():
        extra = "" if name.startswith("python") else f"  ({ms - baseline:+.1f} ms vs python)"
        print(f"  {name:<20} {ms:7.1f} ms{extra}")


if __name__ == "__main__":
    main()
