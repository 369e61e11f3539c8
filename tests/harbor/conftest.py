"""Fixtures of the Harbor tier: skips with a named reason, and a task builder."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harbor_support import harbor_missing_reason, make_task, sandbox_missing_reason

# Harbor imports LiteLLM, which otherwise fetches a model price list at import time.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = harbor_missing_reason()
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("harbor") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def harbor_available() -> None:
    """Skip unless Harbor imports here (Python >= 3.12 with the harbor extra)."""
    if reason := harbor_missing_reason():
        pytest.skip(reason)


@pytest.fixture
def sandbox_available(harbor_available: None) -> None:
    """Skip unless the bubblewrap sandbox can run here (Linux, root, bwrap, overlay)."""
    if reason := sandbox_missing_reason():
        pytest.skip(reason)


@pytest.fixture
def task_builder(tmp_path: Path) -> Callable[..., Path]:
    """``task_builder(name="task", **options)`` writes a task folder under tmp_path/tasks."""

    def build(name: str = "task", **options: Any) -> Path:
        return make_task(tmp_path / "tasks", name, **options)

    return build
