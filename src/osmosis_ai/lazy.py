"""Lazy package exports (PEP 562), shared by every package that names its API up front.

A package maps each exported name to the module defining it; a name is imported on first
access and then cached in the package, so importing the package, or one submodule of it,
costs nothing for the rest (``osmosis --help`` and the rollout server's start-up rely on it).
"""

from __future__ import annotations

import sys

# Not typing.TYPE_CHECKING: the root package uses this module, and importing typing (or
# importlib) here would slow down `osmosis --help`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str], *, together: bool = False
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``exports`` map names to modules.

    With ``together``, the first access imports every export, so the package afterwards
    looks exactly as an eagerly imported one would.
    """
    namespace = sys.modules[package].__dict__

    def getattr_(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        from importlib import import_module

        for export in exports if together else (name,):
            namespace[export] = getattr(import_module(exports[export]), export)
        return namespace[name]

    def dir_() -> list[str]:
        return sorted({*namespace, *exports})

    return getattr_, dir_
