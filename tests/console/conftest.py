"""One headless Chromium per module of browser tests: Debian's package at /usr/bin/chromium, driven by
Playwright. Never Playwright's own browser download. A missing browser that cannot be
installed fails the run with a clear message; it is never skipped."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from playwright.sync_api import Browser, BrowserContext, Page, expect, sync_playwright

from queue_server.settings import Settings
from tests.helpers.server import make_admin_key

# The suite runs beside these tests on two cores: a page may take longer than
# Playwright's 5 s to draw there, as actions may (the context's 10 s below).
expect.set_options(timeout=10_000)

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ENSURE = REPO / "deploy" / "ensure-debian-packages.sh"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# Screenshots of the main pages: to the directory named here (docs/console by
# `make console-screenshots`), else to the test's temporary directory.
SCREENSHOTS_ENV = "QUEUE_SERVER_CONSOLE_SCREENSHOTS"


def _ensure_chromium() -> None:
    if CHROMIUM.exists():
        return
    done = subprocess.run(
        [str(ENSURE), "chromium"], capture_output=True, text=True, check=False, timeout=900
    )
    if done.returncode != 0 or not CHROMIUM.exists():
        pytest.fail(
            "The console's browser tests need Debian's chromium at /usr/bin/chromium and it"
            f" could not be installed ({ENSURE.name} chromium exited {done.returncode}):\n"
            f"{done.stderr.strip()}\nInstall it with: apt-get install -y chromium",
            pytrace=False,
        )


# One browser for the module of browser tests. Not for the whole session: while Playwright's
# sync API is started it keeps an event loop marked running in this thread, and the tests
# after it that call asyncio.run (admin keys, delivery runs) would fail.
@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    _ensure_chromium()
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True
        )
        yield launched
        launched.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.set_default_timeout(10_000)
    yield ctx
    ctx.close()


@pytest.fixture
def page(context: BrowserContext) -> Page:
    return context.new_page()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    target = os.environ.get(SCREENSHOTS_ENV)
    if not target:
        return tmp_path
    path = Path(target)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def admin_key(settings: Settings, database_url: str) -> str:
    # Playwright's sync API keeps an event loop running in this thread: asyncio.run elsewhere.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(make_admin_key, settings, database_url).result()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # Watchers may name a loopback URL here (nothing delivers in these tests).
    return Settings(
        data_dir=tmp_path, poll_interval=0.2, lock_timeout_ms=2000, transport_allow=["127.0.0.1"]
    )
