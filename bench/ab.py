"""Run one benchmark script against two checkouts, alternated, and keep every output.

A change that should not move a figure (a refactor) is judged by running the same bench on
the tree before it and the tree after it back to back, in rounds whose order alternates
(A B, B A, A B, ...), so a slow spell of a shared machine falls on both sides alike.

    python bench/ab.py --before /path/to/old/checkout --rounds 2 -- cli_startup.py --runs 10

Each side runs its own copy of the script (``<checkout>/bench/<script>``) with its own
``src`` first on ``PYTHONPATH`` and the interpreter running this file. The outputs are
written to ``--out`` (one file per run) and every run's wall time is printed; the figures
themselves are the bench's own (read them side by side in the files, or pass the bench's
``--json`` flag where it has one and compare the objects).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run_side(checkout: Path, script: str, args: list[str], out: Path) -> float:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout / "src"), str(checkout)])}
    command = [sys.executable, str(checkout / "bench" / script), *args]
    start = time.perf_counter()
    with out.open("w") as sink:
        done = subprocess.run(
            command, check=False, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=checkout
        )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        print(f"  {out.name}: exit {done.returncode} (see the file)", file=sys.stderr)
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(
        description="Run one benchmark script against two checkouts, alternated."
    )
    parser.add_argument("--before", type=Path, required=True, help="the checkout to compare with")
    parser.add_argument("--after", type=Path, default=HERE, help="default: this checkout")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("ab-out"))
    parser.add_argument("script", help="a file name under bench/")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the bench's own flags, after --")
    opts = parser.parse_args()
    args = opts.args[1:] if opts.args[:1] == ["--"] else opts.args
    for side in (opts.before, opts.after):
        if not (side / "bench" / opts.script).is_file():
            parser.error(f"{side}/bench/{opts.script} does not exist: name a script under bench/")
    opts.out.mkdir(parents=True, exist_ok=True)
    walls: dict[str, list[float]] = {"before": [], "after": []}
    stem = Path(opts.script).stem
    for round_ in range(opts.rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        for name in order:
            checkout = opts.before if name == "before" else opts.after
            out = opts.out / f"{stem}-{name}-{round_ + 1}.txt"
            wall = run_side(checkout, opts.script, args, out)
            walls[name].append(wall)
            print(f"round {round_ + 1} {name:6s} {wall:8.1f} s  {out}")
    before, after = statistics.median(walls["before"]), statistics.median(walls["after"])
    print(
        f"median wall: before {before:.1f} s, after {after:.1f} s,"
        f" after/before {after / before:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
