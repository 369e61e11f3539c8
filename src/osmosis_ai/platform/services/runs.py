"""Eval and training runs: submit, list, find, stop, logs (reference §6.1, §6.2, §6.4–6.5).

A submit is checked in this order, each failure a named error before anything is stored:
the config (:mod:`~osmosis_ai.platform.services.run_config`, 400); the dataset (an
``uploaded`` one of that name, 404), for training the base model (404), and the secrets
(each given with the run or stored personal or workspace, else 400 ``SECRETS_MISSING``);
then the code: the workspace repository is fetched (always, never from a recent fetch),
the run's ``commit_sha`` or ``branch`` (default: the repository's default branch) is
resolved to a full commit, and ``rollouts/<rollout>/`` and its entrypoint must exist in
that commit (404 ``COMMIT_NOT_FOUND``, ``BRANCH_NOT_FOUND``, ``ROLLOUT_NOT_FOUND``,
``ENTRYPOINT_NOT_FOUND``). Git runs outside any transaction; the references are checked
again in the transaction that stores the run.

A new run is ``pending`` and gets a readable name unique in its workspace
(``adjective-animal-NN``, the style of the hosted platform's run names). Values given for
its secrets are sealed with the platform's :class:`~osmosis_ai.platform.crypto.SecretBox`
bound to the run, never answered or logged, and dropped when the run ends;
:func:`run_secret_values` hands a worker every value the run needs.

Anyone in the workspace may submit; a run is stopped by its creator or an owner or admin.
"""

from __future__ import annotations

import json
import secrets as random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from osmosis_ai.platform import gitsync
from osmosis_ai.platform.crypto import SecretBox
from osmosis_ai.platform.errors import ConflictError, InvalidRequestError, NotFoundError
from osmosis_ai.platform.services import rollouts as rollout_service
from osmosis_ai.platform.services.accounts import WorkspaceAccess, require_creator_or_manager
from osmosis_ai.platform.services.datasets import dataset_for_run
from osmosis_ai.platform.services.models import get_base_model
from osmosis_ai.platform.services.paging import CursorPage, Page, cursor_page, offset_page
from osmosis_ai.platform.services.run_config import Experiment, Submission
from osmosis_ai.platform.services.secrets import resolve_secret_scopes, resolve_secrets
from osmosis_ai.platform.settings import PlatformSettings
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import (
    Dataset,
    Model,
    Rollout,
    Run,
    RunLog,
    Secret,
    User,
    new_id,
)

TERMINAL = {
    "eval": frozenset({"finished", "failed", "stopped"}),
    "training": frozenset({"finished", "failed", "crashed", "stopped", "killed", "unknown"}),
}
NAME_ATTEMPTS = 20

_ADJECTIVES = (
    "amber", "bold", "brisk", "calm", "clever", "cosmic", "crisp", "daring", "dusty", "eager",
    "fair", "fleet", "gentle", "golden", "grand", "hardy", "humble", "icy", "jolly", "keen",
    "lively", "lucky", "mellow", "misty", "nimble", "noble", "proud", "quiet", "rapid", "rosy",
    "rustic", "sandy", "shy", "silent", "sleek", "steady", "sunny", "swift", "tidy", "vivid",
    "warm", "wild", "wise", "witty", "young", "zesty",
)  # fmt: skip
_ANIMALS = (
    "alpaca", "badger", "beaver", "bison", "condor", "coyote", "crane", "dingo", "egret",
    "ferret", "finch", "gazelle", "gecko", "heron", "ibex", "impala", "jackal", "kestrel",
    "koala", "lemur", "llama", "lynx", "magpie", "marmot", "mink", "moose", "narwhal", "ocelot",
    "orca", "osprey", "otter", "panda", "pelican", "puffin", "quokka", "raven", "salmon",
    "seal", "stoat", "tapir", "toucan", "trout", "walrus", "wombat", "yak", "zebra",
)  # fmt: skip


class RunNotFoundError(NotFoundError):
    default_code = "RUN_NOT_FOUND"


def label(kind: str) -> str:
    return "eval run" if kind == "eval" else "training run"


def command(kind: str) -> str:
    return "eval" if kind == "eval" else "train"


# --- submit ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    """The code a run runs: a branch (``None`` for a pinned commit) and its full commit."""

    branch: str | None
    commit_sha: str


@dataclass(frozen=True)
class References:
    dataset: Dataset
    model: Model | None
    secret_scopes: dict[str, str]


