"""The dashboard in a real browser: headless Chromium from the system (Debian's ``chromium``)
driven by Playwright against a platform served by uvicorn on 127.0.0.1, seeded with runs the
way workers store them (``tests/dashboard_world.py``).

The tests click through what a person does: sign in, open the runs list, open a training and
see its charts drawn and updating live, zoom a chart, download a chart's CSV, open an eval
run, keep only failures, open a failed sample and read its error category, deploy a
checkpoint, upload a dataset from a file input, and read a hostile trajectory that must render
as text. Any console error or uncaught page error fails the test that caused it. A screenshot
of every page is saved under ``$OSMOSIS_TEST_ARTIFACTS/dashboard`` (or a pytest temporary
folder), and the folder is printed.

Playwright never downloads a browser here: it launches ``/usr/bin/chromium``. Where
Playwright is missing or that browser cannot start, every test skips and says why.
"""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from sqlalchemy import insert, select

from dashboard_world import (
    TRAINING_CHARTS,
    XSS,
    reward_at,
    seed_dataset,
    seed_eval,
    seed_training,
)
from osmosis_ai.testing.serving import ServerThread, free_port
from platform_support import Harness

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
WS = "Team Alpha"
BASE = f"/w/{quote(WS, safe='')}"
STEPS = 50


def _playwright() -> Any:
    try:
        from playwright.sync_api import sync_playwright
    except ModuleNotFoundError:
        pytest.skip("playwright is not installed (pip install 'osmosis-ai[dashboard-test]')")
    return sync_playwright


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = os.environ.get("OSMOSIS_TEST_ARTIFACTS")
    folder = Path(root) / "dashboard" if root else tmp_path_factory.mktemp("dashboard-screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\ndashboard screenshots: {folder}")
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    sync_playwright = _playwright()
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing (Debian: apt-get install -y chromium)")
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        except Exception as exc:  # any launch failure means no browser tier on this machine
            pytest.skip(f"{CHROMIUM} could not start under Playwright: {exc}")
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("dashboard-platform")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    harness = Harness(root / "data", f"sqlite:///{root / 'platform.db'}", public_url=url)
    workspace_id = harness.workspace(WS, "acme/alpha")
    alice = harness.account("alice@example.com", workspace=WS, role="owner")
    platform = harness.platform
    finished = seed_training(
        platform,
        workspace_id,
        alice.user_id,
        name="steady-finch",
        steps=STEPS,
        status="finished",
        checkpoints=(25, 50),
    )
    live = seed_training(
        platform,
        workspace_id,
        alice.user_id,
        name="live-otter",
        steps=20,
        no_signal=4,
        warnings=("step 17: no learning signal (every group's rewards are equal)",),
    )
    seed_dataset(platform, workspace_id, alice.user_id, rows=12, preview=5)
    evaluation = seed_eval(platform, workspace_id, alice.user_id, name="calm-heron", samples=12)
    hostile = seed_eval(
        platform, workspace_id, alice.user_id, name="odd-<b>magpie</b>", samples=3, hostile=True
    )
    with ServerThread(harness.app, port=port):
        yield {
            "url": url,
            "harness": harness,
            "alice": alice,
            "training": finished,
            "live": live,
            "eval": evaluation,
            "hostile": hostile,
        }
    harness.close()


@pytest.fixture(scope="module")
def signed_in(browser: Any, world: dict[str, Any]) -> dict[str, Any]:
    """The cookies of a browser that signed in through the form, for the other tests."""
    context = browser.new_context(base_url=world["url"])
    page = context.new_page()
    page.goto("/login")
    page.fill("[data-test=login-email]", world["alice"].email)
    page.fill("[data-test=login-token]", world["alice"].token)
    page.click("[data-test=login-submit]")
    page.wait_for_selector("[data-test=runs-table]")
    state = context.storage_state()
    context.close()
    return state


class Watched:
    """A page whose console errors and uncaught exceptions are collected, and a dialog
    (``alert``) recorded and dismissed."""

    def __init__(self, page: Any, shots: Path) -> None:
        self.page = page
        self.shots = shots
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))
        page.on("dialog", self._dialog)

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text} at {message.location}")

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def shot(self, name: str) -> None:
        self.page.screenshot(path=str(self.shots / f"{name}.png"), full_page=True)


