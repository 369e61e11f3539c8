"""``/api/cli/environment-secrets`` over real HTTP, run-time resolution, and the rule that a
value never appears in an answer, a log line, an error or a file in the clear."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("sqlalchemy")

from osmosis_ai.errors import ConfigError
from osmosis_ai.platform.crypto import SecretBox, secret_key
from osmosis_ai.platform.services.secrets import (
    MissingRunSecretsError,
    resolve_secret_scopes,
    resolve_secrets,
)
from platform_world import OTHER, running_world

PATH = "/api/cli/environment-secrets"
METADATA = {"id", "name", "scope", "created_at", "updated_at", "creator_name", "updater_name"}


@pytest.fixture
def world(tmp_path, database_url, monkeypatch):
    monkeypatch.delenv("OSMOSIS_PLATFORM_SECRET_KEY", raising=False)
    with running_world(tmp_path / "data", database_url) as running:
        yield running


def put(client, name, value, scope):
    return client.post(PATH, json={"name": name, "value": value, "scope": scope})


def names(answer, scope=None):
    return sorted(
        (s["name"], s["scope"])
        for s in answer.json()["environment_secrets"]
        if scope is None or s["scope"] == scope
    )


def test_set_list_delete_with_scopes_and_roles(world):
    with world.client("bob") as bob, world.client("carol") as carol, world.client() as alice:
        mine = put(bob, "OPENAI_API_KEY", "sk-bob-1", "user")
        assert mine.status_code == 200, mine.text
        assert set(mine.json()) == METADATA and mine.json()["creator_name"] == "Bob"

        refused = put(bob, "SHARED_TOKEN", "tok-1", "workspace")
        assert refused.status_code == 403
        assert refused.json()["code"] == "WORKSPACE_ADMIN_REQUIRED"

        shared = put(carol, "SHARED_TOKEN", "tok-1", "workspace").json()
        updated = put(alice, "SHARED_TOKEN", "tok-2", "workspace").json()
        assert updated["id"] == shared["id"]
        assert (updated["creator_name"], updated["updater_name"]) == ("Carol", "Alice")
        assert put(alice, "OPENAI_API_KEY", "sk-alice", "user").status_code == 200

        assert names(bob.get(PATH)) == [("OPENAI_API_KEY", "user"), ("SHARED_TOKEN", "workspace")]
        assert names(bob.get(PATH, params={"scope": "workspace"})) == [
            ("SHARED_TOKEN", "workspace")
        ]
        page = bob.get(PATH, params={"scope": "user"}).json()
        assert [s["name"] for s in page["environment_secrets"]] == ["OPENAI_API_KEY"]
        assert (page["total_count"], page["has_more"], page["next_offset"]) == (1, False, None)
        first = bob.get(PATH, params={"limit": 1}).json()
        assert (first["total_count"], first["has_more"], first["next_offset"]) == (2, True, 1)

        bad_scope = bob.get(PATH, params={"scope": "personal"})
        assert bad_scope.status_code == 400 and bad_scope.json()["field"] == "scope"

        forbidden = bob.request("DELETE", PATH, json={"name": "SHARED_TOKEN", "scope": "workspace"})
        assert forbidden.status_code == 403
        gone = bob.request("DELETE", PATH, json={"name": "OPENAI_API_KEY", "scope": "user"})
        assert gone.status_code == 200 and set(gone.json()) == METADATA
        again = bob.request("DELETE", PATH, json={"name": "OPENAI_API_KEY", "scope": "user"})
        assert again.status_code == 404 and again.json()["code"] == "SECRET_NOT_FOUND"
        # alice's personal secret of the same name is hers and still there
        assert names(alice.get(PATH, params={"scope": "user"})) == [("OPENAI_API_KEY", "user")]

    with world.client("alice", repo=OTHER) as elsewhere:
        assert elsewhere.get(PATH).json()["environment_secrets"] == []


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"name": "1BAD", "value": "v", "scope": "user"}, "name"),
        ({"name": "A-B", "value": "v", "scope": "user"}, "name"),
        ({"name": "OK", "value": "", "scope": "user"}, "value"),
        ({"name": "OK", "value": "v" * 70_000, "scope": "user"}, "value"),
        ({"name": "OK", "value": "v", "scope": "personal"}, "scope"),
        ({"name": "OK", "value": 5, "scope": "user"}, "value"),
        ({"name": "OK", "value": "v", "scope": "user", "note": "x"}, "note"),
        ({"name": "OK", "scope": "user"}, "value"),
    ],
)
def test_bad_set_bodies_are_400_naming_the_field(world, payload, field):
    with world.client() as alice:
        answer = alice.post(PATH, json=payload)
    assert answer.status_code == 400, answer.text
    assert answer.json()["field"] == field


def test_resolution_prefers_given_then_personal_then_workspace(world):
    with world.client("carol") as carol, world.client("bob") as bob:
        put(carol, "API_KEY", "workspace-value", "workspace")
        put(carol, "OTHER_KEY", "other-workspace", "workspace")
        put(bob, "API_KEY", "bob-personal", "user")
    box = SecretBox(secret_key(world.settings.data_dir))
    team = world.workspace_ids["team"]
    with world.database.transaction() as session:
        bob_id, carol_id = world.user_ids["bob"], world.user_ids["carol"]
        wanted = ["API_KEY", "OTHER_KEY"]
        assert resolve_secrets(session, team, bob_id, wanted, box=box) == {
            "API_KEY": "bob-personal",
            "OTHER_KEY": "other-workspace",
        }
        assert resolve_secrets(session, team, carol_id, wanted, box=box) == {
            "API_KEY": "workspace-value",
            "OTHER_KEY": "other-workspace",
        }
        given = {"API_KEY": "from-the-run"}
        assert resolve_secrets(session, team, bob_id, wanted, box=box, provided=given) == {
            "API_KEY": "from-the-run",
            "OTHER_KEY": "other-workspace",
        }
        assert resolve_secret_scopes(session, team, bob_id, wanted) == {
            "API_KEY": "user",
            "OTHER_KEY": "workspace",
        }
        with pytest.raises(MissingRunSecretsError) as caught:
            resolve_secrets(session, team, bob_id, ["API_KEY", "NOPE", "ALSO_NOPE"], box=box)
        assert caught.value.details == {"missing": ["NOPE", "ALSO_NOPE"]}
        assert "bob-personal" not in str(caught.value)
        other = world.workspace_ids["other"]
        with pytest.raises(MissingRunSecretsError):
            resolve_secrets(session, other, bob_id, ["API_KEY"], box=box)


def test_a_changed_key_is_a_named_error_without_the_value(world):
    with world.client() as alice:
        put(alice, "API_KEY", "sk-very-secret", "user")
    wrong = SecretBox(secret_key(world.settings.data_dir / "elsewhere"))
    with world.database.transaction() as session, pytest.raises(ConfigError) as caught:
        resolve_secrets(
            session, world.workspace_ids["team"], world.user_ids["alice"], ["API_KEY"], box=wrong
        )
    assert "OSMOSIS_PLATFORM_SECRET_KEY" in str(caught.value)
    assert "sk-very-secret" not in str(caught.value)


class Collector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


def test_values_never_reach_answers_logs_or_files(world):
    values = [f"sk-leak-check-{i}-7f3a9c" for i in range(4)]
    collector = Collector()
    loggers = [logging.getLogger(n) for n in ("", "sqlalchemy.engine", "uvicorn", "osmosis_ai")]
    saved = [(lg, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(collector)
        lg.setLevel(logging.DEBUG)
    answers: list[str] = []
    try:
        with world.client("bob") as bob, world.client("carol") as carol:
            answers.append(put(bob, "KEY_A", values[0], "user").text)
            answers.append(put(carol, "KEY_B", values[1], "workspace").text)
            answers.append(put(bob, "KEY_B", values[2], "workspace").text)  # 403
            answers.append(put(bob, "bad-name", values[3], "user").text)  # 400
            answers.append(put(bob, "KEY_C", values[3], "nowhere").text)  # 400
            answers.append(bob.post(PATH, json={"name": "K", "value": values[3], "x": 1}).text)
            answers.append(bob.get(PATH).text)
            answers.append(
                bob.request("DELETE", PATH, json={"name": "KEY_A", "scope": "user"}).text
            )
            box = SecretBox(secret_key(world.settings.data_dir))
            with world.database.transaction() as session:
                resolved = resolve_secrets(
                    session, world.workspace_ids["team"], world.user_ids["bob"], ["KEY_B"], box=box
                )
            assert resolved == {"KEY_B": values[1]}
    finally:
        for lg, level in saved:
            lg.removeHandler(collector)
            lg.setLevel(level)
    assert any("INSERT INTO secrets" in line for line in collector.lines)  # SQL was logged
    logs = "\n".join(collector.lines)
    for value in values:
        assert all(value not in answer for answer in answers), value
        assert value not in logs, value
        for path in world.settings.data_dir.rglob("*"):
            if path.is_file():
                assert value.encode() not in path.read_bytes(), (value, path)
