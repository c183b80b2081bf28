"""At a phone's width the lists are cards: every action of the items and dead-letters
pages is on screen, and so is a dead letter's failure reason; the tabs wrap, in two rows."""

from __future__ import annotations

import pytest
from playwright.sync_api import Locator, Page, ViewportSize, expect

from tests.helpers.api import Api
from tests.helpers.console import browser_sign_in
from tests.helpers.items import quarantine

pytestmark = [pytest.mark.timeout(300), pytest.mark.live]
PHONE: ViewportSize = {"width": 390, "height": 844}


def _on_screen(control: Locator) -> None:
    control.scroll_into_view_if_needed()
    box = control.bounding_box()
    assert box is not None, control
    assert box["x"] >= 0, (control, box)
    assert box["x"] + box["width"] <= PHONE["width"], (control, box)


def test_every_action_of_the_lists_is_on_a_phone_screen(page: Page, api: Api) -> None:
    quarantine(api, "emails", {"to": "d@example.com"})
    for n in range(3):
        api.enqueue("emails", {"n": n})
    page.set_viewport_size(PHONE)
    browser_sign_in(page, api.url, api.keys["operator"])

    page.goto(f"{api.url}/console/tenants/acme/items?state=quarantined")
    controls = page.locator("main button, main input[type=checkbox], main td a")
    assert controls.count() >= 3
    for i in range(controls.count()):
        if controls.nth(i).is_visible():
            _on_screen(controls.nth(i))
    page.goto(f"{api.url}/console/tenants/acme/items")
    boxes = page.locator("main input[type=checkbox]")
    assert boxes.count() == 5  # a box per row, and "select all on this page"
    for i in range(boxes.count()):
        _on_screen(boxes.nth(i))

    page.goto(f"{api.url}/console/tenants/acme/dead-letters")
    failure = page.locator("td.failure").first
    expect(failure).to_be_visible()
    expect(failure).to_contain_text("poisoned")
    _on_screen(failure)
    for name in ("Replay selected…", "Discard selected…"):
        _on_screen(page.get_by_role("button", name=name))
    _on_screen(page.locator("main input[type=checkbox]").first)

    # Every tab of the navigation is on screen too: the bar wraps, in two rows at most.
    tabs = page.get_by_role("navigation").get_by_role("link")
    rows = set()
    for i in range(tabs.count()):
        _on_screen(tabs.nth(i))
        box = tabs.nth(i).bounding_box()
        assert box is not None
        rows.add(round(box["y"]))
    assert len(rows) <= 2, f"the tabs take {len(rows)} rows on a phone"
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
