"""LoRA deployments: which trained models a workspace serves, within its quota, and how a
run or a client reaches one.

A deployed model is answered by the platform's OpenAI-compatible endpoint
(``<public URL>/v1/chat/completions``) under its *inference model* name, which is the LoRA
model's own name (unique on the platform). Callers authenticate there with a platform API
token of a workspace member, or with the workspace's serving key
(:func:`workspace_serving_key`): what a managed run on this platform uses, derived from a
key in the data dir, so only processes that share the data dir can make one.

Deploying only records the wish (``deployment_status = 'active'``); the serve process's
deployment manager (:mod:`osmosis_ai.platform.serving`) starts and stops the model servers.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from osmosis_ai.platform.errors import ConflictError, InvalidRequestError
from osmosis_ai.platform.services.accounts import WorkspaceAccess, require_creator_or_manager
from osmosis_ai.platform.services.models import MAX_ACTIVE_DEPLOYMENTS, get_lora_model
from osmosis_ai.platform.settings import PlatformSettings, load_settings
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import Model, Run, RunCheckpoint

MAX_DEPLOYMENTS_ENV = "OSMOSIS_PLATFORM_MAX_DEPLOYMENTS"
SERVING_KEY_FILE = "serving.key"
SERVING_KEY_PREFIX = "osmosis-serve-"
CHANGED_HOOK = "deployments_changed"
ACTIVE = "active"
INACTIVE = "inactive"
# an eval model_path names a deployed LoRA model of the workspace as openai/<model name>
MODEL_PATH_PREFIX = "openai/"


class DeploymentQuotaExceededError(ConflictError):
    """The workspace serves as many models as its quota allows."""

    default_code = "DEPLOYMENT_QUOTA_EXCEEDED"


class ModelNotDeployedError(ConflictError):
    """A run names a LoRA model that is not deployed."""

    default_code = "MODEL_NOT_DEPLOYED"


@dataclass(frozen=True)
class Deployed:
    """How to reach a deployed model: an OpenAI-compatible ``base_url`` (ending in ``/v1``),
    the ``model_name`` to send, and an ``api_key`` accepted there for its workspace."""

    base_url: str
    model_name: str
    api_key: str

    @property
    def model_path(self) -> str:
        """The eval ``model_path`` that reaches it with ``OPENAI_BASE_URL``/``OPENAI_API_KEY``."""
        return f"openai/{self.model_name}"

    def environ(self) -> dict[str, str]:
        """``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` for an eval run of :attr:`model_path`."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_API_KEY": self.api_key}


def notify_changed(extras: Mapping[str, object]) -> None:
    """Tell the serve process's deployment manager, when it runs here, that a deployment
    changed (it registers itself under :data:`CHANGED_HOOK` in ``Platform.extras``)."""
    hook = extras.get(CHANGED_HOOK)
    if callable(hook):
        hook()


def max_active_deployments(environ: Mapping[str, str] | None = None) -> int:
    """A workspace's quota: ``OSMOSIS_PLATFORM_MAX_DEPLOYMENTS``, else the default (4)."""
    env = os.environ if environ is None else environ
    text = env.get(MAX_DEPLOYMENTS_ENV, "").strip()
    if not text:
        return MAX_ACTIVE_DEPLOYMENTS
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidRequestError(
            f"{MAX_DEPLOYMENTS_ENV}={text!r} is not a count of deployments: give a whole "
            f"number such as {MAX_ACTIVE_DEPLOYMENTS} (0 turns deploying off)."
        )
    return value


def inference_model(model: Model) -> str:
    """The name clients send as ``model`` to reach ``model`` once deployed."""
    return model.name


def serving_base_url(public_url: str) -> str:
    return f"{public_url.rstrip('/')}/v1"


def is_active(model: Model) -> bool:
    return model.deployment_status == ACTIVE


def active_models(session: Session, workspace_id: str | None = None) -> list[Model]:
    """Deployed LoRA models (of one workspace, or of every one), oldest deployment first."""
    query = select(Model).where(Model.kind == "lora", Model.deployment_status == ACTIVE)
    if workspace_id is not None:
        query = query.where(Model.workspace_id == workspace_id)
    return list(session.scalars(query.order_by(Model.deployed_at, Model.name)))


def deploy(
    session: Session,
    workspace_id: str,
    name: str,
    *,
    user_id: str | None,
    now: datetime,
    limit: int,
) -> Model:
    """Mark LoRA model ``name`` deployed (already deployed: unchanged), within ``limit``."""
    model = get_lora_model(session, workspace_id, name)
    if is_active(model):
        return model
    active = active_models(session, workspace_id)
    if len(active) >= limit:
        names = ", ".join(m.name for m in active) or "none"
        fix = (
            f"free one with: osmosis model undeploy {active[0].name}"
            if active
            else f"ask the platform admin to raise {MAX_DEPLOYMENTS_ENV}"
        )
        raise DeploymentQuotaExceededError(
            f"Cannot deploy {name!r}: this workspace already serves {len(active)} of its "
            f"{limit} allowed deployments ({names}); {fix}.",
            details={
                "active_deployments": len(active),
                "max_active_deployments": limit,
                "deployed_models": [m.name for m in active],
            },
        )
    model.deployment_status = ACTIVE
    model.deployed_at = now
    model.deployed_by = user_id
    session.flush()
    return model


def undeploy(session: Session, workspace: WorkspaceAccess, user_id: str, name: str) -> Model:
    """Mark LoRA model ``name`` not deployed (already so: unchanged).

    Only who deployed it or a workspace owner or admin may."""
    model = get_lora_model(session, workspace.id, name)
    if model.deployment_status != INACTIVE:
        require_creator_or_manager(
            workspace,
            user_id,
            model.deployed_by,
            action="undeploy",
            what=f"the deployment of {name!r}",
            code="UNDEPLOY_FORBIDDEN",
        )
    if model.deployment_status != INACTIVE:
        model.deployment_status = INACTIVE
        session.flush()
    return model


def find_deployed(session: Session, name: str) -> Model | None:
    """The LoRA model whose inference name is ``name``, deployed or not (None: no such)."""
    return session.scalar(select(Model).where(Model.kind == "lora", Model.name == name))


# --- where a deployed model's files come from ---------------------------------------------


@dataclass(frozen=True)
class CheckpointSource:
    """Where a LoRA model's checkpoint is: an object-store prefix, or a local folder."""

    object_prefix: str | None = None
    folder: Path | None = None

    def describe(self) -> str:
        return (
            f"objects/{self.object_prefix}" if self.object_prefix is not None else str(self.folder)
        )


def checkpoint_source(session: Session, model: Model) -> CheckpointSource:
    """Where ``model``'s checkpoint files are: its ``path`` when that is a folder on this
    machine, else the object-store prefix it names (``runs/<run>/checkpoints/step-<N>``),
    else the prefix its training run recorded for its step."""
    path = (model.path or "").strip()
    if path.startswith("/") and Path(path).is_dir():
        return CheckpointSource(folder=Path(path))
    if path and not path.startswith("/"):
        return CheckpointSource(object_prefix=path.removeprefix("objects/").strip("/"))
    if model.training_run_id is not None and model.checkpoint_step is not None:
        prefix = session.scalar(
            select(RunCheckpoint.object_prefix).where(
                RunCheckpoint.run_id == model.training_run_id,
                RunCheckpoint.step == model.checkpoint_step,
            )
        )
        if prefix:
            return CheckpointSource(object_prefix=prefix)
    raise InvalidRequestError(
        f"LoRA model {model.name!r} has no checkpoint this platform can read (path "
        f"{path!r}); it must name a folder or an object prefix such as "
        "runs/<run_id>/checkpoints/step-<N>.",
        code="CHECKPOINT_MISSING",
    )


# --- how runs and clients reach a deployment ------------------------------------------------


def workspace_serving_key(data_dir: Path, workspace_id: str) -> str:
    """The key a managed run of ``workspace_id`` sends to ``/v1`` (from the data dir's
    ``serving.key``; every process sharing the data dir derives the same one)."""
    from osmosis_ai.platform.crypto import load_or_create_key

    secret = load_or_create_key(Path(data_dir) / SERVING_KEY_FILE)
    digest = hmac.new(secret, workspace_id.encode("utf-8"), hashlib.sha256).hexdigest()
    return f"{SERVING_KEY_PREFIX}{workspace_id}.{digest}"


def serving_key_workspace(data_dir: Path, key: str) -> str | None:
    """The workspace a serving key was made for; None when ``key`` is not a valid one."""
    if not key.startswith(SERVING_KEY_PREFIX):
        return None
    workspace_id, dot, _ = key.removeprefix(SERVING_KEY_PREFIX).partition(".")
    if not dot or not workspace_id:
        return None
    expected = workspace_serving_key(data_dir, workspace_id)
    if not hmac.compare_digest(expected.encode("utf-8"), key.encode("utf-8", "replace")):
        return None
    return workspace_id


def resolve_deployed(
    session: Session, workspace_id: str, model_path: str, *, settings: PlatformSettings
) -> Deployed | None:
    """The deployment an eval run's ``model_path`` names, or None when it names no LoRA
    model of the workspace (a provider model, say).

    ``openai/<name>`` names LoRA model ``<name>`` (the form that reaches it through
    ``OPENAI_BASE_URL``, locally too); one that exists but is not deployed raises
    :class:`ModelNotDeployedError` with the fix.
    """
    path = model_path.strip()
    if not path.startswith(MODEL_PATH_PREFIX):
        return None
    name = path.removeprefix(MODEL_PATH_PREFIX)
    if not name or "/" in name:
        return None
    model = session.scalar(
        select(Model).where(
            Model.kind == "lora", Model.workspace_id == workspace_id, Model.name == name
        )
    )
    if model is None:
        return None
    if not is_active(model):
        raise ModelNotDeployedError(
            f"LoRA model {name!r} is not deployed, so model_path {model_path!r} cannot reach "
            f"it: run osmosis model deploy {name}, then submit again.",
            field="model_path",
        )
    return Deployed(
        base_url=serving_base_url(settings.public_url),
        model_name=inference_model(model),
        api_key=workspace_serving_key(settings.key_dir, workspace_id),
    )


def eval_model_environment(
    database: Database, run: Run, settings: PlatformSettings | None = None
) -> dict[str, str]:
    """``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` for a managed eval run whose model_path
    (``openai/<name>``) names a model deployed in its workspace; empty otherwise.

    ``settings`` are the platform's (the data dir holds the serving key); without them they
    are loaded as ``osmosis platform`` commands load them.
    """
    if settings is None:
        settings = load_settings()
    with database.read() as session:
        found = resolve_deployed(session, run.workspace_id, run.model_path, settings=settings)
    return {} if found is None else found.environ()
