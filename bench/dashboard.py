"""Dashboard benchmark: how fast the run pages paint in a real browser on a big platform.

Set-up: a fresh data dir whose database holds a training run of ``--steps`` steps (the six
charted metrics per step, as a worker stores them) and an eval run of ``--samples`` samples
(trajectories for the first 200), written with the tests' seeding code
(``tests/dashboard_world.py``); ``osmosis platform serve --workers 0`` on a free port; and
headless Chromium from the system (Debian's ``chromium``; Playwright drives it, it never
downloads a browser) signed in through ``/login``.

Figures, per page (training run, eval run, runs list), median over ``--repeat`` loads, from
the browser's own performance timing:

* ``first_paint_ms``: the ``first-contentful-paint`` entry (target <= 1000 ms);
* ``response_ms``: navigation start to the end of the HTML response;
* ``first_chart_ms`` (training page): navigation start until the first chart is drawn (the
  page fetches the first group's metrics on its own, then every chart; target <= 1000 ms);
* ``charts_ms`` (training page): navigation start until every chart is drawn from the
  downsampled ``metrics.json`` (the page sets ``data-loaded``);
* ``metrics_json_bytes``: the size of that chart payload.

Baseline in the same run: the sign-in page (a page with no data behind it), same browser and
server. Console errors on any page are reported (there should be none).

    .venv/bin/python bench/dashboard.py [--steps 10000] [--samples 10000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT / "tests"))  # the seeding code the dashboard's tests use

from dashboard_world import seed_eval, seed_training  # noqa: E402
from osmosis_ai.testing.serving import free_port  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
TARGET_PAINT_MS = 1000.0
TARGET_CHART_MS = 1000.0
WORKSPACE = "bench"


def prepare(data_dir: Path, public_url: str, steps: int, samples: int) -> dict[str, str]:
    """Seed the platform's database; the account's email and token, and the runs' ids."""
    from osmosis_ai.platform.api.deps import Platform
    from osmosis_ai.platform.auth import issue_token
    from osmosis_ai.platform.services.accounts import add_member, create_user, create_workspace
    from osmosis_ai.platform.settings import load_settings
    from osmosis_ai.platform.store.database import open_database

    settings = load_settings(data_dir=data_dir, public_url=public_url)
    database = open_database(settings)
    platform = Platform(settings=settings, database=database)
    try:
        with platform.transaction() as db:
            user = create_user(db, "bench@example.com", name="Bench")
            workspace = create_workspace(
                db, WORKSPACE, repo="bench/bench", clone_url="/nonexistent"
            )
            add_member(db, workspace, user, role="owner")
            token = issue_token(db, user, platform_url=public_url, name="bench", now=platform.now())
            ids = {"user": user.id, "workspace": workspace.id, "token": token.raw}
        started = time.perf_counter()
        training = seed_training(
            platform,
            ids["workspace"],
            ids["user"],
            name="long-training",
            steps=steps,
            status="running",
            checkpoints=(steps // 2, steps),
            logs=200,
        )
        evaluation = seed_eval(
            platform,
            ids["workspace"],
            ids["user"],
            name="big-eval",
            samples=samples,
            trajectories=200,
        )
        for index in range(30):  # a runs list with some history
            seed_eval(platform, ids["workspace"], ids["user"], name=f"small-{index}", samples=5)
        print(f"seeded in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    finally:
        database.dispose()
    return {
        "email": "bench@example.com",
        "token": ids["token"],
        "training": training.id,
        "eval": evaluation.id,
    }


def start_server(data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "osmosis_ai.cli.main",
        "platform",
        "serve",
        "--data-dir",
        str(data_dir),
        "--port",
        str(port),
        "--workers",
        "0",
        "--log-level",
        "warning",
    ]
    process = subprocess.Popen(command, cwd=ROOT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit("platform serve did not answer /api/health within 60 s")


PAINT_JS = """() => new Promise((resolve) => {
  const report = (fcp) => {
    const nav = performance.getEntriesByType('navigation')[0];
    resolve({
      first_paint_ms: fcp === null ? null : fcp.startTime,
      response_ms: nav ? nav.responseEnd : null,
      dom_ms: nav ? nav.domContentLoadedEventEnd : null,
    });
  };
  // buffered: an entry recorded before this observer still arrives
  new PerformanceObserver((list) => {
    const found = list.getEntriesByName('first-contentful-paint')[0];
    if (found) report(found);
  }).observe({ type: 'paint', buffered: true });
  setTimeout(() => report(null), 5000);
})"""


def measure(page: Any, url: str, *, charts: bool) -> dict[str, float | None]:
    page.goto(url, wait_until="commit")
    if charts:
        # an older page marks only the whole payload (data-loaded); this one each chart
        page.wait_for_selector(
            "#training section.chart[data-drawn='true'], #training[data-loaded='true']",
            state="attached",
            timeout=30_000,
        )
        first_chart = page.evaluate("() => performance.now()")
        page.wait_for_selector("#training[data-loaded='true']", timeout=30_000)
        charts_done = page.evaluate("() => performance.now()")
        figures = page.evaluate(PAINT_JS)
        figures["first_chart_ms"] = first_chart
        figures["charts_ms"] = charts_done
    else:
        page.wait_for_load_state("load")
        figures = page.evaluate(PAINT_JS)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    if not Path(CHROMIUM).exists():
        raise SystemExit(f"{CHROMIUM} is missing: apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="osmosis-dashboard-bench-"))
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = None
    try:
        seeded = prepare(root / "data", base, args.steps, args.samples)
        server = start_server(root / "data", port)
        results: dict[str, Any] = {
            "steps": args.steps,
            "samples": args.samples,
            "repeat": args.repeat,
        }
        errors: list[str] = []
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
            context = browser.new_context(viewport={"width": 1400, "height": 900})
            page = context.new_page()
            page.on(
                "console",
                lambda message: errors.append(message.text) if message.type == "error" else None,
            )
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{base}/login")
            page.fill("[data-test=login-email]", seeded["email"])
            page.fill("[data-test=login-token]", seeded["token"])
            page.click("[data-test=login-submit]")
            page.wait_for_selector("[data-test=runs-table]")
            pages = {
                "baseline_login": (f"{base}/login", False),  # a page with no data behind it
                "training": (f"{base}/w/{WORKSPACE}/trainings/{seeded['training']}", True),
                "eval": (f"{base}/w/{WORKSPACE}/evals/{seeded['eval']}", False),
                "runs": (f"{base}/w/{WORKSPACE}/runs", False),
                "sample": (f"{base}/w/{WORKSPACE}/evals/{seeded['eval']}/samples/1/0", False),
            }
            for name, (url, charts) in pages.items():
                measure(page, url, charts=charts)  # warm: templates compiled, caches filled
                runs = [measure(page, url, charts=charts) for _ in range(args.repeat)]
                summary: dict[str, Any] = {}
                for key in runs[0]:
                    values = [r[key] for r in runs if r[key] is not None]
                    summary[key] = round(statistics.median(values), 1) if values else None
                results[name] = summary
            cookies = {c["name"]: c["value"] for c in context.cookies()}
            browser.close()
        payload = httpx.get(
            f"{base}/w/{WORKSPACE}/trainings/{seeded['training']}/metrics.json",
            cookies=cookies,
            timeout=30,
        )
        results["training"]["metrics_json_bytes"] = len(payload.content)
        results["console_errors"] = errors
        worst = max(results[name]["first_paint_ms"] or 0 for name in ("training", "eval"))
        results["target_first_paint_ms"] = TARGET_PAINT_MS
        results["target_first_chart_ms"] = TARGET_CHART_MS
        first_chart = results["training"]["first_chart_ms"] or float("inf")
        baseline = results["baseline_login"]["first_paint_ms"] or 1.0
        results["ratios_to_baseline_paint"] = {
            "training_first_paint": round(
                (results["training"]["first_paint_ms"] or 0) / baseline, 2
            ),
            "eval_first_paint": round((results["eval"]["first_paint_ms"] or 0) / baseline, 2),
            "training_first_chart": round(first_chart / baseline, 2),
        }
        results["meets_target"] = (
            worst <= TARGET_PAINT_MS and first_chart <= TARGET_CHART_MS and not errors
        )
        print(json.dumps(results, indent=2))
    finally:
        if server is not None:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
        if not os.environ.get("OSMOSIS_BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
