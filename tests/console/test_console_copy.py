"""A row shows an id's end; its copy button puts the whole id on the clipboard."""

from __future__ import annotations

import pytest
from playwright.sync_api import BrowserContext, Page, expect

from tests.helpers.api import Api
from tests.helpers.console import browser_sign_in

pytestmark = [pytest.mark.timeout(300), pytest.mark.live]


def test_the_copy_button_copies_the_whole_id(page: Page, context: BrowserContext, api: Api) -> None:
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=api.url)
    item_id = str(api.enqueue("mail", "x")["item_id"])
    browser_sign_in(page, api.url, api.keys["operator"])
    page.goto(f"{api.url}/console/tenants/acme/items")
    expect(page.get_by_role("link", name=f"…{item_id[-12:]}")).to_be_visible()
    button = page.get_by_role("button", name=f"Copy the id {item_id}")
    button.click()
    expect(button).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == item_id
