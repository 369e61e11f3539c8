"""A job for worker tests (the spec's ``job`` names ``worker_jobs:execute``): what it does is
chosen by the run's ``[env]`` ``JOB_MODE``, so one module drives every worker scenario.

* ``finish``: records a metric and ends the run ``finished``;
* ``wait``: starts a grandchild in a session of its own (as a rollout server is), writes
  ``<work_dir>/attempt-<n>.pids``, then waits for ``ctx.stop`` and ends ``stopped``; a
  resumed attempt ends ``finished`` at once;
* ``exit``: prints the run's secret and exits with code 7 without ending the run;
* ``raise``: raises an error that carries the run's secret;
* ``rollout``: starts the run's rollout server the way the eval and training jobs do, and
  ends ``finished`` once it is healthy (a broken entrypoint raises with its output);
* ``linger``: ends the run ``finished``, closes its output, then takes a second to exit (as
  an interpreter's teardown may, under load).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from osmosis_ai.platform.worker.job import JobContext


def execute(ctx: JobContext) -> None:
    mode = ctx.environ.get("JOB_MODE", "finish")
    reporter = ctx.reporter
    reporter.log(f"test job: {mode} (attempt {ctx.attempt}, resumed {ctx.resumed})")
    if mode == "finish":
        reporter.record_metrics(1, {"reward": 0.5})
        reporter.end("finished", message="test job finished")
    elif mode == "wait":
        if ctx.resumed:
            reporter.end("finished", message=f"resumed on attempt {ctx.attempt}")
            return
        sleeper = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
        )
        pids = {"job": os.getpid(), "group": os.getpgrp(), "grandchild": sleeper.pid}
        (ctx.work_dir / f"attempt-{ctx.attempt}.pids").write_text(json.dumps(pids))
        while not ctx.stop.wait(0.05):
            pass
        sleeper.terminate()
        sleeper.wait()
        reporter.end("stopped", message="test job stopped")
    elif mode == "exit":
        print(f"about to die holding {ctx.environ.get('API_KEY')}", file=sys.stderr, flush=True)
        os._exit(7)
    elif mode == "raise":
        raise RuntimeError(f"the job broke with {ctx.environ.get('API_KEY')}")
    elif mode == "linger":
        import time

        reporter.end("finished", message="test job finished; lingering")
        sys.stdout.flush()
        sys.stderr.flush()
        os.close(1)
        os.close(2)
        time.sleep(1.0)
        os._exit(0)
    elif mode == "rollout":
        from osmosis_ai.controller.rollout_process import RolloutServerProcess

        server = RolloutServerProcess(
            rollout_dir=ctx.rollout_dir,
            entrypoint=ctx.rollout_dir / ctx.run.entrypoint,
            artifact_root=ctx.work_dir / "artifacts",
            env=dict(ctx.environ),
            health_timeout_sec=60,
        )
        server.start()
        try:
            reporter.end("finished", message="rollout server was healthy")
        finally:
            server.stop()
    else:
        raise ValueError(f"unknown JOB_MODE {mode!r}")
