"""The batch console (/ui) in a real browser: Debian's chromium, headless, driven by Playwright
(never a downloaded browser).

A batch under an A/B experiment runs on two echo workers while the page shows it waiting, then its
progress reach 100 %, its name and whole id (on one line, copied by a button), its detail open by
default (per-variant and per-checkpoint counts, its times, its input, output and error files
downloaded with the console's key, its lines browsed by status a page at a time), its failed share
as text beside the bar, its throughput's final figure, and the experiment's report; a refused key
and a sign-out leave no key behind. Without workers, a tenant's 25 batches page 10 at a time and
are found by name or id, 4 failures in 300 lines stay visible on the bar, and a batch is cancelled
after a confirmation (and not without one).

With YUE2_UPDATE_SCREENSHOTS=1 the screenshots go to docs/ (console-running.png,
console-errors.png, console.png, console-paging.png, console-cancel.png); otherwise to the test's
temporary directory.

Skipped locally when /usr/bin/chromium is absent; under CI=true it fails instead (.ci/run installs it).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.pipeline.conftest import ROOT, new_key
from yue2_jobs.client import Client

CHROMIUM = "/usr/bin/chromium"
# Micro-batches of 4 jobs at 150 ms each: the 60 jobs finish over several seconds, so the page
# shows the progress between 0 and 100 %.
ECHO = {"YUE2_RUNNER": "tests.pipeline.echo_runner:factory", "YUE2_TEST_JOB_MS": "150", "YUE2_BATCH_MAX_JOBS": "4"}
# As the machine's own browser checks start it: no background traffic to hosts it cannot reach.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def shots_dir(tmp_path: Path) -> Path:
    # Screenshots land in docs/ only when asked, so a test run leaves the tree as it was.
    return ROOT / "docs" if os.environ.get("YUE2_UPDATE_SCREENSHOTS") == "1" else tmp_path


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


@pytest.fixture
def page(api: Any, browser: Any) -> Any:
    context = browser.new_context(viewport={"width": 1360, "height": 900}, accept_downloads=True)
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=api.url)
    yield context.new_page()
    context.close()


def sign_in(page: Any, url: str, key: str) -> None:
    """A refused key first (back to the login, shown nowhere), then `key`."""
    from playwright.sync_api import expect

    page.goto(f"{url}/ui")
    page.fill("#key", "yk-not-a-key")
    page.click("button[type=submit]")
    expect(page.locator("#login-error")).to_contain_text("refused")
    assert page.locator("#who").inner_text() == "" and page.evaluate("sessionStorage.length") == 0
    page.fill("#key", key)
    page.click("button[type=submit]")


def downloaded(page: Any, link: Any) -> bytes:
    """What clicking a file link saves: fetched with the console's key, handed to the browser as a download."""
    with page.expect_download() as info:
        link.click()
    return Path(info.value.path()).read_bytes()


def one_line(page: Any, selector: str) -> None:
    """Every element matching `selector` is one line high (no id wraps), and says its whole text on hover."""
    boxes = page.eval_on_selector_all(selector, """els => els.map((e) => ({h: e.getBoundingClientRect().height,
        line: parseFloat(getComputedStyle(e).lineHeight) || 20, ws: getComputedStyle(e).whiteSpace,
        whole: e.title === e.textContent}))""")
    assert boxes and all(b["h"] <= b["line"] * 1.5 and b["ws"] == "nowrap" and b["whole"] for b in boxes), boxes


def fits(page: Any) -> None:
    """Nothing is wider than the window: no sideways scrolling, of the page or of the batch table
    (which scrolls by itself in a narrower window), however long the counts or ids."""
    assert page.evaluate("document.documentElement.scrollWidth") <= page.viewport_size["width"]
    assert page.eval_on_selector(".scroll-x", "e => e.scrollWidth <= e.clientWidth")