@pytest.fixture
def page(
    browser: Any, world: dict[str, Any], signed_in: dict[str, Any], shots: Path
) -> Iterator[Watched]:
    context = browser.new_context(
        base_url=world["url"],
        storage_state=signed_in,
        accept_downloads=True,
        viewport={"width": 1400, "height": 900},
    )
    watched = Watched(context.new_page(), shots)
    try:
        yield watched
        watched.page.wait_for_load_state("load")
    finally:
        context.close()
    assert watched.errors == [], watched.errors
    assert watched.dialogs == [], watched.dialogs


def test_sign_in_lands_on_the_runs_list_and_sign_out_returns_to_login(
    browser: Any, world: dict[str, Any], shots: Path
) -> None:
    context = browser.new_context(base_url=world["url"])
    watched = Watched(context.new_page(), shots)
    page = watched.page
    try:
        page.goto(BASE + "/runs")
        page.wait_for_selector("[data-test=login-form]")
        watched.shot("01-login")
        page.fill("[data-test=login-email]", world["alice"].email)
        page.fill("[data-test=login-token]", "osm_wrong-token")
        page.click("[data-test=login-submit]")
        assert page.locator("[data-test=login-error]").is_visible()
        # the refused sign-in answers 401, which the browser logs: expected, and the only one
        assert len(watched.errors) == 1 and "status of 401" in watched.errors[0], watched.errors
        watched.errors.clear()
        # a refused sign-in keeps the email and where the person was going
        assert page.input_value("[data-test=login-email]") == world["alice"].email
        assert page.input_value("input[name=next]") == BASE + "/runs"
        page.fill("[data-test=login-token]", world["alice"].token)
        page.click("[data-test=login-submit]")
        page.wait_for_selector("[data-test=runs-table]")
        assert page.url == world["url"] + BASE + "/runs"
        assert page.locator("[data-test=viewer-email]").inner_text() == world["alice"].email
        cookies = {c["name"]: c for c in context.cookies()}
        assert any(c["httpOnly"] for c in cookies.values()), cookies
        page.click("[data-test=logout]")
        page.wait_for_selector("[data-test=login-form]")
        page.goto(BASE + "/runs")
        assert "/login" in page.url
    finally:
        context.close()
    assert watched.errors == [] and watched.dialogs == []


def test_runs_list_shows_every_run_and_filters_by_kind(page: Watched, world: dict[str, Any]):
    p = page.page
    p.goto(BASE + "/runs")
    names = p.locator("[data-test=run-row]").evaluate_all(
        "rows => rows.map(r => r.dataset.runName)"
    )
    for seeded in ("training", "live", "eval", "hostile"):
        assert world[seeded].name in names
    page.shot("02-runs")
    p.select_option("[data-test=filter-kind]", "eval")
    p.click("[data-test=filter-apply]")
    p.wait_for_url(re.compile(r"kind=eval"))
    kept = p.locator("[data-test=run-row]").evaluate_all("rows => rows.map(r => r.dataset.runName)")
    assert sorted(kept) == sorted([world["eval"].name, world["hostile"].name])
    p.click(f"[data-test=run-row][data-run-id='{world['eval'].id}'] [data-test=run-link]")
    p.wait_for_selector("[data-test=eval-run]")


def test_training_page_draws_six_charts_and_a_drag_zooms_one(page: Watched, world: dict[str, Any]):
    p = page.page
    p.goto(BASE + "/runs?kind=training")
    p.click(f"[data-test=run-row][data-run-id='{world['training'].id}'] [data-test=run-link]")
    p.wait_for_selector("#training[data-loaded='true']")
    assert p.locator("[data-test=run-name]").inner_text().startswith(world["training"].name)
    for name in TRAINING_CHARTS:
        chart = p.locator(f"[data-test=chart-{name}]")
        assert chart.locator("canvas").count() == 1, name
        assert chart.locator("[data-empty]").is_hidden(), name
        expected = STEPS // 10 if name == "validation_reward" else STEPS
        assert chart.locator("[data-count]").inner_text().startswith(f"{expected} points"), name
    latest = f"{reward_at(STEPS, STEPS):.3f}"[:4]
    assert p.locator("[data-field=overview-reward]").inner_text().startswith(latest)
    logs = p.locator("#logs[data-loaded='true'] [data-test=log-lines]")
    assert "step 5 done" in logs.inner_text()
    page.shot("03-training")

    # switch the reward chart to a zoomed range by dragging over it, then back by double-click
    plot = p.locator("[data-test=plot-training_reward]")
    plot.scroll_into_view_if_needed()
    whole = plot.locator("canvas").screenshot()
    over = plot.locator(".u-over")
    box = over.bounding_box()
    assert box is not None
    y = box["y"] + box["height"] / 2
    p.mouse.move(box["x"] + box["width"] * 0.2, y)
    p.mouse.down()
    p.mouse.move(box["x"] + box["width"] * 0.5, y, steps=5)
    p.mouse.up()
    zoomed = plot.locator("canvas").screenshot()
    assert zoomed != whole
    page.shot("04-training-zoomed")
    over.dblclick()
    p.mouse.move(0, 0)
    assert plot.locator("canvas").screenshot() != zoomed


