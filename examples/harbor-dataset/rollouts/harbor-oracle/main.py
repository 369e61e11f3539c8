"""harbor-oracle: every row runs one task of ../../tasks with Harbor's ``oracle`` agent.

The oracle runs the task's reference ``solution/solve.sh`` and calls no model, so an eval of
this rollout checks the tasks and their verifiers: every row should score 1.0. Rows pick
their task with ``metadata.harbor_task_id`` (dataset mode). Trials run in Harbor's
``docker`` environment where a Docker engine answers, else in the local bubblewrap sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path

from harbor.trial.queue import TrialQueue

from osmosis_ai.rollout.backend.harbor import HarborBackend
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

TASKS_DIR = Path(
    os.environ.get("HARBOR_TASKS_DIR") or Path(__file__).resolve().parents[2] / "tasks"
)


def main() -> None:
    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=3),
        tasks_dir=TASKS_DIR,
        agent="oracle",
        task_mode="dataset",
    )
    run_rollout_server(create_rollout_server(backend=backend))


if __name__ == "__main__":
    main()
