"""The submit flow shared by ``osmosis eval submit`` and ``osmosis train submit`` (§4.6).

Workspace and login; the config, loaded and validated; the backend preflight; a pinned
commit's lookup; the summary; each required secret resolved (``--secrets-file``, then the
process environment, then a stored platform secret, then a hidden prompt); the notice of
what the platform will fetch; confirmation; the POST. Secret values sent for the run are
redacted from any error the platform answers with.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from osmosis_ai.cli import records
from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult
from osmosis_ai.cli.platform_session import Session, open_session
from osmosis_ai.cli.secret_values import prompt_hidden, redacted
from osmosis_ai.platform.client import PlatformClientError, SubmitResult
from osmosis_ai.workspace import EvalConfig, TrainingConfig


@dataclass(frozen=True)
class SubmitKind:
    """What differs between the two submits."""

    verb: str  # "eval" | "train"
    label: str  # "Evaluation" | "Training"
    config_dir: str  # "configs/eval"
    endpoint: str  # "/api/cli/eval-runs"

    @property
    def operation(self) -> str:
        return f"{self.verb}.submit"


EVAL = SubmitKind("eval", "Evaluation", "configs/eval", "/api/cli/eval-runs")
TRAIN = SubmitKind("train", "Training", "configs/training", "/api/cli/training-runs")


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
    from osmosis_ai.platform.client.submit import (
        backend_preflight,
        check_pinned_commit,
        remote_fetch_notice,
        run_payload,
    )

    with open_session(ctx) as session:
        assert session.workspace is not None
        root = session.workspace.root
        config = _load(kind, _config_path(args.config, root), root)
        advisories = backend_preflight(config, f"osmosis {kind.verb} submit")
        experiment = config.experiment
        if experiment.commit_sha:
            commit = check_pinned_commit(root, experiment.commit_sha)
            if commit.error:
                raise CLIError(CLIErrorCode.VALIDATION, commit.error)
            advisories += commit.warnings
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
        rows = _eval_rows(session, config) if isinstance(config, EvalConfig) else None
        if rows is not None:
            summary["Rows"] = rows_text(rows)
        summary |= {f"env.{name}": value for name, value in sorted(config.env.items())}
        provided, scopes = _resolve_secrets(ctx, session, config, args.secrets_file)
        summary |= {f"secret.{name}": scope for name, scope in sorted(scopes.items())}
        notes, fetch_warnings = remote_fetch_notice(
            root, branch=experiment.branch, commit_sha=experiment.commit_sha
        )
        advisories += fetch_warnings
        if args.yes:  # no prompt will show them
            for code, message in advisories:
                ctx.warn(code, message)
        confirm(
            f"Submit this {kind.label.lower()} run?",
            yes=args.yes,
            summary=summary,
            notes=notes,
            warnings=[message for _, message in advisories],
        )
        result = _post(session, kind, run_payload(config, provided), provided)
        return _result(kind, session, config, result, rows)


def _eval_rows(session: Session, config: EvalConfig) -> dict[str, object]:
    """The rows a managed eval evaluates: ``limit`` (``None``: every row) and, when the
    platform names it, the dataset's row count and so the count evaluated."""
    from osmosis_ai.platform.client import segment

    limit = config.evaluation.limit
    total: int | None = None
    with contextlib.suppress(PlatformClientError):  # the platform checks the dataset at submit
        found = session.client.call(
            "GET", f"/api/cli/datasets/{segment(config.experiment.dataset)}"
        )
        count = found.get("row_count")
        total = count if isinstance(count, int) and not isinstance(count, bool) else None
    rows = None if total is None else total if limit is None else min(limit, total)
    return {"limit": limit, "dataset_rows": total, "rows": rows}


def rows_text(rows: dict[str, object]) -> str:
    """``all 20 rows`` / ``the first 3 of 20 rows`` (``…rows`` when the count is unknown)."""
    limit, total = rows.get("limit"), rows.get("dataset_rows")
    if limit is None:
        return "all rows" if total is None else f"all {total} rows"
    if total is None:
        return f"the first {limit} rows"
    return f"the first {rows.get('rows')} of {total} rows"


def _config_path(path: Path, root: Path) -> Path:
    """Relative to the working directory, or else to the workspace directory."""
    path = path.expanduser()
    if path.is_absolute() or path.exists():
        return path.resolve()
    return (root / path).resolve()


def _load(kind: SubmitKind, path: Path, root: Path) -> EvalConfig | TrainingConfig:
    from osmosis_ai.workspace import Workspace, load_eval_config, load_training_config

    workspace = Workspace(root)
    config = (
        load_eval_config(path, workspace) if kind is EVAL else load_training_config(path, workspace)
    )
    if config.model_dir is not None:
        raise CLIError(
            CLIErrorCode.VALIDATION,
            f"experiment.model_path {config.experiment.model_path!r} is a local directory, "
            "which the platform cannot read: name a model the platform serves (see `osmosis "
            "model list`).",
            {"key": "experiment.model_path"},
        )
    return config


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
    stored = _stored_secret_scopes(ctx, session)
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


def _stored_secret_scopes(ctx: Context, session: Session) -> dict[str, str] | None:
    """Stored secret names and the scope a run would use (personal wins); ``None``: unknown."""
    try:
        page = session.client.fetch(
            "/api/cli/environment-secrets",
            "environment_secrets",
            fetch_all=True,
            params={"scope": "all"},
        )
    except PlatformClientError as exc:
        if exc.code == "AUTH_REQUIRED":
            raise
        ctx.warn(
            "SECRETS_LOOKUP_FAILED",
            f"Could not list the platform's stored secrets ({exc.message}); the platform will "
            "check them at submit.",
        )
        return None
    workspace = {str(s.get("name")) for s in page.items if s.get("scope") == "workspace"}
    personal = {str(s.get("name")) for s in page.items if s.get("scope") == records.WIRE_PERSONAL}
    scopes = {name: "Workspace" for name in workspace}
    for name in personal:
        scopes[name] = "Personal (overrides workspace)" if name in workspace else "Personal"
    return scopes


# --- the POST -------------------------------------------------------------------------------


def _post(
    session: Session, kind: SubmitKind, body: dict[str, object], provided: dict[str, str]
) -> SubmitResult:
    from osmosis_ai.platform.client.submit import MISSING_SECRET

    try:
        answer = session.client.call("POST", kind.endpoint, json=body)
    except PlatformClientError as exc:
        clean = redacted(exc, provided.values()) if provided else exc
        error_text = clean.details.get("error")
        haystack = f"{clean.message}\n{error_text if isinstance(error_text, str) else ''}"
        found = MISSING_SECRET.search(haystack) if clean.status_code == 404 else None
        if found is not None:
            names = [n.strip() for n in found.group(1).split(",") if n.strip()]
            hints = "\n".join(f"  osmosis secret set {name}" for name in names)
            clean.message = (
                f"{clean.message}\n\nAdd them with:\n{hints}\n\nSecrets default to personal "
                "scope; use --scope workspace for secrets shared across the workspace."
            )
        elif clean.status_code in (404, 405, 501) and "platform_code" not in clean.details:
            clean.message = (
                f"This platform does not accept {kind.label.lower()} runs: POST {kind.endpoint} "
                f"answered HTTP {clean.status_code}."
            )
        clean.args = (clean.message,)
        raise clean from None
    return session.client.model(SubmitResult, answer, f"POST {kind.endpoint}")


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
