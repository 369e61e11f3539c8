"""A running platform for API tests: real uvicorn on 127.0.0.1, a real database, two
workspaces and three users with tokens.

* ``team`` (repo ``acme/team``): alice is owner, bob a member, carol an admin;
* ``other`` (repo ``acme/other``): alice is owner.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from osmosis_ai.platform.api.app import create_platform_app
from osmosis_ai.platform.auth import issue_token
from osmosis_ai.platform.services.accounts import add_member, create_user, create_workspace
from osmosis_ai.platform.settings import PlatformSettings, load_settings
from osmosis_ai.platform.store.database import Database, open_database
from osmosis_ai.platform.store.orm import utcnow
from osmosis_ai.testing.serving import ServerThread, free_port

TEAM = "acme/team"
OTHER = "acme/other"


@dataclass
class World:
    url: str
    settings: PlatformSettings
    database: Database
    tokens: dict[str, str] = field(default_factory=dict[str, str])
    user_ids: dict[str, str] = field(default_factory=dict[str, str])
    workspace_ids: dict[str, str] = field(default_factory=dict[str, str])

    def client(self, user: str = "alice", repo: str | None = TEAM) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.tokens[user]}"}
        if repo is not None:
            headers["X-Osmosis-Git"] = repo
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)


@contextlib.contextmanager
def running_world(data_dir: Path, database_url: str | None = None) -> Iterator[World]:
    port = free_port()
    settings = load_settings(
        data_dir=data_dir,
        database_url=database_url,
        public_url=f"http://127.0.0.1:{port}",
        port=port,
    )
    database = open_database(settings)
    world = World(url=settings.public_url, settings=settings, database=database)
    with database.transaction() as session:
        users = {
            name: create_user(session, f"{name}@example.com", name=name.title())
            for name in ("alice", "bob", "carol")
        }
        team = create_workspace(session, "team", repo=TEAM, clone_url="/dev/null")
        other = create_workspace(session, "other", repo=OTHER, clone_url="/dev/null")
        add_member(session, team, users["alice"], role="owner")
        add_member(session, team, users["bob"], role="member")
        add_member(session, team, users["carol"], role="admin")
        add_member(session, other, users["alice"], role="owner")
        for name, user in users.items():
            issued = issue_token(
                session, user, platform_url=settings.public_url, name="test", now=utcnow()
            )
            world.tokens[name] = issued.raw
            world.user_ids[name] = user.id
        world.workspace_ids = {"team": team.id, "other": other.id}
    app = create_platform_app(settings, database=database)
    try:
        with ServerThread(app, port=port):
            yield world
    finally:
        database.dispose()
