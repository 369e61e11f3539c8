"""The dashboard at ``/``, server side: sign-in and its cookies, CSRF, every page for a member,
signed-out and non-member answers, escaping of hostile strings, chart data (CSV, downsampling),
deploy from a checkpoint, a browser-style dataset upload, logs after a cursor."""

from __future__ import annotations

import csv
import io
import re
from urllib.parse import quote, urlsplit

import pytest
from sqlalchemy import select

from dashboard_world import (
    TRAINING_CHARTS,
    XSS,
    reward_at,
    seed_dataset,
    seed_eval,
    seed_training,
)
from osmosis_ai.platform.store.orm import Dataset, Model
from osmosis_ai.platform.web.charts import histogram, lttb
from platform_support import Harness

CSRF_FIELD = re.compile(r'name="csrf" value="([^"]+)"')
CSRF_META = re.compile(r'<meta name="csrf-token" content="([^"]+)">')
WS = "Team Alpha"
BASE = f"/w/{quote(WS, safe='')}"


def csrf_of(page: str) -> str:
    found = CSRF_FIELD.search(page) or CSRF_META.search(page)
    assert found, page[:500]
    return found.group(1)


async def sign_in(client, account) -> None:
    page = await client.get("/login")
    answer = await client.post(
        "/login",
        data={
            "csrf": csrf_of(page.text),
            "email": account.email,
            "token": account.token,
            "next": BASE + "/runs",
        },
    )
    assert answer.status_code == 303, answer.text
    assert answer.headers["location"] == BASE + "/runs"


@pytest.fixture
def world(tmp_path):
    harness = Harness(tmp_path / "data", f"sqlite:///{tmp_path / 'platform.db'}")
    harness.workspace(WS, "acme/alpha")
    harness.workspace("Other", "acme/other")
    alice = harness.account("alice@example.com", workspace=WS, role="owner")
    outsider = harness.account("mallory@example.com", workspace="Other")
    training = seed_training(
        harness.platform, _ws_id(harness, WS), alice.user_id, steps=60, checkpoints=(30, 60)
    )
    evaluation = seed_eval(harness.platform, _ws_id(harness, WS), alice.user_id, samples=30, n=2)
    other_eval = seed_eval(
        harness.platform,
        _ws_id(harness, WS),
        alice.user_id,
        name="second-look",
        samples=30,
        n=2,
        shift=1,
    )
    yield {
        "harness": harness,
        "alice": alice,
        "outsider": outsider,
        "training": training,
        "eval": evaluation,
        "other_eval": other_eval,
    }
    harness.close()


def _ws_id(harness: Harness, name: str) -> str:
    from osmosis_ai.platform.store.orm import Workspace

    with harness.platform.read() as db:
        found = db.scalar(select(Workspace.id).where(Workspace.name == name))
    assert found is not None
    return found


# --- signing in and out ----------------------------------------------------------------------


async def test_signed_out_pages_redirect_to_login_and_data_answers_401(world):
    harness = world["harness"]
    async with harness.client() as client:
        home = await client.get("/")
        assert home.status_code == 303 and home.headers["location"] == "/login"
        page = await client.get(BASE + "/runs?status=running")
        assert page.status_code == 303
        assert page.headers["location"] == "/login?next=" + quote(
            BASE + "/runs?status=running", safe=""
        )
        for url in (
            f"{BASE}/trainings/{world['training'].id}/metrics.json",
            f"{BASE}/trainings/{world['training'].id}/metrics.csv?key=training_reward",
            f"{BASE}/runs/status.json?ids={world['training'].id}",
            f"{BASE}/runs/training/{world['training'].id}/logs.json",
        ):
            answer = await client.get(url)
            assert answer.status_code == 401, url
        login = await client.get("/login")
        assert login.status_code == 200 and 'data-test="login-form"' in login.text