def submit_run(
    database: Database,
    settings: PlatformSettings,
    workspace: WorkspaceAccess,
    user_id: str,
    submission: Submission,
    *,
    box: SecretBox,
    now: Callable[[], datetime],
) -> Run:
    """Check ``submission`` against the workspace and its repository, and store it pending."""
    with database.read() as session:
        check_references(session, workspace, user_id, submission)
    source = resolve_source(database, settings, workspace, submission.experiment, now=now)
    experiment = submission.experiment
    run_id = new_id()
    with database.transaction() as session:
        refs = check_references(session, workspace, user_id, submission)
        sealed = (
            box.encrypt(json.dumps(submission.provided_secrets), bound_to=_bound(run_id))
            if submission.provided_secrets
            else None
        )
        sections = submission.sections
        created = now()
        run = Run(
            id=run_id,
            workspace_id=workspace.id,
            kind=submission.kind,
            status="pending",
            creator_id=user_id,
            rollout_name=experiment.rollout,
            rollout_id=_rollout_id(session, workspace.id, experiment.rollout, source),
            entrypoint=experiment.entrypoint,
            branch=source.branch,
            commit_sha=source.commit_sha,
            model_path=experiment.model_path,
            model_id=refs.model.id if refs.model is not None else None,
            dataset_name=experiment.dataset,
            dataset_id=refs.dataset.id,
            experiment_config=submission.experiment_config,
            evaluation_config=sections.get("evaluation"),
            training_config=sections.get("training"),
            sampling_config=sections.get("sampling"),
            checkpoints_config=sections.get("checkpoints"),
            advanced_config=sections.get("advanced"),
            env_config=submission.env or None,
            required_secrets=submission.required_secrets,
            secret_scopes=refs.secret_scopes,
            provided_secrets=sealed,
            created_at=created,
            updated_at=created,
        )
        _insert_with_name(session, run)
        where = f"{source.branch}@{source.commit_sha[:7]}" if source.branch else source.commit_sha
        add_log(
            session,
            run,
            created,
            "submit",
            f"Submitted: rollout {experiment.rollout} ({experiment.entrypoint}) at {where}, "
            f"dataset {experiment.dataset}, model {experiment.model_path}",
            details={
                "branch": source.branch,
                "commit_sha": source.commit_sha,
                "secrets": dict(refs.secret_scopes),
            },
        )
    return run


def check_references(
    session: Session, workspace: WorkspaceAccess, user_id: str, submission: Submission
) -> References:
    """The run's dataset, base model (training) and where each secret comes from."""
    experiment = submission.experiment
    dataset = dataset_for_run(session, workspace, experiment.dataset)
    model = (
        get_base_model(session, workspace.id, experiment.model_path)
        if submission.kind == "training"
        else None
    )
    scopes = resolve_secret_scopes(
        session,
        workspace.id,
        user_id,
        submission.required_secrets,
        provided=submission.provided_secrets,
    )
    personal = [name for name, scope in scopes.items() if scope == "user"]
    if personal:
        shared = set(
            session.scalars(
                select(Secret.name).where(
                    Secret.workspace_id == workspace.id,
                    Secret.scope == "workspace",
                    Secret.name.in_(personal),
                )
            )
        )
        scopes = {n: "user_override" if n in shared else s for n, s in scopes.items()}
    return References(dataset=dataset, model=model, secret_scopes=scopes)


