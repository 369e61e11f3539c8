"""Executing submitted runs: the worker process and what it runs for each run.

Layout::

    report.py    RunReporter: the fenced writes of one attempt (logs, eval samples, metric
                 points, checkpoints, progress, the end) and the object keys of run files
    job.py       JobContext: what an executing run is given (the run, its checkout, the
                 environment of its rollout process with secrets, its work dir, the reporter)
"""
