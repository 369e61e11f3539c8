"""``osmosis eval upload RUN_DIR``: import a completed local eval run into the platform.

Sends the run's index and its selected trajectories and artifacts (never its manifest,
journal, logs or secrets); the platform recomputes the metrics and lists the run as a
finished eval run. An interrupted upload resumes: asking again sends only what is missing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from osmosis_ai.cli.eval_platform import upload_result_resource
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.platform.client.eval_runs import upload_local_run


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dir", metavar="RUN_DIR", help="a local run dir, e.g. .osmosis/evals/<name>"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    run_dir = Path(args.run_dir).expanduser().resolve()
    with open_session(ctx) as session:
        uploaded = upload_local_run(session.client, run_dir)
        plan, answer = uploaded.plan, uploaded.answer
        resource = {**upload_result_resource(answer, plan), **session.result_context()}
    return OperationResult(
        operation="eval.upload",
        status="success",
        resource=resource,
        message=f"Uploaded {plan.run_dir.name} as eval run {answer.get('eval_run_name')}.",
        next_steps=[f"osmosis eval info {answer.get('eval_run_name')}"],
    )