def resolve_source(
    database: Database,
    settings: PlatformSettings,
    workspace: WorkspaceAccess,
    experiment: Experiment,
    *,
    now: Callable[[], datetime],
) -> Source:
    """Fetch the repository and resolve the run's commit; the rollout must be in it."""
    outcome = rollout_service.sync_workspace(database, settings, workspace.id, now=now)
    repo = workspace.repo_full_name
    if outcome.status != "success":
        raise gitsync.GitSyncError(
            f"Could not fetch {repo} to find the run's code: {outcome.message}",
            details={"repository": repo},
        )
    mirror = gitsync.mirror_path(settings.mirrors_dir, workspace.id)
    with gitsync.mirror_lock(mirror):
        if experiment.commit_sha is not None:
            branch = None
            commit = _pinned_commit(mirror, repo, experiment.commit_sha)
            where = f"commit {commit[:12]}"
        else:
            branch = experiment.branch or outcome.default_branch
            if branch is None or not outcome.branches:
                raise NotFoundError(
                    f"The repository {repo} has no branches yet: push a commit first.",
                    code="BRANCH_NOT_FOUND",
                    field="experiment_config.branch",
                )
            head = gitsync.branch_head(mirror, branch)
            if head is None:
                raise NotFoundError(
                    f"The repository {repo} has no branch {branch!r}: push it, or fix "
                    "[experiment].branch.",
                    code="BRANCH_NOT_FOUND",
                    field="experiment_config.branch",
                    details={"branch": branch, "repository": repo},
                )
            commit = head
            where = f"branch {branch} ({commit[:12]})"
        if gitsync.object_type(mirror, f"{commit}:{experiment.rollout_dir}") != "tree":
            raise NotFoundError(
                f"There is no rollout {experiment.rollout!r} ({experiment.rollout_dir}/) in "
                f"{repo} at {where}: commit and push it, or fix [experiment].rollout.",
                code="ROLLOUT_NOT_FOUND",
                field="experiment_config.rollout",
                details={"rollout": experiment.rollout, "commit_sha": commit, "branch": branch},
            )
        if gitsync.object_type(mirror, f"{commit}:{experiment.entrypoint_path}") != "blob":
            raise NotFoundError(
                f"The entrypoint {experiment.entrypoint_path} is not a file in {repo} at "
                f"{where}: commit and push it, or fix [experiment].entrypoint.",
                code="ENTRYPOINT_NOT_FOUND",
                field="experiment_config.entrypoint",
                details={"entrypoint": experiment.entrypoint, "commit_sha": commit},
            )
    return Source(branch=branch, commit_sha=commit)


def _pinned_commit(mirror: Path, repo: str, sha: str) -> str:
    matches = gitsync.commits_matching(mirror, sha)
    if not matches:
        raise NotFoundError(
            f"The commit {sha} is not in {repo}: push it, or fix [experiment].commit_sha.",
            code="COMMIT_NOT_FOUND",
            field="experiment_config.commit_sha",
            details={"commit_sha": sha, "repository": repo},
        )
    if len(matches) > 1:
        raise InvalidRequestError(
            f"The commit prefix {sha} matches {len(matches)} commits in {repo}: give more of "
            "the SHA in [experiment].commit_sha.",
            code="COMMIT_AMBIGUOUS",
            field="experiment_config.commit_sha",
            details={"commit_sha": sha, "matches": matches[:10]},
        )
    return matches[0]


def _rollout_id(session: Session, workspace_id: str, name: str, source: Source) -> str | None:
    """The Git-sync rollout row of this run's code: its branch's, else one seen at its commit."""
    query = select(Rollout.id).where(Rollout.workspace_id == workspace_id, Rollout.name == name)
    if source.branch is not None:
        return session.scalar(query.where(Rollout.branch == source.branch))
    return session.scalar(
        query.where(Rollout.last_synced_commit_sha == source.commit_sha).order_by(Rollout.branch)
    )


def _insert_with_name(session: Session, run: Run) -> None:
    """Give ``run`` a free name and insert it (a name taken meanwhile gets another try)."""
    for attempt in range(3):
        run.name = _free_name(session, run.workspace_id)
        try:
            with session.begin_nested():
                session.add(run)
                session.flush()
        except IntegrityError:
            if attempt == 2:
                raise
            continue
        return


def _free_name(session: Session, workspace_id: str) -> str:
    candidates = [
        f"{random.choice(_ADJECTIVES)}-{random.choice(_ANIMALS)}-{random.randbelow(100)}"
        for _ in range(NAME_ATTEMPTS)
    ]
    taken = set(
        session.scalars(
            select(Run.name).where(Run.workspace_id == workspace_id, Run.name.in_(candidates))
        )
    )
    for name in candidates:
        if name not in taken:
            return name
    return f"{candidates[0]}-{random.token_hex(3)}"  # a crowded workspace: widen the name


def _bound(run_id: str) -> str:
    return f"run/{run_id}/secrets"


def seal_secrets(box: SecretBox, run_id: str, values: Mapping[str, str]) -> str | None:
    """Seal the values given for a run's secrets (``None`` when there are none)."""
    return box.encrypt(json.dumps(dict(values)), bound_to=_bound(run_id)) if values else None


def run_secret_values(session: Session, run: Run, *, box: SecretBox) -> dict[str, str]:
    """Every secret value ``run`` needs (given > its creator's personal > workspace).

    For the worker that starts the run. Raises ``SECRETS_MISSING`` if a stored secret was
    deleted since the submit.
    """
    provided: dict[str, str] = {}
    if run.provided_secrets:
        loaded: object = json.loads(box.decrypt(run.provided_secrets, bound_to=_bound(run.id)))
        assert isinstance(loaded, dict)
        provided = {str(k): str(v) for k, v in loaded.items()}  # pyright: ignore[reportUnknownVariableType]
    return resolve_secrets(
        session,
        run.workspace_id,
        run.creator_id or "",
        run.required_secrets,
        box=box,
        provided=provided,
    )


