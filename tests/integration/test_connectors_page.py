"""Issue 14 item 4: the connectors page in a real headless Chromium (Debian's package,
driven by Playwright's Python API with ``executable_path``; no browser is downloaded).
A sidecar connects and appears online, a running job shows in flight, the sidecar stops
and its row goes offline. The screenshot is saved beside the test's other files, and as
docs/img/connectors.png (linked from docs/operations.md) only when
``DESKBRIDGE_UPDATE_DOCS=1``: a test run leaves the checkout as it found it."""

from __future__ import annotations

import os
import secrets
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from tests.procs import API_KEY, Hub, Sidecar, api, issue, running

pytestmark = pytest.mark.integration

CHROMIUM = os.environ.get("DESKBRIDGE_TEST_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "img" / "connectors.png"
WAIT_MS = 20_000


def test_connectors_page_live(tmp_path: Path) -> None:
    if not shutil.which(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: .ci/run installs Debian's chromium package")
    from playwright.sync_api import expect, sync_playwright

    tag = secrets.token_hex(3)
    user = f"laptop-{tag}"
    hub = Hub(tmp_path, workers=1)
    with running(hub), api() as client, ThreadPoolExecutor(1) as pool, sync_playwright() as p:
        hub.wait_healthy()
        # Without the key: 401 with a Basic challenge (the browser asks once).
        r = httpx.get(hub.http + "/admin/")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            page = browser.new_context(
                http_credentials={"username": "admin", "password": API_KEY},
                viewport={"width": 1200, "height": 420},
            ).new_page()
            page.goto(hub.http + "/admin/")
            expect(page.locator("h1")).to_have_text("deskbridge connectors")
            expect(page.locator("#summary")).to_contain_text("desktops", timeout=WAIT_MS)
            row = page.locator(f'tr[data-user="{user}"]')
            assert row.count() == 0

            sidecar = Sidecar(tmp_path, hub.ws, issue(user))  # starts the process
            with running(sidecar):
                expect(row).to_have_attribute("data-state", "online", timeout=WAIT_MS)
                expect(row).to_contain_text("echo")
                expect(row).to_contain_text("online")
                job_id = f"page-job-{tag}"
                job = pool.submit(
                    client.post,
                    f"{hub.http}/v1/users/{user}/jobs",
                    json={"name": "sleep", "args": {"seconds": 6}, "job_id": job_id},
                )
                expect(row.locator("td.jobs")).to_contain_text(job_id, timeout=WAIT_MS)
                page.screenshot(path=str(tmp_path / "connectors.png"), full_page=True)
                if os.environ.get("DESKBRIDGE_UPDATE_DOCS") == "1":
                    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(tmp_path / "connectors.png", SCREENSHOT)
                assert job.result(timeout=30).json()["status"] == "completed"
                expect(row.locator("td.jobs")).not_to_contain_text(job_id, timeout=WAIT_MS)
            # The sidecar stopped: offline, and the page says since when.
            expect(row).to_have_attribute("data-state", "offline", timeout=WAIT_MS)
            expect(row).to_contain_text("offline")
            expect(row).to_contain_text("ago")
            assert page.locator("#error").text_content() == ""
        finally:
            browser.close()
    assert SCREENSHOT.stat().st_size > 10_000
