"""The submit flow shared by ``osmosis eval submit`` and ``osmosis train submit`` (§4.6).

Workspace and login; the config, loaded and validated; the backend preflight; a pinned
commit's lookup; the summary; each required secret resolved (``--secrets-file``, then the
process environment, then a stored platform secret, then a hidden prompt); the notice of
what the platform will fetch; confirmation; the POST. Secret values sent for the run are
redacted from any error the platform answers with.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult
from osmosis_ai.cli.platform_session import Session, open_session
from osmosis_ai.cli.secret_values import prompt_hidden
from osmosis_ai.platform.client import SubmitResult
from osmosis_ai.platform.client.submit import (
    EVAL,
    TRAIN,
    SubmitKind,
    post_run,
    prepare_submit,
    stored_secret_scopes,
)
from osmosis_ai.workspace import EvalConfig, TrainingConfig

__all__ = ["EVAL", "TRAIN", "SubmitKind", "add_arguments", "rows_text", "submit"]


def add_arguments(parser: argparse.ArgumentParser, kind: SubmitKind) -> None:
    parser.add_argument(
        "config", metavar="CONFIG", type=Path, help=f"{kind.config_dir}/<name>.toml"
    )
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    parser.add_argument(
        "--secrets-file",
        metavar="PATH",
        help="dotenv file with values for [secrets].required ('-' reads stdin)",
    )


def submit(args: argparse.Namespace, ctx: Context, kind: SubmitKind) -> OperationResult:
    with open_session(ctx) as session:
        assert session.workspace is not None
        plan = prepare_submit(session.client, kind, args.config, session.workspace.root)
        config, rows = plan.config, plan.rows
        experiment = config.experiment
        summary: dict[str, object] = {
            "Repository": session.workspace.identity,
            "Rollout": experiment.rollout,
            "Entrypoint": experiment.entrypoint,
            "Model": experiment.model_path,
            "Dataset": experiment.dataset,
        }
        if experiment.branch:
            summary["Branch"] = experiment.branch
        if experiment.commit_sha:
            summary["Commit"] = experiment.commit_sha
        if rows is not None:
            summary["Rows"] = rows_text(rows)
        summary |= {f"env.{name}": value for name, value in sorted(config.env.items())}
        provided, scopes = _resolve_secrets(ctx, session, config, args.secrets_file)
        summary |= {f"secret.{name}": scope for name, scope in sorted(scopes.items())}
        if args.yes:  # no prompt will show them
            for code, message in plan.advisories:
                ctx.warn(code, message)
        confirm(
            f"Submit this {kind.label.lower()} run?",
            yes=args.yes,
            summary=summary,
            notes=plan.notes,
            warnings=[message for _, message in plan.advisories],
        )
        result = post_run(session.client, kind, config, provided)
        return _result(kind, session, config, result, rows)


def rows_text(rows: dict[str, object]) -> str:
    """``all 20 rows`` / ``the first 3 of 20 rows`` (``…rows`` when the count is unknown)."""
    limit, total = rows.get("limit"), rows.get("dataset_rows")
    if limit is None:
        return "all rows" if total is None else f"all {total} rows"
    if total is None:
        return f"the first {limit} rows"
    return f"the first {rows.get('rows')} of {total} rows"


# --- secrets --------------------------------------------------------------------------------


def _resolve_secrets(
    ctx: Context, session: Session, config: EvalConfig | TrainingConfig, secrets_file: str | None
) -> tuple[dict[str, str], dict[str, str]]:
    """``(values sent with the run, scope shown per name)``."""
    names = list(config.secrets)
    if not names:
        return {}, {}
    from osmosis_ai.cli.env import read_secrets_file

    from_file = read_secrets_file(secrets_file)
    stored = stored_secret_scopes(session.client)
    provided: dict[str, str] = {}
    missing: list[str] = []
    for name in names:
        value = from_file.get(name) or os.environ.get(name)
        if value:
            provided[name] = value
        elif stored is None or name in stored:
            continue  # stored on the platform (or unknown): the platform resolves it
        elif ctx.interactive:
            value = prompt_hidden(f"Value for secret {name} (hidden): ")
            if not value:
                raise CLIError(
                    CLIErrorCode.VALIDATION, f"The value of secret {name} must not be empty."
                )
            provided[name] = value
        else:
            missing.append(name)
    if missing:
        hints = "\n".join(f"  osmosis secret set {name}" for name in missing)
        raise CLIError(
            CLIErrorCode.INTERACTIVE_REQUIRED,
            f"No value found for: {', '.join(missing)}. Export them, pass --secrets-file, or "
            f"save them on the platform:\n{hints}",
            {"missing": missing, "flags": ["--secrets-file"]},
        )
    scopes = {name: "Run" if name in provided else (stored or {}).get(name, "-") for name in names}
    return provided, scopes


def _result(
    kind: SubmitKind,
    session: Session,
    config: EvalConfig | TrainingConfig,
    result: SubmitResult,
    rows: dict[str, object] | None = None,
) -> OperationResult:
    experiment = config.experiment
    resource: dict[str, object] = {
        "id": result.id,
        "name": result.name,
        "status": result.status,
        "model_name": experiment.model_path,
        "dataset_name": experiment.dataset,
        "created_at": result.created_at,
    }
    if result.platform_url:
        resource["url"] = result.platform_url
    resource |= session.result_context()
    resource["config"] = {
        "rollout": experiment.rollout,
        "entrypoint": experiment.entrypoint,
        "model": experiment.model_path,
        "dataset": experiment.dataset,
        "branch": experiment.branch,
        "commit_sha": experiment.commit_sha,
    }
    if rows is not None:
        resource["rows"] = rows
    steps = [
        f"Status: {result.status}",
        *([f"Rows: {rows_text(rows)} of {experiment.dataset}"] if rows is not None else []),
        f"View: {result.platform_url}"
        if result.platform_url
        else f"Check it with: osmosis {kind.verb} info {result.name}",
    ]
    structured: list[dict[str, object]] = [
        {"action": f"{kind.verb}_info", "name": result.name},
        {"action": f"{kind.verb}_list"},
    ]
    if result.platform_url:
        structured.append({"action": "open_url", "url": result.platform_url})
    return OperationResult(
        operation=kind.operation,
        status="success",
        resource=resource,
        message=f"{kind.label} run submitted: {result.name}",
        next_steps=steps,
        next_steps_structured=structured,
    )