# --- reading -----------------------------------------------------------------------------


def list_runs(
    session: Session, workspace: WorkspaceAccess, kind: str, *, limit: int, offset: int
) -> Page[Run]:
    """The workspace's runs of ``kind``, newest first."""
    query = (
        select(Run)
        .where(Run.workspace_id == workspace.id, Run.kind == kind)
        .order_by(Run.created_at.desc(), Run.id.desc())
    )
    return offset_page(session, query, limit, offset)


def get_run(session: Session, workspace: WorkspaceAccess, kind: str, name_or_id: str) -> Run:
    """A run of ``kind`` by id, else by name (404 if neither)."""
    base = select(Run).where(Run.workspace_id == workspace.id, Run.kind == kind)
    found = session.scalar(base.where(Run.id == name_or_id))
    if found is None:
        found = session.scalar(base.where(Run.name == name_or_id))
    if found is None:
        raise RunNotFoundError(
            f"No {label(kind)} {name_or_id!r} in workspace {workspace.name!r}; list them with "
            f"osmosis {command(kind)} list"
        )
    return found


def run_logs(
    session: Session,
    workspace: WorkspaceAccess,
    kind: str,
    name_or_id: str,
    *,
    limit: int,
    direction: str,
    cursor: str | None,
) -> CursorPage[RunLog]:
    run = get_run(session, workspace, kind, name_or_id)
    query = select(RunLog).where(RunLog.run_id == run.id)
    return cursor_page(session, query, RunLog.id, limit=limit, direction=direction, cursor=cursor)


@dataclass(frozen=True)
class Person:
    name: str | None
    email: str


def people(session: Session, runs: Sequence[Run]) -> dict[str, Person]:
    """The creators of ``runs``, by user id."""
    ids = {r.creator_id for r in runs if r.creator_id}
    if not ids:
        return {}
    users = session.scalars(select(User).where(User.id.in_(ids)))
    return {u.id: Person(name=u.name or u.email, email=u.email) for u in users}


def model_names(session: Session, runs: Sequence[Run]) -> dict[str, str]:
    ids = {r.model_id for r in runs if r.model_id}
    if not ids:
        return {}
    rows = session.execute(select(Model.id, Model.name).where(Model.id.in_(ids))).all()
    return {model_id: name for model_id, name in rows}


# --- changing ----------------------------------------------------------------------------


def stop_run(
    session: Session,
    workspace: WorkspaceAccess,
    user_id: str,
    kind: str,
    name_or_id: str,
    *,
    now: datetime,
) -> Run:
    """Stop a run that has not ended (its creator, or a workspace owner or admin).

    Stopping a stopped run answers it as it is; a run that ended otherwise is 409.
    """
    run = get_run(session, workspace, kind, name_or_id)
    require_creator_or_manager(
        workspace,
        user_id,
        run.creator_id,
        action="stop",
        what=f"{label(kind)} {run.name!r}",
        code="RUN_STOP_FORBIDDEN",
    )
    if run.status == "stopped":
        return run
    if run.status in TERMINAL[kind]:
        raise ConflictError(
            f"The {label(kind)} {run.name!r} already ended ({run.status}); only a run that is "
            "pending, queued or running can be stopped.",
            code="RUN_ALREADY_ENDED",
            details={"status": run.status},
        )
    previous = run.status
    finish(run, "stopped", now=now)
    add_log(session, run, now, "stop", f"Stopped by {_who(session, user_id)} (was {previous})")
    return run


def finish(run: Run, status: str, *, now: datetime) -> None:
    """Move ``run`` to the terminal ``status``: completed now, its given secrets dropped."""
    if status not in TERMINAL[run.kind]:
        raise ValueError(f"{status!r} is not a terminal status of a {label(run.kind)}")
    run.status = status
    run.completed_at = now
    run.updated_at = now
    run.provided_secrets = None


def add_log(
    session: Session,
    run: Run,
    now: datetime,
    step: str,
    message: str,
    *,
    level: str = "info",
    details: dict[str, object] | None = None,
) -> None:
    session.add(
        RunLog(
            run_id=run.id, timestamp=now, level=level, step=step, message=message, details=details
        )
    )


def _who(session: Session, user_id: str) -> str:
    user = session.get(User, user_id)
    return user.email if user is not None else user_id