def test_the_console_shows_a_batch_reach_100_percent(api: Any, settings: Any, workers: Any, page: Any,
                                                     tmp_path: Path) -> None:
    from playwright.sync_api import expect

    key = new_key(settings, f"t-{uuid.uuid4().hex[:8]}")
    client = Client(api.url, key)
    exp = client.create_experiment(variants=[{"variant": "base"}, {"variant": "legal"}], name="console check")
    lines = "".join(f'{{"custom_id": "r{i:02d}", "reference": "the tenant pays rent", "body": {{"input": "Document '
                    f'{i}: the parties agree to the terms of the contract, and the tenant pays rent monthly."}}}}\n'
                    for i in range(60))
    lines += '{"custom_id": "empty", "body": {"input": ""}}\n'  # fails alone: the line browser shows it
    path = tmp_path / "requests.jsonl"
    path.write_text(lines)
    batch = client.create_batch(client.upload(path)["id"], experiment_id=exp["id"],
                                metadata={"name": "nightly contracts"})
    sign_in(page, api.url, key)
    row = page.locator(f'tr[data-batch="{batch["id"]}"]')
    row.wait_for(timeout=20_000)
    check_waiting(page, row, batch)
    workers(**ECHO), workers("--variant", "legal", **ECHO)
    seen = follow_progress(page, batch["id"], shots_dir(tmp_path))
    assert any(0 < int(p.rstrip("%")) < 100 for p in seen), seen  # it moved while the batch ran
    row.locator(".status.completed").wait_for(timeout=30_000)
    assert "succeeded 60" in row.inner_text() and "failed 1" in row.inner_text()
    expect(page.locator(f'[data-share="{batch["id"]}"]')).to_have_text(f"1 failed · {100 / 61:.1f}%")
    check_done(page, client, batch["id"], lines.encode(), shots_dir(tmp_path))
    row.locator("a[data-report]").click()
    frame = page.frame_locator("#report-frame")
    expect(frame.locator("body")).to_contain_text("legal - base", timeout=60_000)  # the report's comparison
    # Sandboxed, no scripts, an opaque origin: this page cannot reach into it, nor it into this page's key.
    assert page.locator("#report-frame").get_attribute("sandbox") == ""
    assert page.evaluate("document.getElementById('report-frame').contentDocument === null")
    page.screenshot(path=str(shots_dir(tmp_path) / "console.png"), full_page=True)
    # The report on its own fits a 1,280-pixel window.
    report = page.context.new_page()
    report.set_viewport_size({"width": 1280, "height": 800})
    report.set_content(client.experiment_report_html(exp["id"]))
    assert report.evaluate("document.documentElement.scrollWidth") <= 1280
    page.click("#sign-out")  # the key leaves the tab and the header
    expect(page.locator("#login")).to_be_visible()
    assert page.locator("#who").inner_text() == "" and page.evaluate("sessionStorage.length") == 0
    print("progress seen on the page:", seen)


def check_waiting(page: Any, row: Any, batch: dict[str, Any]) -> None:
    """No worker yet: the batch waits, its detail is open (the newest batch), with its name, its
    whole id on one line, its times so far and its failed line (the browser opens on failures)."""
    from playwright.sync_api import expect

    expect(page.locator(f'[data-eta="{batch["id"]}"]')).to_have_text("waiting")
    expect(page.locator("#detail-title")).to_have_text(f"nightly contracts · {batch['id']}")
    assert "nightly contracts" in row.inner_text() and batch["id"] in row.inner_text()  # the whole id
    one_line(page, "code.id")
    row.locator("button.copy").click()
    assert page.evaluate("navigator.clipboard.readText()") == batch["id"]
    times = page.locator("#detail-times")
    expect(times.locator('[data-time="expires"] dd')).to_contain_text("(in 24.0 h)")
    expect(times.locator('[data-time="completed"] dd')).to_have_text("–")
    assert "(" in times.locator('[data-time="created"] dd').inner_text()
    expect(page.locator("#line-filters button.on")).to_have_text("failed1")
    lines = page.locator("#lines tbody")
    expect(lines).to_contain_text("empty")
    expect(lines).to_contain_text("body.input is required for a summarize job and must not be empty")
    # 1 failure in 61 lines is 1.6 % of the bar's 160 pixels, 2.6: it is drawn 4 wide, and said in words.
    bad = row.locator(".bar .bad").bounding_box()
    assert bad is not None and bad["width"] >= 4, bad
    expect(page.locator("#cancel")).to_be_visible()  # in progress: it can be cancelled


