"""``osmosis rollout init NAME [--force]``: scaffold a rollout and its eval and training configs."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "name", metavar="NAME", help="the rollout's name: lowercase letters, digits and '-'"
    )
    parser.add_argument(
        "-f", "--force", action="store_true", help="overwrite files that differ from the scaffold"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.workspace.templates import FileConflictError, init_rollout

    try:
        scaffold = init_rollout(args.name, force=args.force)
    except FileConflictError as exc:
        details: dict[str, object] = {"root": str(exc.root), "conflicts": exc.paths}
        raise CLIError(CLIErrorCode.CONFLICT, str(exc), details) from exc
    name = scaffold.rollout
    evaluate = f"osmosis eval run {scaffold.eval_config} --rows 0-3"
    validate = f"osmosis dataset validate data/{name}.jsonl"
    written = len(scaffold.files_written)
    message = (
        f"Created rollout {name} in {scaffold.root}: {written} file(s) written."
        if written
        else f"Rollout {name} in {scaffold.root} already matches the scaffold; nothing written."
    )
    return OperationResult(
        operation="rollout.init",
        status="success",
        resource={
            "rollout": name,
            "workspace": str(scaffold.root),
            "files_written": list(scaffold.files_written),
            "files_unchanged": list(scaffold.files_unchanged),
        },
        message=message,
        next_steps=[
            f"Write MyAgentWorkflow.run and MyGrader.grade in rollouts/{name}/main.py",
            f"Add data/{name}.jsonl and check it: {validate}",
            f"Try it: {evaluate}",
        ],
        next_steps_structured=[
            {"action": "edit", "path": f"rollouts/{name}/main.py"},
            {"action": "dataset_validate", "command": validate},
            {"action": "eval_run", "command": evaluate, "config": scaffold.eval_config},
        ],
    )