async def test_sign_in_sets_a_strict_httponly_session_cookie_and_sign_out_clears_it(world):
    harness, alice = world["harness"], world["alice"]
    async with harness.client() as client:
        page = await client.get("/login")
        assert "httponly" in page.headers["set-cookie"].lower()
        answer = await client.post(
            "/login",
            data={"csrf": csrf_of(page.text), "email": alice.email.upper(), "token": alice.token},
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/"
        cookie = answer.headers["set-cookie"].lower()
        assert cookie.startswith("osmosis_session=")
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/" in cookie
        assert "secure" not in cookie  # the public URL is http
        home = await client.get("/")
        assert home.status_code == 303 and home.headers["location"] == BASE + "/runs"
        runs = await client.get(BASE + "/runs")
        assert runs.status_code == 200 and alice.email in runs.text
        out = await client.post("/logout", data={"csrf": csrf_of(runs.text)})
        assert out.status_code == 303
        again = await client.get(BASE + "/runs")
        assert again.status_code == 303 and again.headers["location"].startswith("/login")


async def test_wrong_token_or_wrong_email_is_refused(world):
    harness, alice, outsider = world["harness"], world["alice"], world["outsider"]
    async with harness.client() as client:
        page = await client.get("/login")
        token = csrf_of(page.text)
        wrong = await client.post(
            "/login", data={"csrf": token, "email": alice.email, "token": "osm_nope"}
        )
        assert wrong.status_code == 401 and 'data-test="login-error"' in wrong.text
        other = await client.post(
            "/login", data={"csrf": token, "email": alice.email, "token": outsider.token}
        )
        assert other.status_code == 401 and "does not belong" in other.text
        assert "osmosis_session" not in client.cookies


async def test_the_session_cookie_is_secure_behind_https(tmp_path):
    harness = Harness(
        tmp_path / "data", f"sqlite:///{tmp_path / 'p.db'}", public_url="https://platform.example"
    )
    try:
        harness.workspace(WS, "acme/alpha")
        alice = harness.account("alice@example.com", workspace=WS)
        async with harness.client() as client:
            page = await client.get("/login")
            assert "secure" in page.headers["set-cookie"].lower()
            answer = await client.post(
                "/login",
                data={"csrf": csrf_of(page.text), "email": alice.email, "token": alice.token},
            )
            assert answer.status_code == 303
            assert "secure" in answer.headers["set-cookie"].lower()
    finally:
        harness.close()


async def test_a_redirect_after_sign_in_stays_on_this_site(world):
    harness, alice = world["harness"], world["alice"]
    async with harness.client() as client:
        page = await client.get("/login?next=https://evil.example/x")
        assert 'value="https://evil.example/x"' not in page.text
        answer = await client.post(
            "/login",
            data={
                "csrf": csrf_of(page.text),
                "email": alice.email,
                "token": alice.token,
                "next": "//evil.example",
            },
        )
        assert answer.headers["location"] == "/"


async def test_revoking_the_session_token_signs_the_browser_out(world):
    harness, alice = world["harness"], world["alice"]
    async with harness.client() as client:
        await sign_in(client, alice)
        members = await client.get(BASE + "/members")
        assert 'data-test="current-token"' in members.text
        revoked = await client.post(
            f"{BASE}/tokens/{alice.token_id}/revoke",
            data={"csrf": csrf_of(members.text), "next": BASE + "/members"},
        )
        assert revoked.status_code == 303
        after = await client.get(BASE + "/members")
        assert after.status_code == 303 and after.headers["location"].startswith("/login")


# --- CSRF ------------------------------------------------------------------------------------


async def test_state_changes_without_a_valid_csrf_token_are_refused(world):
    harness, alice = world["harness"], world["alice"]
    async with harness.client() as client:
        login = await client.get("/login")
        missing = await client.post("/login", data={"email": alice.email, "token": alice.token})
        assert missing.status_code == 403 and missing.json()["code"] == "CSRF_INVALID"
        foreign = await client.post(
            "/login",
            data={"csrf": csrf_of(login.text), "email": alice.email, "token": alice.token},
            headers={"Origin": "https://evil.example"},
        )
        assert foreign.status_code == 403 and foreign.json()["code"] == "CSRF_ORIGIN"
        await sign_in(client, alice)
        model = f"{world['training'].name}-step-30"
        forged = await client.post(
            f"{BASE}/deployments", data={"csrf": "forged", "model": model, "action": "deploy"}
        )
        assert forged.status_code == 403
        no_header = await client.post(
            f"{BASE}/datasets/upload", json={"file_name": "a.jsonl", "file_size": 3}
        )
        assert no_header.status_code == 403
        out = await client.post("/logout", data={})
        assert out.status_code == 403
    with harness.platform.read() as db:
        assert db.scalar(select(Model.deployment_status).where(Model.name == model)) == "inactive"


# --- pages -----------------------------------------------------------------------------------


async def test_every_page_renders_for_a_member(world):
    harness, alice = world["harness"], world["alice"]
    training, evaluation = world["training"], world["eval"]
    pages = {
        "/runs": 'data-test="runs-table"',
        f"/trainings/{training.name}": 'data-test="chart-truncation_ratio"',
        f"/evals/{evaluation.name}": 'data-test="samples-table"',
        f"/evals/{evaluation.name}/samples/1/0": 'data-test="conversation"',
        "/datasets": 'data-test="upload"',
        "/models": 'data-test="lora-models"',
        "/secrets": "Names only",
        "/members": 'data-test="members-table"',
    }
    async with harness.client() as client:
        await sign_in(client, alice)
        for path, marker in pages.items():
            answer = await client.get(BASE + path)
            assert answer.status_code == 200, (path, answer.text[:300])
            assert marker in answer.text, path
            assert "script-src 'self'" in answer.headers["content-security-policy"]
            assert answer.headers["x-frame-options"] == "DENY"
        static = await client.get("/static/vendor/uplot/uPlot.iife.min.js")
        assert static.status_code == 200 and static.headers["content-type"].startswith(
            "text/javascript"
        )
        assert "uPlot" in static.text
        assert (await client.get("/static/../session.py")).status_code == 404


async def test_a_workspace_the_person_is_not_in_answers_404(world):
    harness, outsider = world["harness"], world["outsider"]
    async with harness.client() as client:
        page = await client.get("/login")
        await client.post(
            "/login",
            data={"csrf": csrf_of(page.text), "email": outsider.email, "token": outsider.token},
        )
        for path in (
            "/runs",
            f"/trainings/{world['training'].name}",
            f"/evals/{world['eval'].name}",
        ):
            answer = await client.get(BASE + path)
            assert answer.status_code == 404, path
        data = await client.get(f"{BASE}/trainings/{world['training'].id}/metrics.json")
        assert data.status_code == 404


async def test_runs_filter_by_kind_status_rollout_and_creator_and_report_live_status(world):
    harness, alice = world["harness"], world["alice"]
    async with harness.client() as client:
        await sign_in(client, alice)
        every = await client.get(BASE + "/runs")
        assert every.text.count('data-test="run-row"') == 3
        trainings = await client.get(BASE + "/runs?kind=training")
        assert trainings.text.count('data-test="run-row"') == 1
        assert world["training"].name in trainings.text
        running = await client.get(BASE + "/runs?status=running")
        assert running.text.count('data-test="run-row"') == 1
        none = await client.get(BASE + "/runs?rollout=elsewhere")
        assert 'data-test="runs-empty"' in none.text
        mine = await client.get(f"{BASE}/runs?creator={alice.user_id}")
        assert mine.text.count('data-test="run-row"') == 3
        ids = f"{world['training'].id},{world['eval'].id}"
        status = (await client.get(f"{BASE}/runs/status.json?ids={ids}")).json()
        assert (
            status[world["training"].id]["status"] == "running"
            and status[world["training"].id]["active"]
        )
        assert (
            status[world["eval"].id]["status"] == "finished"
            and not status[world["eval"].id]["active"]
        )


async def test_training_page_shows_overview_checkpoints_config_and_commit(world):
    harness, alice, training = world["harness"], world["alice"], world["training"]
    async with harness.client() as client:
        await sign_in(client, alice)
        page = (await client.get(f"{BASE}/trainings/{training.name}")).text
    for name in TRAINING_CHARTS:
        assert f'data-test="chart-{name}"' in page and f'data-test="csv-{name}"' in page
    latest = reward_at(60, 60)
    improvement = latest - reward_at(1, 60)
    assert f"{latest:.3f}" in page and f"+{improvement:.3f}" in page
    assert 'data-test="deploy-30"' in page and 'data-test="deploy-60"' in page
    assert "0123456789abcdef0123456789abcdef01234567" in page
    assert "n_samples_per_prompt" in page and "OPENAI_API_KEY" in page
    assert 'data-active="true"' in page  # a running training polls


async def test_chart_data_is_downsampled_and_the_csv_holds_every_point(world):
    harness, alice = world["harness"], world["alice"]
    big = seed_training(
        harness.platform, _ws_id(harness, WS), alice.user_id, name="long-haul", steps=3000
    )
    async with harness.client() as client:
        await sign_in(client, alice)
        payload = (await client.get(f"{BASE}/trainings/{big.name}/metrics.json?points=200")).json()
        csv_answer = await client.get(
            f"{BASE}/trainings/{big.name}/metrics.csv?key=training_reward"
        )
    charts = {c["name"]: c for c in payload["charts"]}
    reward = charts["training_reward"]
    assert reward["count"] == 3000 and len(reward["steps"]) == 200
    assert reward["steps"][0] == 1 and reward["steps"][-1] == 3000
    assert reward["steps"] == sorted(reward["steps"])
    assert charts["validation_reward"]["count"] == 300
    assert set(TRAINING_CHARTS) <= set(charts)
    assert csv_answer.status_code == 200 and csv_answer.headers["content-type"].startswith(
        "text/csv"
    )
    assert "attachment" in csv_answer.headers["content-disposition"]
    rows = list(csv.reader(io.StringIO(csv_answer.text)))
    assert rows[0] == ["step", "training_reward", "timestamp"]
    assert len(rows) == 3001
    assert int(rows[1][0]) == 1 and float(rows[1][1]) == pytest.approx(reward_at(1, 3000))
    assert rows[-1][0] == "3000" and rows[-1][2].endswith("Z")


async def test_every_logged_metric_gets_a_chart_in_its_group_and_the_first_group_alone(world):
    harness, alice = world["harness"], world["alice"]
    run = seed_training(
        harness.platform,
        _ws_id(harness, WS),
        alice.user_id,
        name="grouped-wren",
        steps=40,
        no_signal=7,
        warnings=("rollout server slow: 3 rollouts past 60 s",),
    )
    async with harness.client() as client:
        await sign_in(client, alice)
        page = (await client.get(f"{BASE}/trainings/{run.name}")).text
        payload = (await client.get(f"{BASE}/trainings/{run.name}/metrics.json")).json()
        first = (
            await client.get(
                f"{BASE}/trainings/{run.name}/metrics.json?keys=training_reward,validation_reward"
            )
        ).json()
    groups = {c["name"]: c["group"] for c in payload["charts"]}
    assert groups["loss"] == groups["grad_norm"] == groups["learning_rate"] == "Optimization"
    assert groups["kl"] == groups["clip_ratio"] == groups["entropy"] == "Policy"
    assert groups["response_length"] == groups["total_length"] == "Lengths"
    assert groups["tokens_per_s"] == groups["step_seconds"] == "Throughput and step time"
    assert groups["training_reward"] == groups["validation_reward"] == "Reward and validation"
    order = [c["group"] for c in payload["charts"]]
    assert (
        order.index("Reward and validation")
        < order.index("Optimization")
        < order.index("Policy")
        < order.index("Lengths")
        < order.index("Throughput and step time")
    )
    for name in groups:  # every metric in the answer has its chart on the page
        assert f'data-test="chart-{name}"' in page and f'data-test="readout-{name}"' in page
    assert page.index('data-test="chart-training_reward"') < page.index('data-test="chart-loss"')
    clip = next(c for c in payload["charts"] if c["name"] == "clip_ratio")
    assert clip["min"] == clip["max"] == 0.0 and clip["count"] == 40
    assert [c["name"] for c in first["charts"]] == ["training_reward", "validation_reward"]
    assert 'data-first-keys="rollout/raw_reward"' in page
    # no learning signal and the warnings at the top, before the facts
    assert 'data-test="notice-no-signal"' in page and "last 7 steps" in page
    assert "rollout server slow: 3 rollouts past 60 s" in page
    assert page.index('data-test="run-notices"') < page.index('class="facts"')
    assert 'data-test="smoothing"' in page


async def test_eval_failed_card_matches_the_failures_filter_and_compare_prefers_the_dataset(
    world,
):
    harness, alice = world["harness"], world["alice"]
    ws = _ws_id(harness, WS)
    run = seed_eval(harness.platform, ws, alice.user_id, name="card-check", samples=12)
    seed_eval(harness.platform, ws, alice.user_id, name="other-data", samples=4, dataset="gsm8k")
    seed_eval(harness.platform, ws, alice.user_id, name="same-data", samples=4)
    broken = seed_eval(
        harness.platform, ws, alice.user_id, name="broke-early", samples=0, status="failed"
    )
    async with harness.client() as client:
        await sign_in(client, alice)
        page = (await client.get(f"{BASE}/evals/{run.name}")).text
        failures = (await client.get(f"{BASE}/evals/{run.name}?show=failures")).text
        errors = (await client.get(f"{BASE}/evals/{run.name}?show=errors")).text
        compared = (await client.get(f"{BASE}/evals/{run.name}?compare=other-data")).text
        failed_page = (await client.get(f"{BASE}/evals/{broken.name}")).text

    def card(html: str, field: str) -> str:
        found = re.search(rf'data-field="{field}"[^>]*>([^<]*)<', html)
        assert found, field
        return found.group(1).strip()

    listed = failures.count('data-test="sample-row"')
    assert listed == 4  # rows 0, 3, 6, 9 score 0
    assert card(page, "failed") == str(listed)
    assert card(page, "errors") == str(errors.count('data-test="sample-row"')) == "2"
    assert card(page, "passed") == "8 / 12"
    assert "1.0s" in page and ">0s<" not in page  # per-sample durations (1000 ms + row)
    assert 'data-test="samples-legend"' in page and "dataset row" in page
    # compare: same dataset first, the others after a divider with their dataset named
    options = re.findall(r'data-same-dataset="(true|false)"[^>]*>([^<]*)<', page)
    flags = [same for same, _ in options]
    assert flags == sorted(flags, reverse=True) and "false" in flags, options
    assert any(name.startswith("other-data (gsm8k)") for _, name in options)
    assert 'data-test="compare-dataset-differs"' in compared and "gsm8k" in compared
    # a failed run with nothing completed shows no 0.0 % cards
    assert 'data-test="no-results"' in failed_page and "0.0%" not in failed_page


async def test_runs_list_shows_duration_result_progress_and_why_a_run_failed(world):
    harness, alice = world["harness"], world["alice"]
    ws = _ws_id(harness, WS)
    evaluation = seed_eval(harness.platform, ws, alice.user_id, name="list-eval", samples=9)
    broken = seed_training(
        harness.platform,
        ws,
        alice.user_id,
        name="list-broken",
        steps=4,
        total_steps=10,
        status="failed",
        error="NoLearningSignalError: no learning signal for 3 steps in a row",
    )
    async with harness.client() as client:
        await sign_in(client, alice)
        page = (await client.get(f"{BASE}/runs")).text
        status = (
            await client.get(f"{BASE}/runs/status.json?ids={evaluation.id},{broken.id}")
        ).json()

    def row(run_id: str) -> str:
        start = page.index(f'data-run-id="{run_id}"')
        return page[start : page.index("</tr>", start)]

    eval_row, training_row = row(evaluation.id), row(broken.id)
    assert "66.7%" in eval_row and "pass rate" in eval_row  # rows 0, 3, 6 of 9 score 0
    assert "9 / 9" in eval_row and "(100%)" in eval_row
    assert "4 / 10" in training_row and "(40%)" in training_row
    assert "50m 00s" in eval_row  # started 50 minutes before completion
    assert 'data-test="run-failure"' in training_row and "NoLearningSignalError" in training_row
    assert 'data-test="run-failure"' not in eval_row
    assert status[broken.id]["progress"] == {"done": 4, "total": 10, "percent": 40}
    assert status[evaluation.id]["result_kind"] == "pass rate"
    assert status[broken.id]["error"].startswith("NoLearningSignalError")


async def test_models_page_says_lora_only_for_adapters_and_shows_base_paths(world, tmp_path):
    harness, alice, training = world["harness"], world["alice"], world["training"]
    adapter, full = tmp_path / "adapter", tmp_path / "full"
    adapter.mkdir()
    full.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (full / "config.json").write_text('{"model_type": "qwen3"}')
    with harness.platform.transaction() as db:
        trained = list(db.scalars(select(Model).where(Model.training_run_id == training.id)))
        by_step = {m.checkpoint_step: m for m in trained}
        by_step[30].path, by_step[60].path = str(adapter), str(full)
        db.add(Model(kind="base", name="qwen-small", path="/srv/models/Qwen3-0.6B"))
    async with harness.client() as client:
        await sign_in(client, alice)
        page = (await client.get(BASE + "/models")).text

    def row(name: str) -> str:
        start = page.index(f'data-model="{name}"')
        return page[start : page.index("</tr>", start)]

    assert "Trained models (LoRA)" not in page
    assert "LoRA adapter" in row(by_step[30].name) and "full weights" not in row(by_step[30].name)
    assert "full weights" in row(by_step[60].name) and "LoRA" not in row(by_step[60].name)
    assert "Qwen/Qwen3-0.6B" in row(by_step[60].name)  # the base the run trained from
    assert "<code>/srv/models/Qwen3-0.6B</code>" in page  # a base model's real path


async def test_a_sample_shows_its_rows_expected_answer_beside_the_models(world):
    harness, alice, evaluation = world["harness"], world["alice"], world["eval"]
    seed_dataset(harness.platform, _ws_id(harness, WS), alice.user_id, rows=30, preview=5)
    async with harness.client() as client:
        await sign_in(client, alice)
        in_preview = (await client.get(f"{BASE}/evals/{evaluation.id}/samples/4/1")).text
        from_file = (await client.get(f"{BASE}/evals/{evaluation.id}/samples/17/0")).text
        first = (await client.get(f"{BASE}/evals/{evaluation.id}/samples/0/0")).text
    expected = re.compile(r'data-test="expected-answer">([^<]*)<')
    model = re.compile(r'data-test="model-answer">([^<]*)<')
    assert expected.findall(in_preview) == ["8"] and model.findall(in_preview) == ["#### 8"]
    assert expected.findall(from_file) == ["34"]  # row 17: past the preview, read from the file
    # previous / next step through (row, run) in order; the first sample has no previous
    assert "/samples/4/0" in in_preview and "/samples/5/0" in in_preview
    assert 'data-test="sample-previous"' not in first and "/samples/0/1" in first


def test_sample_durations_under_a_second_are_not_zero():
    from osmosis_ai.platform.web.render import environment

    show = environment().filters["duration"]
    assert show(340) == "340 ms" and show(1500) == "1.5s" and show(65_000) == "1m 05s"


def test_lttb_keeps_the_ends_and_the_peaks():
    points = [(i, 0.0) for i in range(1000)]
    points[500] = (500, 10.0)
    points[700] = (700, -10.0)
    kept = lttb(points, 50)
    assert len(kept) == 50
    assert kept[0] == (0, 0.0) and kept[-1] == (999, 0.0)
    assert (500, 10.0) in kept and (700, -10.0) in kept
    assert lttb(points[:10], 50) == points[:10]
    assert histogram([0.0, 0.0, 1.0, 0.55])["counts"] == [2, 0, 0, 0, 0, 1, 0, 0, 0, 1]


async def test_deploy_and_undeploy_a_checkpoint_from_the_training_page(world):
    harness, alice, training = world["harness"], world["alice"], world["training"]
    model = f"{training.name}-step-30"
    async with harness.client() as client:
        await sign_in(client, alice)
        page = await client.get(f"{BASE}/trainings/{training.name}")
        here = f"{BASE}/trainings/{training.name}"
        deployed = await client.post(
            f"{BASE}/deployments",
            data={"csrf": csrf_of(page.text), "next": here, "model": model, "action": "deploy"},
        )
        assert deployed.status_code == 303 and deployed.headers["location"] == here
        after = (await client.get(here)).text
        assert 'data-test="undeploy-30"' in after
        models = (await client.get(BASE + "/models")).text
        assert 'data-test="undeploy-model"' in models
        with harness.platform.read() as db:
            assert db.scalar(select(Model.deployment_status).where(Model.name == model)) == "active"
        undone = await client.post(
            f"{BASE}/deployments",
            data={"csrf": csrf_of(after), "next": here, "model": model, "action": "undeploy"},
        )
        assert undone.status_code == 303
    with harness.platform.read() as db:
        assert db.scalar(select(Model.deployment_status).where(Model.name == model)) == "inactive"


async def test_logs_come_after_a_cursor(world):
    harness, alice, training = world["harness"], world["alice"], world["training"]
    async with harness.client() as client:
        await sign_in(client, alice)
        first = (await client.get(f"{BASE}/runs/training/{training.id}/logs.json")).json()
        assert [line["message"] for line in first["lines"]] == [
            f"step {i} done" for i in range(1, 6)
        ]
        later = (
            await client.get(
                f"{BASE}/runs/training/{training.id}/logs.json?after={first['cursor']}"
            )
        ).json()
        assert later["lines"] == [] and later["cursor"] == first["cursor"] and later["active"]


async def test_eval_page_shows_pass_rate_pass_at_k_and_sorts_and_filters_samples(world):
    harness, alice, evaluation = world["harness"], world["alice"], world["eval"]
    async with harness.client() as client:
        await sign_in(client, alice)
        page = (await client.get(f"{BASE}/evals/{evaluation.name}")).text
        assert 'data-test="pass-at-k"' in page and 'id="histogram-data"' in page
        assert page.count('data-test="sample-row"') == 60
        # every third (row + index) fails: 20 of 60
        assert "66.7%" in page
        failures = (await client.get(f"{BASE}/evals/{evaluation.name}?show=failures")).text
        assert failures.count('data-test="sample-row"') == 20
        assert 'class="pass"' not in failures
        by_reward = (
            await client.get(f"{BASE}/evals/{evaluation.name}?sort=reward&order=desc")
        ).text
        rewards = re.findall(r'data-test="sample-reward">([^<]+)<', by_reward)
        assert rewards == sorted(rewards, reverse=True) and rewards[0] == "1.000"


async def test_two_eval_runs_side_by_side_on_the_same_rows(world):
    harness, alice = world["harness"], world["alice"]
    evaluation, other = world["eval"], world["other_eval"]
    async with harness.client() as client:
        await sign_in(client, alice)
        page = (await client.get(f"{BASE}/evals/{evaluation.name}?compare={other.name}")).text
        assert 'data-test="compare-summary"' in page
        row0 = page.split('data-row="0" data-n="0"', 1)[1].split("</tr>", 1)[0]
        # row 0 fails here ((0+0) % 3 == 0) and passes there ((0+1+0) % 3 != 0)
        assert (
            'data-test="sample-reward">0.000<' in row0 and 'data-test="other-reward">1.000<' in row0
        )
        sample = (
            await client.get(f"{BASE}/evals/{evaluation.name}/samples/0/0?compare={other.name}")
        ).text
        assert sample.count('data-test="pane"') == 2


async def test_a_failed_sample_shows_why_its_conversation_and_artifacts(world):
    harness, alice, evaluation = world["harness"], world["alice"], world["eval"]
    async with harness.client() as client:
        await sign_in(client, alice)
        url = f"{BASE}/evals/{evaluation.name}/samples/0/0"
        page = (await client.get(url)).text
        assert 'data-test="error-category">grader_error<' in page
        assert "The grader found no" in page
        assert "100 prompt, 20 completion" in page
        assert page.count('data-test="turn"') == 5
        assert 'data-test="tool-call"' in page and "multiply" in page
        assert 'data-test="tool-result"' in page and "product = 42" in page
        assert 'data-path="logs/agent.log"' in page and 'data-test="artifact-folder"' in page
        preview = (await client.get(url + "?file=logs/agent.log")).text
        assert 'data-test="artifact-preview"' in preview
        assert "line 2 &lt;script&gt;alert(2)&lt;/script&gt;" in preview
        raw = await client.get(url + "/artifact?path=page.html")
        assert raw.status_code == 200 and "attachment" in raw.headers["content-disposition"]
        assert not raw.headers["content-type"].startswith("text/html")
        assert "sandbox" in raw.headers["content-security-policy"]
        image = await client.get(url + "/artifact?path=plot.png")
        assert image.headers["content-type"] == "image/png"
        escape = await client.get(url + "/artifact?path=../../trajectories/row_0_run_0.json")
        assert escape.status_code == 400


async def test_hostile_strings_render_as_text(world):
    harness, alice = world["harness"], world["alice"]
    ws = _ws_id(harness, WS)
    hostile = seed_eval(
        harness.platform, ws, alice.user_id, name=f"x{XSS}", samples=3, hostile=True
    )
    hostile_training = seed_training(harness.platform, ws, alice.user_id, name=f"t{XSS}", steps=3)
    with harness.platform.transaction() as db:
        db.add(
            Dataset(
                workspace_id=ws,
                file_name=XSS,
                extension="jsonl",
                file_size=1,
                status="uploaded",
                data_preview=[{"q": XSS}],
                creator_id=alice.user_id,
            )
        )
    async with harness.client() as client:
        await sign_in(client, alice)
        pages = [
            BASE + "/runs",
            f"{BASE}/evals/{hostile.id}",
            f"{BASE}/evals/{hostile.id}/samples/0/0",
            f"{BASE}/trainings/{hostile_training.id}",
            BASE + "/datasets",
        ]
        texts = []
        for url in pages:
            answer = await client.get(url)
            assert answer.status_code == 200, url
            texts.append(answer.text)
        dataset_link = re.search(
            r'href="(/w/[^"]+/datasets/[^"]+)" data-test="dataset-link"', texts[-1]
        )
        assert dataset_link
        texts.append((await client.get(dataset_link.group(1).replace("&amp;", "&"))).text)
    for text in texts:
        assert "<script>alert" not in text and "<img src=x" not in text
        assert "&lt;script&gt;alert(" in text
    sample = texts[2]
    assert "The answer is &lt;script&gt;" in sample  # the message
    assert (
        "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt; product"
        in sample
    )  # tool output
    assert "onerror=alert(1)&gt;.txt" in sample  # the artifact's file name


async def test_a_dataset_uploaded_the_way_the_browser_does_is_processed(world):
    harness, alice = world["harness"], world["alice"]
    body = "".join(
        f'{{"user_prompt": "{i}+{i}", "ground_truth": "{2 * i}"}}\n' for i in range(1, 6)
    ).encode()
    async with harness.client() as client:
        await sign_in(client, alice)
        page = await client.get(BASE + "/datasets")
        token = csrf_of(page.text)
        started = await client.post(
            f"{BASE}/datasets/upload",
            json={"file_name": "sums.jsonl", "file_size": len(body)},
            headers={"X-CSRF-Token": token},
        )
        assert started.status_code == 201, started.text
        plan = started.json()["upload"]
        assert plan["method"] == "simple"
        target = urlsplit(plan["presigned_url"])
        put = await client.put(
            f"{target.path}?{target.query}", content=body, headers=plan["upload_headers"]
        )
        assert put.status_code in (200, 204), put.text
        done = await client.post(
            f"{BASE}/datasets/{started.json()['id']}/complete",
            json={},
            headers={"X-CSRF-Token": token},
        )
        assert done.status_code == 200, done.text
        user = seed_eval(
            harness.platform, _ws_id(harness, WS), alice.user_id, name="on-sums", dataset="sums"
        )
        detail = (await client.get(f"{BASE}/datasets/{started.json()['id']}")).text
        # the download button: a redirect to the signed URL, which answers the file's bytes
        link = re.search(r'href="([^"]+/download)"[^>]*data-test="dataset-download"', detail)
        assert link, detail
        redirect = await client.get(link.group(1))
        assert redirect.status_code == 303 and redirect.headers["location"].startswith("/")
        fetched = await client.get(redirect.headers["location"])
        assert fetched.status_code == 200 and fetched.content == body
    # the runs that used it, linked; the other runs (another dataset) are not listed
    assert 'data-test="dataset-runs"' in detail and f"/evals/{user.id}" in detail
    assert detail.count('data-test="dataset-run"') == 1
    assert 'data-test="dataset-rows">5<' in detail
    assert "3+3" in detail and 'data-test="dataset-logs"' in detail
    with harness.platform.read() as db:
        dataset = db.scalar(select(Dataset).where(Dataset.file_name == "sums"))
        assert (
            dataset is not None
            and dataset.status == "uploaded"
            and dataset.creator_id == alice.user_id
        )


async def test_secrets_page_lists_names_never_values(world):
    harness, alice = world["harness"], world["alice"]
    from osmosis_ai.platform.api.secrets import secret_box
    from osmosis_ai.platform.services import secrets
    from osmosis_ai.platform.services.accounts import workspace_for_name

    with harness.platform.transaction() as db:
        access = workspace_for_name(db, alice.user_id, WS)
        assert access is not None
        secrets.set_secret(
            db,
            access,
            alice.user_id,
            name="OPENAI_API_KEY",
            value="sk-very-secret-value",
            scope="workspace",
            box=secret_box(harness.platform),
            now=harness.clock(),
        )
    async with harness.client() as client:
        await sign_in(client, alice)
        page = (await client.get(BASE + "/secrets")).text
    assert "OPENAI_API_KEY" in page and "sk-very-secret-value" not in page


ASYNC_METRICS = {
    "max_staleness": lambda step: 2.0,
    "staleness_mean": lambda step: 0.5 + (step % 3) * 0.5,
    "staleness_max": lambda step: float(min(2, step % 3 + 1)),
    "stale_regenerated": lambda step: float(step % 4 == 0),
    "logprob_mismatch": lambda step: 0.01 * (step % 5),
    "logprob_mismatch_max": lambda step: 0.1 * (step % 5),
    "importance_ratio_mean": lambda step: 1.0 - 0.01 * (step % 3),
    "importance_ratio_max": lambda step: 2.0,
    "rollout_wait_seconds": lambda step: 0.1 * (step % 2),
    "validation_policy_version": lambda step: float(step - 1) if step % 10 == 0 else None,
}


async def test_asynchronous_training_metrics_chart_in_their_own_group(world):
    harness, alice = world["harness"], world["alice"]
    ws = _ws_id(harness, WS)
    stale = seed_training(
        harness.platform, ws, alice.user_id, name="stale-heron", steps=30, extra=ASYNC_METRICS
    )
    synchronous = seed_training(harness.platform, ws, alice.user_id, name="sync-heron", steps=30)
    async with harness.client() as client:
        await sign_in(client, alice)
        page = (await client.get(f"{BASE}/trainings/{stale.name}")).text
        payload = (await client.get(f"{BASE}/trainings/{stale.name}/metrics.json")).json()
        sync_page = (await client.get(f"{BASE}/trainings/{synchronous.name}")).text
        sync_payload = (
            await client.get(f"{BASE}/trainings/{synchronous.name}/metrics.json")
        ).json()
    charts = {c["name"]: c for c in payload["charts"]}
    group = "Staleness and off-policy correction"
    for name in set(ASYNC_METRICS) - {"rollout_wait_seconds"}:
        assert charts[name]["group"] == group, name
        assert f'data-test="chart-{name}"' in page and f'data-test="readout-{name}"' in page
    assert charts["rollout_wait_seconds"]["group"] == "Throughput and step time"
    assert charts["staleness_mean"]["title"] == "Staleness, mean (versions)"
    assert "Importance ratio, max" in page and "Staleness, mean (versions)" in page
    assert charts["staleness_mean"]["count"] == 30
    assert (charts["staleness_mean"]["min"], charts["staleness_mean"]["max"]) == (0.5, 1.5)
    assert charts["validation_policy_version"]["steps"] == [10, 20, 30]
    assert charts["validation_policy_version"]["values"] == [9.0, 19.0, 29.0]
    groups = [c["group"] for c in payload["charts"]]
    assert groups.index("Throughput and step time") < groups.index(group)
    # a synchronous (or older) run logs none of them: no empty group, no placeholder
    assert group not in {c["group"] for c in sync_payload["charts"]}
    assert "staleness" not in sync_page.lower() and "None" not in sync_page