def follow_progress(page: Any, batch_id: str, shots: Path) -> list[str]:
    """The page's own polling moves the progress; record each value it shows until 100 %."""
    progress = page.locator(f'[data-progress="{batch_id}"]')
    seen, running_shot = [progress.inner_text()], False
    deadline = time.monotonic() + 180
    while seen[-1] != "100%":
        assert time.monotonic() < deadline, f"the page's progress stopped at {seen}"
        page.wait_for_timeout(100)
        if progress.inner_text() != seen[-1]:
            seen.append(progress.inner_text())
            if 0 < int(seen[-1].rstrip("%")) < 100 and not running_shot:
                page.screenshot(path=str(shots / "console-running.png"), full_page=True)
                running_shot = True
                fits(page)
    return seen


def check_done(page: Any, client: Client, batch_id: str, input_bytes: bytes, shots: Path) -> None:
    """The batch done: its final throughput, counts by variant and checkpoint, its times, its three
    files, and its lines browsed by status, 20 at a time."""
    from playwright.sync_api import expect

    throughput = page.locator(f'[data-throughput="{batch_id}"]')
    expect(throughput).to_contain_text("final")  # the batch's final average, which no longer moves
    stats = client._json(client.http.get(f"/v1/batches/{batch_id}/stats"))
    per_min = stats["throughput_per_s"] * 60
    assert throughput.inner_text().split("/min")[0] == (f"{per_min:.1f}" if per_min < 10 else f"{per_min:.0f}")
    variants = page.locator("#by-variant tbody").inner_text()
    assert "base" in variants and "legal" in variants
    assert "base@echo" in page.locator("#by-checkpoint").inner_text()
    expect(page.locator("#cancel")).to_be_hidden()  # completed: nothing to cancel
    expect(page.locator('#detail-times [data-time="completed"] dd')).not_to_have_text("–")
    assert page.locator('#detail-times [data-time="in progress"] dd').inner_text() != "–"
    links = page.locator("#detail-files a[data-file]")
    assert links.all_inner_texts() == ["input", "output", "errors"]
    assert downloaded(page, links.nth(0)) == input_bytes
    outputs = [json.loads(ln)["custom_id"] for ln in downloaded(page, links.nth(1)).splitlines()]
    assert sorted(outputs) == [f"r{i:02d}" for i in range(60)]
    assert [json.loads(ln)["custom_id"] for ln in downloaded(page, links.nth(2)).splitlines()] == ["empty"]
    page.locator("#lines-box").screenshot(path=str(shots / "console-errors.png"))
    page.click('#line-filters button[data-filter="succeeded"]')
    info, rows = page.locator("#lines-info"), page.locator("#lines tbody tr")
    expect(info).to_have_text("1–20 of 60")
    expect(rows.first).to_contain_text("r00")
    page.click("#lines-next")
    expect(info).to_have_text("21–40 of 60")
    expect(rows.first).to_contain_text("r20")
    assert rows.count() == 20 and "Document 20: the parties agree to" in rows.first.inner_text()  # its output
    page.click("#lines-prev")
    expect(info).to_have_text("1–20 of 60")
    fits(page)


