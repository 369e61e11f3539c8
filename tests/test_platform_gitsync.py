"""Git sync against real repositories made here: a mirror per workspace, each branch's
``rollouts/<name>/main.py`` recorded with its description, moves and deletions followed."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from osmosis_ai.platform.gitsync import redact
from osmosis_ai.platform.store.orm import GitSyncEvent
from platform_support import git, write_files

REPO = "acme/agents"


@pytest.fixture
def origin(tmp_path) -> Path:
    """A repository with two branches: main (alpha, beta) and feature (alpha, gamma)."""
    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_files(
        repo,
        {
            "rollouts/alpha/main.py": "print('alpha')\n",
            "rollouts/alpha/pyproject.toml": '[project]\nname = "alpha"\n'
            'description = "Alpha solves sums"\n',
            "rollouts/beta/main.py": "print('beta')\n",
            "rollouts/beta/README.md": "\n# Beta rollout\n\nMore text.\n",
            "rollouts/notes/README.md": "no main.py: not a rollout\n",
            "rollouts/alpha/pkg/main.py": "nested: not a rollout of its own\n",
            "README.md": "workspace\n",
        },
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    git(repo, "checkout", "-q", "-b", "feature")
    git(repo, "rm", "-q", "-r", "rollouts/beta")
    write_files(repo, {"rollouts/gamma/main.py": "print('gamma')\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "gamma instead of beta")
    git(repo, "checkout", "-q", "main")
    return repo


@pytest.fixture
def member(harness, origin):
    harness.workspace("Team", repo=REPO, clone_url=str(origin))
    return harness.account("alice@example.com", workspace="Team")


async def list_rollouts(harness, member, **params):
    async with harness.client() as client:
        answer = await client.get("/api/cli/rollouts", params=params, headers=member.headers(REPO))
    assert answer.status_code == 200, answer.text
    return answer.json()


async def test_each_branch_lists_its_own_rollouts(harness, member, origin):
    main = await list_rollouts(harness, member)
    assert main["branch"] == "main"
    assert main["sync"] == {
        "status": "success",
        "message": None,
        "default_branch": "main",
        "fetched": True,
        "fetched_at": "2030-01-01T12:00:00Z",
    }
    assert [(r["name"], r["description"]) for r in main["rollouts"]] == [
        ("alpha", "Alpha solves sums"),
        ("beta", "Beta rollout"),
    ]
    head = git(origin, "rev-parse", "main")
    assert {r["last_synced_commit_sha"] for r in main["rollouts"]} == {head}
    assert all(r["repo_full_name"] == REPO and r["is_active"] for r in main["rollouts"])
    assert (main["total_count"], main["has_more"], main["next_offset"]) == (2, False, None)

    feature = await list_rollouts(harness, member, branch="feature")
    assert [r["name"] for r in feature["rollouts"]] == ["alpha", "gamma"]
    assert feature["rollouts"][0]["last_synced_commit_sha"] == git(origin, "rev-parse", "feature")

    first = await list_rollouts(harness, member, limit=1)
    assert [r["name"] for r in first["rollouts"]] == ["alpha"]
    assert (first["total_count"], first["has_more"], first["next_offset"]) == (2, True, 1)

    with harness.platform.transaction() as session:
        events = session.scalars(select(GitSyncEvent).order_by(GitSyncEvent.branch)).all()
        assert [(e.branch, e.status, e.author) for e in events] == [
            ("feature", "success", "Ada Author"),
            ("main", "success", "Ada Author"),
        ]  # the second and third calls found no branch had moved


async def test_a_push_is_picked_up_once_the_last_fetch_is_stale(harness, member, origin):
    await list_rollouts(harness, member)
    git(origin, "rm", "-q", "-r", "rollouts/beta")
    write_files(origin, {"rollouts/delta/main.py": "print('delta')\n"})
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "delta instead of beta")
    harness.clock.advance(seconds=harness.settings.git_refresh_s)
    after = await list_rollouts(harness, member)
    state = {r["name"]: r["is_active"] for r in after["rollouts"]}
    assert state == {"alpha": True, "delta": True, "beta": False}
    assert [r["name"] for r in after["rollouts"]] == ["alpha", "delta", "beta"]  # active first
    active_sha = {r["last_synced_commit_sha"] for r in after["rollouts"] if r["is_active"]}
    assert active_sha == {git(origin, "rev-parse", "main")}


async def test_a_deleted_branch_goes_inactive_and_returns_whole(harness, member, origin):
    await list_rollouts(harness, member, branch="feature")
    git(origin, "branch", "-q", "-m", "feature", "parked")
    harness.clock.advance(seconds=harness.settings.git_refresh_s)
    async with harness.client() as client:
        gone = await client.get(
            "/api/cli/rollouts", params={"branch": "feature"}, headers=member.headers(REPO)
        )
    assert gone.status_code == 404 and gone.json()["code"] == "BRANCH_NOT_FOUND"
    git(origin, "branch", "-q", "-m", "parked", "feature")  # same commit as before
    harness.clock.advance(seconds=harness.settings.git_refresh_s)
    back = await list_rollouts(harness, member, branch="feature")
    assert {r["name"]: r["is_active"] for r in back["rollouts"]} == {"alpha": True, "gamma": True}


async def test_an_explicit_sync_reports_branches_and_failures(harness, member, origin, tmp_path):
    async with harness.client() as client:
        done = await client.post("/api/cli/rollouts/sync", headers=member.headers(REPO))
        assert done.status_code == 200
        assert done.json()["default_branch"] == "main"
        assert {b["name"]: b["rollouts"] for b in done.json()["branches"]} == {
            "main": 2,
            "feature": 2,
        }

        harness.workspace("Broken", repo="acme/broken", clone_url=str(tmp_path / "missing"))
        broken = harness.account("alice@example.com", workspace="Broken")
        failed = await client.post("/api/cli/rollouts/sync", headers=broken.headers("acme/broken"))
        assert failed.status_code == 502
        assert failed.json()["code"] == "GIT_SYNC_FAILED"
        listed = await client.get("/api/cli/rollouts", headers=broken.headers("acme/broken"))
    assert listed.status_code == 200  # listing still answers from what was recorded
    assert listed.json()["rollouts"] == []
    assert listed.json()["sync"]["status"] == "failed"


async def test_credentials_in_a_clone_url_never_reach_an_answer_or_the_database(harness):
    secret_url = "http://alice:hunter2-secret@127.0.0.1:9/acme/agents.git"
    harness.workspace("Team", repo=REPO, clone_url=secret_url)
    alice = harness.account("alice@example.com", workspace="Team")
    async with harness.client() as client:
        failed = await client.post("/api/cli/rollouts/sync", headers=alice.headers(REPO))
    assert failed.status_code == 502
    assert "hunter2-secret" not in failed.text
    with harness.platform.transaction() as session:
        messages = [e.message or "" for e in session.scalars(select(GitSyncEvent))]
    assert messages and all("hunter2-secret" not in m for m in messages)


def test_redact_hides_userinfo_of_any_url():
    text = "fatal: unable to access 'https://user:p%40ss@host/x.git/' and ssh://git@h/r"
    assert redact(text) == "fatal: unable to access 'https://***@host/x.git/' and ssh://***@h/r"


def test_syncs_of_one_workspace_running_together_record_each_move_once(harness, member):
    import threading

    from osmosis_ai.platform.services.rollouts import sync_workspace

    with harness.platform.transaction() as session:
        from osmosis_ai.platform.store.orm import Workspace

        workspace_id = session.scalar(select(Workspace.id).where(Workspace.name == "Team"))
    outcomes = []
    start = threading.Barrier(4)

    def sync():
        start.wait()
        outcomes.append(
            sync_workspace(
                harness.platform.database, harness.settings, workspace_id, now=harness.clock
            )
        )

    threads = [threading.Thread(target=sync) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [o.status for o in outcomes] == ["success"] * 4
    assert sum(b.changed for o in outcomes for b in o.branches) == 2
    with harness.platform.transaction() as session:
        assert len(session.scalars(select(GitSyncEvent)).all()) == 2


async def test_listings_within_the_refresh_window_reuse_the_last_fetch(harness, member, origin):
    first = await list_rollouts(harness, member)
    assert first["sync"]["fetched"] is True
    fetched_at = first["sync"]["fetched_at"]
    git(origin, "rm", "-q", "-r", "rollouts/beta")
    git(origin, "commit", "-q", "-m", "no beta")
    harness.clock.advance(seconds=harness.settings.git_refresh_s - 0.5)
    again = await list_rollouts(harness, member)
    assert again["sync"]["fetched"] is False and again["sync"]["fetched_at"] == fetched_at
    assert [r["name"] for r in again["rollouts"] if r["is_active"]] == ["alpha", "beta"]
    feature = await list_rollouts(harness, member, branch="feature")  # branches known too
    assert [r["name"] for r in feature["rollouts"]] == ["alpha", "gamma"]
    async with harness.client() as client:
        unknown = await client.get(
            "/api/cli/rollouts", params={"branch": "nope"}, headers=member.headers(REPO)
        )
        assert unknown.status_code == 404 and unknown.json()["code"] == "BRANCH_NOT_FOUND"
        synced = await client.post("/api/cli/rollouts/sync", headers=member.headers(REPO))
    assert synced.status_code == 200  # an explicit sync always fetches
    assert {b["name"]: b["changed"] for b in synced.json()["branches"]}["main"] is True
    after = await list_rollouts(harness, member)
    assert after["sync"]["fetched"] is False
    assert [r["name"] for r in after["rollouts"] if r["is_active"]] == ["alpha"]


async def test_a_failed_fetch_is_not_reused(harness, member, origin, tmp_path):
    await list_rollouts(harness, member)
    harness.clock.advance(seconds=harness.settings.git_refresh_s)
    origin.rename(tmp_path / "moved")
    failed = await list_rollouts(harness, member)
    assert failed["sync"]["status"] == "failed" and failed["sync"]["fetched"] is True
    (tmp_path / "moved").rename(origin)
    retried = await list_rollouts(harness, member)  # no clock move: the failure is not cached
    assert retried["sync"]["status"] == "success" and retried["sync"]["fetched"] is True


async def test_a_clock_that_went_back_fetches_again(harness, member):
    await list_rollouts(harness, member)
    harness.clock.advance(seconds=-60)
    assert (await list_rollouts(harness, member))["sync"]["fetched"] is True


def test_many_listings_at_once_fetch_once(harness, member, origin, monkeypatch):
    import threading
    from datetime import timedelta

    from osmosis_ai.platform import gitsync
    from osmosis_ai.platform.services.rollouts import sync_workspace
    from osmosis_ai.platform.store.orm import Workspace

    with harness.platform.read() as session:
        workspace_id = session.scalar(select(Workspace.id).where(Workspace.name == "Team"))
    fetches = []
    real_fetch = gitsync.fetch

    def counting_fetch(*args, **kwargs):
        fetches.append(args[0])
        return real_fetch(*args, **kwargs)

    monkeypatch.setattr(gitsync, "fetch", counting_fetch)
    outcomes = []
    start = threading.Barrier(8)

    def listing():
        start.wait()
        outcomes.append(
            sync_workspace(
                harness.platform.database,
                harness.settings,
                workspace_id,
                now=harness.clock,
                max_age=timedelta(seconds=5),
            )
        )

    threads = [threading.Thread(target=listing) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fetches == [str(origin)]
    assert sorted(o.fetched for o in outcomes) == [False] * 7 + [True]
    assert all(o.status == "success" and o.default_branch == "main" for o in outcomes)
    assert {b.name for o in outcomes for b in o.branches} == {"main", "feature"}


def test_the_refresh_window_is_configurable_and_checked(tmp_path, monkeypatch):
    from osmosis_ai.errors import ConfigError
    from osmosis_ai.platform.settings import GIT_REFRESH_ENV, load_settings

    assert load_settings(data_dir=tmp_path).git_refresh_s == 5.0
    monkeypatch.setenv(GIT_REFRESH_ENV, "0")
    assert load_settings(data_dir=tmp_path).git_refresh_s == 0.0
    assert load_settings(data_dir=tmp_path, git_refresh_s=30).git_refresh_s == 30.0
    monkeypatch.setenv(GIT_REFRESH_ENV, "soon")
    with pytest.raises(ConfigError, match=GIT_REFRESH_ENV):
        load_settings(data_dir=tmp_path)
    with pytest.raises(ConfigError, match="0 to 86400"):
        load_settings(data_dir=tmp_path, git_refresh_s=-1)


async def test_a_bare_remote_whose_head_names_no_pushed_branch_lists_the_pushed_one(
    harness, tmp_path
):
    """``git init --bare`` leaves HEAD on ``master``; the work was pushed to ``main``."""
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    write_files(work, {"rollouts/alpha/main.py": "print('alpha')\n"})
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "first")
    bare = tmp_path / "remote.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "master", str(bare))
    git(work, "push", "-q", str(bare), "main")
    harness.workspace("Bare", repo="acme/bare", clone_url=str(bare))
    member = harness.account("bob@example.com", workspace="Bare")
    async with harness.client() as client:
        answer = await client.get("/api/cli/rollouts", headers=member.headers("acme/bare"))
    assert answer.status_code == 200, answer.text
    listing = answer.json()
    assert (listing["branch"], listing["sync"]["default_branch"]) == ("main", "main")
    assert [r["name"] for r in listing["rollouts"]] == ["alpha"]
