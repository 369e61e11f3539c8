"""``osmosis template apply NAME [--force]``: copy a bundled template into the workspace.

Outside a workspace the current directory becomes one (its scaffold is created first).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result

if TYPE_CHECKING:
    from osmosis_ai.workspace.templates import ConfigRef, TemplateApplication


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the template (see `osmosis template list`)")
    parser.add_argument(
        "-f", "--force", action="store_true", help="overwrite files that differ from the template"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.workspace.templates import (
        FileConflictError,
        TemplateNotFoundError,
        apply_template,
    )

    try:
        applied = apply_template(args.name, force=args.force)
    except TemplateNotFoundError as exc:
        details: dict[str, object] = {"name": exc.name, "available": exc.available}
        raise CLIError(CLIErrorCode.NOT_FOUND, str(exc), details) from exc
    except FileConflictError as exc:
        conflict: dict[str, object] = {"root": str(exc.root), "conflicts": exc.paths}
        raise CLIError(CLIErrorCode.CONFLICT, str(exc), conflict) from exc
    return _result(applied)


def _result(applied: TemplateApplication) -> OperationResult:
    info = applied.template
    steps: list[str] = []
    structured: list[dict[str, object]] = []
    for config in info.eval_configs:
        command = f"osmosis eval run {config.path}"
        steps.append(f"Evaluate: {command}{_model_hint(config)}")
        structured.append({"action": "eval_run", "command": command, "config": config.path})
    for config in info.training_configs:
        command = f"osmosis train run {config.path}"
        steps.append(f"Train: {command}")
        structured.append({"action": "train_run", "command": command, "config": config.path})
    steps.extend(info.notes)
    written, unchanged = len(applied.files_written), len(applied.files_unchanged)
    message = f"Applied template {info.name} to {applied.root}: {written} file(s) written"
    message += f", {unchanged} already up to date." if unchanged else "."
    return OperationResult(
        operation="template.apply",
        status="success",
        resource={
            "template": info.name,
            "workspace": str(applied.root),
            "files_written": list(applied.files_written),
            "files_unchanged": list(applied.files_unchanged),
            "scaffold_created": list(applied.scaffold_created),
            "skills_written": list(applied.skills_written),
        },
        message=message,
        next_steps=steps,
        next_steps_structured=structured,
    )


def _model_hint(config: ConfigRef) -> str:
    """How to give the eval config its model, from its ``model_path`` and secrets."""
    model = config.model_path or ""
    if model.startswith("openai/"):
        return (
            f" (calls {model}: export OPENAI_API_KEY; for any OpenAI-compatible server also "
            "export OPENAI_BASE_URL=<its /v1 URL> and set model_path = "
            '"openai/<served model>" in the config)'
        )
    if model.startswith("local:"):
        return f" (serves the local model directory {model.removeprefix('local:')})"
    if config.secrets:
        return f" (needs {', '.join(config.secrets)} in the environment)"
    return ""