def test_the_console_pages_searches_and_cancels_with_a_confirmation(api: Any, settings: Any, page: Any,
                                                                    tmp_path: Path) -> None:
    """No worker: 300 lines of which 4 fail at once, and 24 small batches after it."""
    from playwright.sync_api import expect

    key = new_key(settings, f"t-{uuid.uuid4().hex[:8]}")
    client = Client(api.url, key)
    path = tmp_path / "big.jsonl"
    path.write_text("".join(f'{{"custom_id": "l{i:03d}", "body": {{"input": "{"" if i % 75 == 0 else "text"}"}}}}\n'
                            for i in range(300)))
    big = client.create_batch(client.upload(path)["id"], metadata={"name": "big one"})["id"]
    path.write_text('{"custom_id": "a", "body": {"input": "text"}}\n')
    small = [client.create_batch(client.upload(path)["id"], metadata={"name": f"batch {i:02d}"})["id"]
             for i in range(24)]
    refused: list[str] = []  # 429s: the page must keep under the tenant's cap on requests in flight
    page.on("response", lambda r: refused.append(r.url) if r.status == 429 else None)
    sign_in(page, api.url, key)
    rows = page.locator("tr.batch")
    expect(rows).to_have_count(20)  # the default page
    page.select_option("#page-size", "100")
    expect(rows).to_have_count(25)
    page.select_option("#page-size", "10")
    expect(rows.first).to_have_attribute("data-batch", small[23])
    expect(rows).to_have_count(10)
    assert page.locator("#newer").is_disabled()
    page.click("#older")
    expect(rows.first).to_have_attribute("data-batch", small[13])
    expect(page.locator("#page-info")).to_have_text("page 2")
    page.screenshot(path=str(shots_dir(tmp_path) / "console-paging.png"))
    fits(page)
    page.click("#older")
    expect(rows).to_have_count(5)
    assert rows.last.get_attribute("data-batch") == big and page.locator("#older").is_disabled()
    page.click("#newer")
    expect(rows.first).to_have_attribute("data-batch", small[13])
    page.fill("#search", "BATCH 07")  # by name, whatever the case
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-batch", small[7])
    expect(page.locator("#page-info")).to_have_text("page 1")  # a new search starts at its newest
    page.fill("#search", big[-10:])  # by a piece of the id
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-batch", big)
    page.fill("#search", "no such batch")
    expect(page.locator("#batches tbody")).to_contain_text("No batch's name or id contains “no such batch”.")
    page.fill("#search", "big")
    expect(rows).to_have_count(1)
    check_failed_share(page, big)
    check_cancel(page, client, big, shots_dir(tmp_path))
    assert not refused and page.locator("#notice").inner_text() == "", refused


def check_failed_share(page: Any, batch_id: str) -> None:
    """4 failures in 300 lines: 2.1 pixels of the bar's 160, drawn 4 wide, and said beside it."""
    from playwright.sync_api import expect

    expect(page.locator(f'[data-share="{batch_id}"]')).to_have_text("4 failed · 1.3%")
    row = page.locator(f'tr[data-batch="{batch_id}"]')
    bar, bad = row.locator(".bar").bounding_box(), row.locator(".bar .bad").bounding_box()
    assert bad is not None and bar is not None and bad["width"] >= 4, bad
    assert bad["x"] + bad["width"] <= bar["x"] + bar["width"] + 0.5  # inside the bar, not cut off
    one_line(page, "code.id")


def check_cancel(page: Any, client: Client, batch_id: str, shots: Path) -> None:
    """The cancel button asks first: "Keep it running" leaves the batch as it was; confirming
    cancels it through POST /v1/batches/{id}/cancel, and the page shows it cancelled."""
    from playwright.sync_api import expect

    posts: list[str] = []
    page.on("request", lambda r: posts.append(r.url) if r.method == "POST" else None)
    page.locator(f'tr[data-batch="{batch_id}"]').click()
    expect(page.locator("#detail-title")).to_have_text(f"big one · {batch_id}")
    dialog = page.locator("#confirm-cancel")
    page.click("#cancel")
    expect(dialog).to_be_visible()
    expect(page.locator("#confirm-what")).to_have_text(f"big one · {batch_id}")
    page.screenshot(path=str(shots / "console-cancel.png"))
    page.click("#confirm-no")
    expect(dialog).to_be_hidden()
    assert client.batch(batch_id)["status"] == "in_progress"
    page.click("#cancel")
    page.click("#confirm-yes")
    row = page.locator(f'tr[data-batch="{batch_id}"]')
    row.locator(".status.cancelled").wait_for(timeout=20_000)
    assert client.batch(batch_id)["status"] == "cancelled"
    assert posts == [f"{page.url.rsplit('/ui', 1)[0]}/v1/batches/{batch_id}/cancel"]  # one: "keep" sent none
    expect(page.locator("#cancel")).to_be_hidden()
    expect(page.locator('#detail-times [data-time="cancelled"] dd')).not_to_have_text("–")
    expect(page.locator(f'[data-share="{batch_id}"]')).to_have_text("4 failed · 1.3% · 296 cancelled · 99%")
    page.click('#line-filters button[data-filter="cancelled"]')
    expect(page.locator("#lines-info")).to_have_text("1–20 of 296")
    expect(page.locator("#lines tbody tr").first).to_contain_text("the batch was cancelled before this request ran")
