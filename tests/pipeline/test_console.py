"""The batch console (/ui) in a real browser: Debian's chromium, headless, driven by Playwright
(never a downloaded browser). A batch under an A/B experiment runs on two echo workers while the
page shows it waiting, then its progress reach 100 %, its name and whole id (copied by a button),
its detail open by default (per-variant and per-checkpoint counts, the first failed lines), its
throughput's final figure, and the experiment's report; a refused key and a sign-out leave no key
behind. With YUE2_UPDATE_SCREENSHOTS=1 the screenshots go to docs/ (console-running.png,
console-errors.png, console.png); otherwise to the test's temporary directory.

Skipped locally when /usr/bin/chromium is absent; under CI=true it fails instead (.ci/run installs it).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import ROOT, new_key

CHROMIUM = "/usr/bin/chromium"
# Micro-batches of 4 jobs at 150 ms each: the 60 jobs finish over several seconds, so the page
# shows the progress between 0 and 100 %.
ECHO = {"YUE2_RUNNER": "tests.pipeline.echo_runner:factory", "YUE2_TEST_JOB_MS": "150", "YUE2_BATCH_MAX_JOBS": "4"}
# As the machine's own browser checks start it: no background traffic to hosts it cannot reach.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture
def browser() -> Any:
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{CHROMIUM} is missing (CI=true: .ci/run installs Debian's chromium)")
        pytest.skip(f"{CHROMIUM} is missing")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


def test_the_console_shows_a_batch_reach_100_percent(api: Any, settings: Any, workers: Any, browser: Any,
                                                     tmp_path: Path) -> None:
    from playwright.sync_api import expect

    from yue2_jobs.client import Client

    key = new_key(settings, f"t-{uuid.uuid4().hex[:8]}")
    client = Client(api.url, key)
    exp = client.create_experiment(variants=[{"variant": "base"}, {"variant": "legal"}], name="console check")
    lines = "".join(f'{{"custom_id": "r{i}", "reference": "the tenant pays rent", "body": {{"input": "Document {i}: '
                    f'the parties agree to the terms of the contract, and the tenant pays rent monthly."}}}}\n'
                    for i in range(60))
    lines += '{"custom_id": "empty", "body": {"input": ""}}\n'  # fails alone: the error preview shows it
    path = tmp_path / "requests.jsonl"
    path.write_text(lines)
    batch = client.create_batch(client.upload(path)["id"], experiment_id=exp["id"],
                                metadata={"name": "nightly contracts"})
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=api.url)
    page = context.new_page()
    page.goto(f"{api.url}/ui")
    page.fill("#key", "yk-not-a-key")  # a refused key: back to the login, shown nowhere
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("refused")
    assert page.locator("#who").inner_text() == "" and page.evaluate("sessionStorage.length") == 0
    page.fill("#key", key)
    page.click("button[type=submit]")
    row = page.locator(f'tr[data-batch="{batch["id"]}"]')
    row.wait_for(timeout=20_000)
    # No worker yet: the batch waits, and its detail is open by default (the newest batch).
    expect(page.locator(f'[data-eta="{batch["id"]}"]')).to_have_text("waiting")
    expect(page.locator("#detail-title")).to_have_text(f"nightly contracts · {batch['id']}")
    assert "nightly contracts" in row.inner_text() and batch["id"] in row.inner_text()  # the whole id
    row.locator("button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == batch["id"]
    errors = page.locator("#errors tbody")
    expect(errors).to_contain_text("empty")
    expect(errors).to_contain_text("body.input is required for a summarize job and must not be empty")
    workers(**ECHO), workers("--variant", "legal", **ECHO)
    # Screenshots land in docs/ only when asked, so a test run leaves the tree as it was.
    shots = ROOT / "docs" if os.environ.get("YUE2_UPDATE_SCREENSHOTS") == "1" else tmp_path
    running_shot = False
    progress = page.locator(f'[data-progress="{batch["id"]}"]')
    seen = [progress.inner_text()]
    deadline = time.monotonic() + 180
    while seen[-1] != "100%":  # the page's own polling moves it; record each value it shows
        assert time.monotonic() < deadline, f"the page's progress stopped at {seen}"
        page.wait_for_timeout(100)
        if progress.inner_text() != seen[-1]:
            seen.append(progress.inner_text())
            if 20 < int(seen[-1].rstrip("%")) < 90 and not running_shot:
                page.screenshot(path=str(shots / "console-running.png"), full_page=True)
                running_shot = True
    assert any(0 < int(p.rstrip("%")) < 100 for p in seen), seen  # it moved while the batch ran
    row.locator(".status.completed").wait_for(timeout=30_000)
    assert "succeeded 60" in row.inner_text() and "failed 1" in row.inner_text()
    throughput = page.locator(f'[data-throughput="{batch["id"]}"]')
    expect(throughput).to_contain_text("final")  # the batch's final average, which no longer moves
    stats = client._json(client.http.get(f"/v1/batches/{batch['id']}/stats"))
    per_min = stats["throughput_per_s"] * 60
    assert throughput.inner_text().split("/min")[0] == (f"{per_min:.1f}" if per_min < 10 else f"{per_min:.0f}")
    variants = page.locator("#by-variant tbody").inner_text()
    assert "base" in variants and "legal" in variants
    assert "base@echo" in page.locator("#by-checkpoint").inner_text()
    assert page.locator("#detail-files a[data-file]").first.inner_text() == "output"
    page.locator("#errors-box").screenshot(path=str(shots / "console-errors.png"))
    row.locator("a[data-report]").click()
    frame = page.frame_locator("#report-frame")
    expect(frame.locator("body")).to_contain_text("legal - base", timeout=60_000)  # the report's comparison
    page.screenshot(path=str(shots / "console.png"), full_page=True)
    # The report on its own fits a 1,280-pixel window.
    report = context.new_page()
    report.set_viewport_size({"width": 1280, "height": 800})
    report.set_content(client.experiment_report_html(exp["id"]))
    assert report.evaluate("document.documentElement.scrollWidth") <= 1280
    page.click("#sign-out")  # the key leaves the tab and the header
    expect(page.locator("#login")).to_be_visible()
    assert page.locator("#who").inner_text() == "" and page.evaluate("sessionStorage.length") == 0
    print("progress seen on the page:", seen)
