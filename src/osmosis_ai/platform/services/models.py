"""Models: base models registered from local Hugging Face model directories (visible to
every workspace), and the LoRA models training runs produce (one workspace's each)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import Select, func, or_, select
from sqlalchemy.orm import Session

from osmosis_ai.platform.errors import ConflictError, InvalidRequestError, NotFoundError
from osmosis_ai.platform.services.accounts import display_names
from osmosis_ai.platform.services.paging import Page, offset_page
from osmosis_ai.platform.store.orm import Model, Run

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")


def check_model_dir(path: Path) -> dict[str, object]:
    """The ``config.json`` of the Hugging Face model directory ``path``; a named error if none."""
    folder = path.expanduser()
    if not folder.is_dir():
        raise InvalidRequestError(
            f"Not a directory: {path}. Give the folder of a Hugging Face model "
            "(the one holding config.json).",
            field="path",
        )
    config_file = folder / "config.json"
    try:
        config: object = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise InvalidRequestError(
            f"{folder} has no config.json, so it is not a Hugging Face model directory. "
            "Point --path at the folder save_pretrained() wrote.",
            field="path",
        ) from None
    except (OSError, ValueError) as exc:
        raise InvalidRequestError(
            f"{config_file} is not readable JSON: {exc}", field="path"
        ) from None
    if not isinstance(config, dict):
        raise InvalidRequestError(f"{config_file} does not hold a JSON object.", field="path")
    return {str(k): v for k, v in config.items()}  # pyright: ignore[reportUnknownVariableType]


def register_base_model(
    session: Session, name: str, path: Path, *, creator_id: str | None = None
) -> Model:
    """Record the model directory ``path`` as base model ``name`` (visible to every workspace)."""
    if not _MODEL_NAME.match(name):
        raise InvalidRequestError(
            f"Not a model name: {name!r}. Use letters, digits, '.', '_', '-' and '/' "
            "(e.g. Qwen/Qwen3-0.6B).",
            field="name",
        )
    config = check_model_dir(path)
    if session.scalar(select(Model).where(Model.name == name)) is not None:
        raise ConflictError(f"A model named {name!r} exists already.", field="name")
    origin = config.get("_name_or_path")
    base_model = origin if isinstance(origin, str) and origin and "/" in origin else name
    model = Model(
        kind="base",
        name=name,
        path=str(path.expanduser().resolve()),
        base_model=base_model,
        creator_id=creator_id,
    )
    session.add(model)
    session.flush()
    return model


# --- reading (the /api/cli/models routes) ------------------------------------------------------

# How many LoRA models a workspace may serve at once on this platform.
MAX_ACTIVE_DEPLOYMENTS = 4
HF_BASE_URL = "https://huggingface.co"


class PlatformModelNotFoundError(NotFoundError):
    default_code = "MODEL_NOT_FOUND"


def _visible_base(workspace_id: str) -> Select[Model]:
    return select(Model).where(
        Model.kind == "base",
        or_(Model.workspace_id.is_(None), Model.workspace_id == workspace_id),
    )


def list_base_models(
    session: Session, workspace_id: str, *, limit: int, offset: int
) -> Page[Model]:
    """Base models every workspace sees, and this workspace's own, by name."""
    query = _visible_base(workspace_id).order_by(Model.name)
    return offset_page(session, query, limit, offset)


def get_base_model(session: Session, workspace_id: str, name_or_path: str) -> Model:
    """A base model by its name, or by the Hugging Face path it was made from."""
    query = _visible_base(workspace_id)
    found = session.scalar(query.where(Model.name == name_or_path))
    if found is None:
        found = session.scalar(query.where(Model.base_model == name_or_path).order_by(Model.name))
    if found is None:
        raise PlatformModelNotFoundError(
            f"No base model {name_or_path!r}; list them with osmosis model list --type base. "
            "An admin adds one with: osmosis platform model add NAME --path DIR"
        )
    return found


def list_lora_models(
    session: Session, workspace_id: str, *, limit: int, offset: int
) -> Page[Model]:
    """The workspace's LoRA models (made by its training runs), newest first."""
    query = (
        select(Model)
        .where(Model.kind == "lora", Model.workspace_id == workspace_id)
        .order_by(Model.created_at.desc(), Model.id.desc())
    )
    return offset_page(session, query, limit, offset)


def active_deployments(session: Session, workspace_id: str) -> int:
    """LoRA models of the workspace being served now."""
    query = select(func.count()).where(
        Model.kind == "lora",
        Model.workspace_id == workspace_id,
        Model.deployment_status == "active",
    )
    return int(session.scalar(query) or 0)


def get_lora_model(session: Session, workspace_id: str, name: str) -> Model:
    found = session.scalar(
        select(Model).where(
            Model.kind == "lora", Model.workspace_id == workspace_id, Model.name == name
        )
    )
    if found is None:
        base = session.scalar(_visible_base(workspace_id).where(Model.name == name))
        hint = (
            f"{name!r} is a base model: see osmosis model list --type base"
            if base is not None
            else "list them with osmosis model list --type lora"
        )
        raise PlatformModelNotFoundError(f"No LoRA model {name!r} in this workspace; {hint}")
    return found


def model_config(model: Model) -> dict[str, object]:
    """The model directory's ``config.json`` (empty when it can no longer be read)."""
    try:
        return check_model_dir(Path(model.path))
    except InvalidRequestError:
        return {}


def hf_url(model: Model) -> str | None:
    """The Hugging Face page of the model a base model was made from, when it names one."""
    origin = model.base_model or ""
    return f"{HF_BASE_URL}/{origin}" if "/" in origin and not origin.startswith("/") else None


def creator_names(session: Session, models: Sequence[Model]) -> dict[str, str]:
    return display_names(session, (m.creator_id for m in models))


def deployer_names(session: Session, models: Sequence[Model]) -> dict[str, str]:
    return display_names(session, (m.deployed_by for m in models))


def training_run_names(session: Session, models: Sequence[Model]) -> dict[str, str]:
    """The names of the training runs ``models`` come from, by run id."""
    ids = {m.training_run_id for m in models if m.training_run_id}
    if not ids:
        return {}
    rows = session.execute(select(Run.id, Run.name).where(Run.id.in_(ids)))
    return {run_id: name for run_id, name in rows}