def test_hover_reads_a_value_and_smoothing_redraws_every_chart(
    page: Watched, world: dict[str, Any]
):
    p = page.page
    p.goto(f"{BASE}/trainings/{world['training'].id}")
    p.wait_for_selector("#training[data-loaded='true']")
    # a chart for every logged metric, grouped, each drawn
    assert p.locator("[data-test=chart-group]").count() >= 5
    for name in ("loss", "grad_norm", "learning_rate", "kl", "clip_ratio", "tokens_per_s"):
        assert p.locator(f"[data-test=chart-{name}] canvas").count() == 1, name
    # hovering the reward chart reads out the step and the value under the cursor
    plot = p.locator("[data-test=plot-training_reward]")
    plot.scroll_into_view_if_needed()
    box = plot.locator(".u-over").bounding_box()
    assert box is not None
    p.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    readout = p.locator("[data-test=readout-training_reward]")
    p.wait_for_function(
        "() => document.querySelector('[data-test=readout-training_reward]').textContent !== ''"
    )
    text = readout.inner_text()
    match = re.match(r"step (\d+): (-?[\d.]+)", text)
    assert match, text
    step = int(match.group(1))
    assert STEPS - 3 <= step <= STEPS
    assert float(match.group(2)) == pytest.approx(reward_at(step, STEPS), abs=1e-4)
    page.shot("06-training-hover")
    # an all-zero series is drawn on a 0..1 axis, not 0..100
    clip_axis = p.locator("[data-test=plot-clip_ratio]").get_attribute("data-y-ticks") or ""
    assert clip_axis.split()[0] == "0" and clip_axis.split()[-1] == "1", clip_axis
    # the step axis has integer ticks only
    step_axis = p.locator("[data-test=plot-training_reward]").get_attribute("data-x-ticks") or ""
    assert step_axis.split() and all(t.isdigit() for t in step_axis.split()), step_axis
    # smoothing: the slider redraws with an EMA line; the readout shows both values
    whole = plot.locator("canvas").screenshot()
    p.locator("[data-test=smoothing]").fill("0.9")
    p.wait_for_selector("#training[data-smoothing='0.9']")
    assert p.locator("[data-test=smoothing-value]").inner_text() == "0.90"
    assert plot.locator("canvas").screenshot() != whole
    p.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    p.mouse.move(box["x"] + box["width"] - 2, box["y"] + box["height"] / 2)
    p.wait_for_function(
        "() => document.querySelector('[data-test=readout-training_reward]')"
        ".textContent.includes('smoothed')"
    )
    page.shot("07-training-smoothed")
    p.locator("[data-test=smoothing]").fill("0")


def test_a_running_trainings_charts_follow_new_steps(page: Watched, world: dict[str, Any]):
    from osmosis_ai.platform import training_metrics
    from osmosis_ai.platform.store.orm import RunMetric

    p = page.page
    live = world["live"]
    p.goto(f"{BASE}/trainings/{live.id}")
    p.wait_for_selector("#training[data-loaded='true']")
    count = p.locator("[data-test=chart-training_reward] [data-count]")
    assert count.inner_text().startswith("20 points")
    assert p.locator("[data-test=charts-note]").inner_text().startswith("Updating every")
    platform = world["harness"].platform
    start = platform.now()
    with platform.transaction() as db:
        db.execute(
            insert(RunMetric),
            [
                {
                    "run_id": live.id,
                    "key": training_metrics.wire_key("training_reward"),
                    "step": step,
                    "value": 0.95,
                    "timestamp": start + timedelta(seconds=step),
                }
                for step in range(21, 26)
            ],
        )
    # the page polls every few seconds while the run goes: the new steps arrive unprompted
    p.wait_for_function(
        '() => document.querySelector("[data-test=chart-training_reward] [data-count]")'
        ".textContent.startsWith('25 points')",
        timeout=20_000,
    )
    assert "latest 0.95" in count.inner_text()
    page.shot("05-training-live")


