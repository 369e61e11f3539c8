"""Shared fixtures."""

from __future__ import annotations

import pytest

from platform_support import (  # noqa: F401  (platform fixtures)
    database_url,
    harness,
    postgres_server,
)


@pytest.fixture
def artifact_root(tmp_path, monkeypatch):
    """Point rollout artifacts at a temp dir for the test."""
    root = tmp_path / "artifacts"
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT", str(root))
    return root
