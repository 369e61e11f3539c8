"""Run a platform worker whose jobs are ``worker_jobs:execute`` (worker tests start it as a
real process):
``python worker_launch.py DATA_DIR DATABASE_URL POLL_S SLOTS LEASE_S HEARTBEAT_S``."""

from __future__ import annotations

import logging
import sys

from osmosis_ai.platform.settings import load_settings
from osmosis_ai.platform.worker.runner import Worker

if __name__ == "__main__":
    data_dir, database_url, poll_s, slots, lease_s, heartbeat_s = sys.argv[1:]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s worker %(message)s")
    # Not about isolation (its jobs are the tests' own): runs where bubblewrap is missing.
    settings = load_settings(data_dir=data_dir, database_url=database_url, single_tenant=True)
    job = "worker_jobs:execute"
    Worker(
        settings,
        slots=int(slots),
        poll_s=float(poll_s),
        lease_s=float(lease_s),
        heartbeat_s=float(heartbeat_s),
        jobs={"eval": job, "training": job},
    ).run()
