"""The batch console (/ui) in a real browser: Debian's chromium, headless, driven by Playwright
(never a downloaded browser). A batch under an A/B experiment runs on two echo workers while the
page shows its progress reach 100 %, its per-variant and per-checkpoint breakdown, and the
experiment's report; the screenshot goes to docs/console.png.

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
    workers(**ECHO), workers("--variant", "legal", **ECHO)
    lines = "".join(f'{{"custom_id": "r{i}", "reference": "the tenant pays rent", "body": {{"input": "Document {i}: '
                    f'the parties agree to the terms of the contract, and the tenant pays rent monthly."}}}}\n'
                    for i in range(60))
    path = tmp_path / "requests.jsonl"
    path.write_text(lines)
    batch = client.create_batch(client.upload(path)["id"], experiment_id=exp["id"])
    page = browser.new_page(viewport={"width": 1360, "height": 900})
    page.goto(f"{api.url}/ui")
    page.fill("#key", key)
    page.click("button[type=submit]")
    progress = page.locator(f'[data-progress="{batch["id"]}"]')
    progress.wait_for(timeout=20_000)
    seen = [progress.inner_text()]
    deadline = time.monotonic() + 180
    while seen[-1] != "100%":  # the page's own polling moves it; record each value it shows
        assert time.monotonic() < deadline, f"the page's progress stopped at {seen}"
        page.wait_for_timeout(100)
        if progress.inner_text() != seen[-1]:
            seen.append(progress.inner_text())
    assert any(0 < int(p.rstrip("%")) < 100 for p in seen), seen  # it moved while the batch ran
    row = page.locator(f'tr[data-batch="{batch["id"]}"]')
    row.locator(".status.completed").wait_for(timeout=30_000)
    assert "succeeded 60" in row.inner_text()
    row.click()
    page.locator("#by-variant tbody tr").nth(1).wait_for(timeout=10_000)
    variants = page.locator("#by-variant tbody").inner_text()
    assert "base" in variants and "legal" in variants
    assert "base@echo" in page.locator("#by-checkpoint").inner_text()
    assert row.locator("a[data-file]").first.inner_text() == "output"
    row.locator("a[data-report]").click()
    frame = page.frame_locator("#report-frame")
    expect(frame.locator("body")).to_contain_text("legal - base", timeout=60_000)  # the report's comparison
    (ROOT / "docs").mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT / "docs" / "console.png"), full_page=True)
    print("progress seen on the page:", seen)
