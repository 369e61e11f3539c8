"""Models: registering a base model from a local Hugging Face model directory."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from osmosis_ai.platform.errors import Conflict, InvalidRequest
from osmosis_ai.platform.store.orm import Model

_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,254}$")


def check_model_dir(path: Path) -> dict[str, object]:
    """The ``config.json`` of the Hugging Face model directory ``path``; a named error if none."""
    folder = path.expanduser()
    if not folder.is_dir():
        raise InvalidRequest(
            f"Not a directory: {path}. Give the folder of a Hugging Face model "
            "(the one holding config.json).",
            field="path",
        )
    config_file = folder / "config.json"
    try:
        config: object = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise InvalidRequest(
            f"{folder} has no config.json, so it is not a Hugging Face model directory. "
            "Point --path at the folder save_pretrained() wrote.",
            field="path",
        ) from None
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{config_file} is not readable JSON: {exc}", field="path") from None
    if not isinstance(config, dict):
        raise InvalidRequest(f"{config_file} does not hold a JSON object.", field="path")
    return {str(k): v for k, v in config.items()}  # pyright: ignore[reportUnknownVariableType]


def register_base_model(
    session: Session, name: str, path: Path, *, creator_id: str | None = None
) -> Model:
    """Record the model directory ``path`` as base model ``name`` (visible to every workspace)."""
    if not _MODEL_NAME.match(name):
        raise InvalidRequest(
            f"Not a model name: {name!r}. Use letters, digits, '.', '_', '-' and '/' "
            "(e.g. Qwen/Qwen3-0.6B).",
            field="name",
        )
    config = check_model_dir(path)
    if session.scalar(select(Model).where(Model.name == name)) is not None:
        raise Conflict(f"A model named {name!r} exists already.", field="name")
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
