"""Resolve ``"package.module:attr"`` strings to objects and back."""

from __future__ import annotations

import importlib
from typing import Any


def resolve_object(path: str) -> Any:
    """Import ``"package.module:Attr"`` (dots after the colon walk attributes)."""
    module_name, sep, attr_path = path.partition(":")
    if not sep or not module_name or not attr_path:
        raise ValueError(f"expected 'module:attr', got {path!r}")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ImportError(f"cannot import module {module_name!r} named in {path!r}: {exc}") from exc
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ImportError(f"module {module_name!r} has no attribute {attr_path!r}") from None
    return obj


def to_import_path(obj: Any) -> str:
    """The ``"module:qualname"`` string that :func:`resolve_object` turns back into ``obj``."""
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname or "<locals>" in qualname:
        raise ValueError(f"{obj!r} has no importable path")
    return f"{module}:{qualname}"