def test_a_charts_csv_downloads_with_every_step(page: Watched, world: dict[str, Any]):
    p = page.page
    p.goto(f"{BASE}/trainings/{world['training'].id}")
    p.wait_for_selector("#training[data-loaded='true']")
    with p.expect_download() as waiting:
        p.click("[data-test=csv-training_reward]")
    download = waiting.value
    assert download.suggested_filename.endswith(".csv")
    assert world["training"].name in download.suggested_filename
    with open(download.path(), newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["step", "training_reward", "timestamp"]
    assert [int(r[0]) for r in rows[1:]] == list(range(1, STEPS + 1))
    for row in rows[1:]:
        assert float(row[1]) == pytest.approx(reward_at(int(row[0]), STEPS))


def test_eval_run_filter_failures_and_read_why_a_sample_failed(
    page: Watched, world: dict[str, Any]
):
    p = page.page
    p.goto(f"{BASE}/evals/{world['eval'].id}")
    p.wait_for_selector("[data-test=samples-table]")
    assert p.locator("#histogram[data-loaded='true'] canvas").count() == 1
    assert p.locator("[data-test=sample-row]").count() == 12
    page.shot("06-eval")
    p.click("[data-test=show-failures]")
    p.wait_for_url(re.compile(r"show=failures"))
    rows = p.locator("[data-test=sample-row]")
    assert rows.count() == 4  # every third row of twelve fails
    assert set(rows.evaluate_all("rows => rows.map(r => r.className)")) == {"fail"}
    assert set(p.locator("[data-test=sample-error]").all_inner_texts()) == {"grader_error"}
    page.shot("07-eval-failures")
    rows.nth(1).locator("[data-test=sample-link]").click()
    p.wait_for_selector("[data-test=conversation]")
    assert p.locator("[data-test=error-category]").inner_text() == "grader_error"
    assert "no '#### <number>' line" in p.locator("[data-test=error-message]").inner_text()
    assert p.locator("[data-test=sample-reward]").inner_text().startswith("0")
    assert p.locator("[data-test=tool-call]").count() == 1
    assert "product = 42" in p.locator("[data-test=tool-result]").inner_text()
    page.shot("08-sample-failed")


def test_a_sample_steps_to_its_neighbours_and_shows_the_expected_answer(
    page: Watched, world: dict[str, Any]
):
    p = page.page
    p.goto(f"{BASE}/evals/{world['eval'].id}/samples/4/0")
    assert p.locator("[data-test=expected-answer]").inner_text() == "8"
    assert p.locator("[data-test=model-answer]").inner_text() == "#### 8"
    page.shot("12-sample-expected")
    p.click("[data-test=sample-next]")
    p.wait_for_url(re.compile(r"/samples/5/0$"))
    assert p.locator("h1").inner_text() == "Row 5, run 0"
    assert p.locator("[data-test=expected-answer]").inner_text() == "10"  # past the preview
    p.click("[data-test=sample-previous]")
    p.wait_for_url(re.compile(r"/samples/4/0$"))
    p.goto(f"{BASE}/evals/{world['eval'].id}/samples/0/0")
    assert p.locator("[data-test=sample-previous]").count() == 0
    p.goto(f"{BASE}/evals/{world['eval'].id}/samples/11/0")
    assert p.locator("[data-test=sample-next]").count() == 0


def test_a_run_without_learning_signal_says_so_at_the_top(page: Watched, world: dict[str, Any]):
    p = page.page
    p.goto(f"{BASE}/trainings/{world['live'].id}")
    p.wait_for_selector("#training[data-loaded='true']")
    notice = p.locator("[data-test=notice-no-signal]")
    assert "last 4 steps" in notice.inner_text()
    assert p.locator("[data-test=notice-warning]").count() == 1
    top = p.locator("[data-test=run-notices]").bounding_box()
    charts = p.locator("[data-test=chart-training_reward]").bounding_box()
    assert top is not None and charts is not None and top["y"] < charts["y"]


def test_deploy_a_checkpoint_and_see_it_active(page: Watched, world: dict[str, Any]):
    from osmosis_ai.platform.store.orm import Model

    p = page.page
    p.goto(f"{BASE}/trainings/{world['training'].id}")
    row = p.locator("[data-test=checkpoint-row][data-step='25']")
    assert row.locator("[data-test=deployment-status]").inner_text() == "inactive"
    p.click("[data-test=deploy-25]")
    p.wait_for_selector("[data-test=undeploy-25]")
    assert row.locator("[data-test=deployment-status]").inner_text() == "active"
    assert p.url.endswith(f"/trainings/{world['training'].id}")
    page.shot("09-training-deployed")
    p.click("[data-test=nav-models]")
    active = p.locator("[data-test=lora-row]").filter(has=p.locator("[data-test=undeploy-model]"))
    assert active.count() == 1
    assert active.locator("[data-test=deployment-status]").inner_text() == "active"
    page.shot("10-models")
    with world["harness"].platform.read() as db:
        states = dict(db.execute(select(Model.name, Model.deployment_status)).all())
    assert list(states.values()).count("active") == 1
    # undeploy asks first: Cancel keeps the deployment, Yes ends it
    p.click("[data-test=undeploy-model]")
    prompt = p.locator("[data-test=confirm-prompt]")
    assert "Undeploy" in prompt.inner_text() and "Requests to it will fail" in prompt.inner_text()
    page.shot("11-models-undeploy-confirm")
    p.click("[data-test=confirm-cancel]")
    assert prompt.count() == 0
    with world["harness"].platform.read() as db:
        states = dict(db.execute(select(Model.name, Model.deployment_status)).all())
    assert list(states.values()).count("active") == 1
    p.click("[data-test=undeploy-model]")
    p.click("[data-test=confirm-yes]")
    p.wait_for_selector("[data-test=lora-row] [data-test=undeploy-model]", state="detached")


def test_upload_a_dataset_from_the_browser(page: Watched, tmp_path: Path):
    body = "".join(
        f'{{"user_prompt": "{i}+{i}", "ground_truth": "{2 * i}"}}\n' for i in range(1, 8)
    )
    source = tmp_path / "sums.jsonl"
    source.write_text(body)
    p = page.page
    p.goto(BASE + "/datasets")
    page.shot("11-datasets")
    p.set_input_files("[data-test=dataset-file]", str(source))
    p.click("[data-test=dataset-upload]")
    p.wait_for_selector("[data-test=dataset]")
    assert p.locator("[data-test=dataset-name]").inner_text().startswith("sums")
    assert p.locator("[data-test=dataset-rows]").inner_text() == "7"
    assert "6+6" in p.locator("[data-test=dataset-preview]").inner_text()
    page.shot("13-dataset")
    # the download button answers the uploaded bytes
    with p.expect_download() as waiting:
        p.click("[data-test=dataset-download]")
    assert Path(waiting.value.path()).read_text() == body
    p.click("[data-test=nav-datasets]")
    assert p.locator("[data-test=dataset-row]").count() == 2  # and the world's multiply


def test_html_and_script_in_a_trajectory_render_as_text(page: Watched, world: dict[str, Any]):
    p = page.page
    hostile = world["hostile"]
    p.goto(BASE + "/runs")
    link = p.locator(f"[data-test=run-row][data-run-id='{hostile.id}'] [data-test=run-link]")
    assert link.inner_text() == hostile.name  # the name's <b> shows as text
    assert link.locator("b").count() == 0
    link.click()
    p.wait_for_selector("[data-test=eval-run]")
    assert p.locator("[data-test=run-name]").inner_text().startswith(hostile.name)
    p.goto(f"{BASE}/evals/{hostile.id}/samples/0/0")
    p.wait_for_selector("[data-test=conversation]")
    conversation = p.locator("[data-test=conversation]")
    assert XSS in conversation.inner_text()  # the user message and the answer, as typed
    assert XSS in p.locator("[data-test=tool-result]").inner_text()
    assert conversation.locator("script, img").count() == 0
    files = p.locator("[data-test=artifact-file]")
    assert f"{XSS}.txt" in files.evaluate_all("links => links.map(a => a.dataset.path)")
    # the "/" inside "</script>" makes a folder level; both parts show as text
    assert "script><img src=x onerror=alert(1)>.txt" in files.all_inner_texts()
    folders = p.locator("[data-test=artifact-folder] > span").all_inner_texts()
    assert "<script>alert('x')</" in folders
    assert p.locator("[data-test=artifacts]").locator("script, img").count() == 0
    page.shot("13-sample-hostile")
    for path in (f"{XSS}.txt", "logs/agent.log", "page.html"):
        p.goto(f"{BASE}/evals/{hostile.id}/samples/0/0?file={quote(path)}")
        preview = p.locator("[data-test=artifact-preview]")
        assert preview.count() == 1, path
        assert preview.locator("script, img, b").count() == 0, path
    assert "<script>alert(3)</script>" in p.locator("[data-test=artifact-preview]").inner_text()
    # executing none of it: no dialog opened and no global was set by a script
    assert p.evaluate("() => typeof window.alert") == "function"
    page.shot("14-artifact-preview-hostile")
