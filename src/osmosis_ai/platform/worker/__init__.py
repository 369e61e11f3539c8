"""Executing submitted runs: the worker process and what it runs for each run.

Layout::

    report.py    RunReporter: the fenced writes of one attempt (logs, eval samples, metric
                 points, checkpoints, progress, the end) and the object keys of run files
    job.py       JobContext: what an executing run is given (the run, its checkout, the
                 environment of its rollout process with secrets, its work dir, the reporter)
    runner.py    Worker (``osmosis platform worker``): registers, wakes on a UDP datagram or
                 a PostgreSQL NOTIFY (else polls), claims runs into its slots, starts one
                 process per run, heartbeats the leases, ends stopped or lost runs'
                 processes, and releases its runs when it is stopped
    execute.py   the process of one attempt (``python -m ...worker.execute SPEC``): checkout,
                 secrets and ``[env]``, the JobContext, the job; dies with its worker
    checkout.py  the run's commit checked out from the workspace's bare mirror
    eval_job.py  a managed eval run: its config, dataset and rows, then ``run_eval`` with
                 every finished item stored as a sample (batched) and its logs redacted;
                 resume from the journal or the stored samples, retry of failed items
"""
