"""The queues page in a real browser while another session holds an old snapshot: the warning
appears without a reload once the snapshot is older than the threshold, and goes with it."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from queue_server.settings import Settings
from tests.helpers.api import Api
from tests.helpers.console import browser_sign_in
from tests.helpers.database import held_snapshot

# A browser loads the pages over a socket.
pytestmark = [pytest.mark.timeout(600), pytest.mark.live]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    """The suite's settings with a warning after two seconds of a held snapshot."""
    return Settings(
        data_dir=tmp_path, poll_interval=0.2, lock_timeout_ms=2000, horizon_warning_age=2.0
    )


def test_the_queues_page_shows_a_held_snapshot_while_it_is_held(
    page: Page, api: Api, database_url: str, shots: Path
) -> None:
    api.enqueue("emails", {"to": "a@example.com"})
    browser_sign_in(page, api.url, api.keys["operator"])
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    warning = page.get_by_role("alert")
    expect(warning).to_have_count(0)

    with held_snapshot(database_url):
        # The page updates itself every two seconds: no reload.
        expect(warning).to_contain_text("held an old snapshot", timeout=15_000)
        expect(warning).to_be_visible()
        expect(warning).to_contain_text("operators' guide")
        page.screenshot(path=str(shots / "queues-held-snapshot.png"), full_page=True)

    expect(warning).to_have_count(0, timeout=15_000)
