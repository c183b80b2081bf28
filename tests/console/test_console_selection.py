"""Selecting rows of the items list for a retry or delete, in the browser: newest first,
three boxes checked, the selection retried and exactly those three ready; the live list
keeps the reader's boxes; "select all on this page" checks every row."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.helpers.api import Api
from tests.helpers.console import browser_sign_in
from tests.helpers.items import quarantine

pytestmark = [pytest.mark.timeout(300), pytest.mark.live]


def _state(api: Api, item_id: str) -> str:
    return str(api.operator.get(f"/v1/tenants/acme/items/{item_id}").json()["state"])


def test_three_checked_rows_are_retried_and_the_rest_untouched(page: Page, api: Api) -> None:
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(5)]
    ready = str(api.enqueue("q", "fine")["item_id"])
    browser_sign_in(page, api.url, api.keys["operator"])
    page.goto(f"{api.url}/console/tenants/acme/items")

    # Newest first: the ready item (made last), then the quarantined ones, newest first.
    boxes = page.locator('[data-live-region="list"] input[name="item_id"]')
    expect(boxes).to_have_count(6)
    assert [boxes.nth(n).get_attribute("value") for n in range(6)] == [ready, *poisoned[::-1]]
    expect(page.get_by_role("columnheader", name="Created ▼")).to_have_attribute(
        "aria-sort", "descending"
    )

    chosen = [poisoned[0], poisoned[2], poisoned[3]]
    for item_id in chosen:
        page.get_by_role("checkbox", name=f"Select {item_id}").check()
    # The list updates live, but not under the reader's checked boxes.
    api.enqueue("q", "arrives while choosing")
    page.wait_for_timeout(3_000)
    expect(boxes).to_have_count(6)
    for item_id in chosen:
        expect(page.get_by_role("checkbox", name=f"Select {item_id}")).to_be_checked()

    page.get_by_role("button", name="Retry selected…").click()
    expect(page.get_by_role("heading", name="Retry 3 selected items?")).to_be_visible()
    covered = page.get_by_role("list", name="Items to retry")
    for item_id in chosen:
        expect(covered).to_contain_text(item_id)
    page.get_by_role("button", name="Confirm: retry 3").click()
    expect(page.get_by_role("status")).to_have_text("Retried 3 items.")

    for item_id in chosen:
        assert _state(api, item_id) == "ready"
    for item_id in (poisoned[1], poisoned[4]):
        assert _state(api, item_id) == "quarantined"
    assert _state(api, ready) == "ready"
    assert api.admin.get("/v1/tenants/acme").json()["backlog"] == 5


def test_select_all_on_the_page_then_delete_leaves_what_is_not_finished(
    page: Page, api: Api
) -> None:
    done = []
    for n in range(2):
        api.enqueue("q", n)
        (lease,) = api.acquire("q")
        api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        done.append(str(lease["item_id"]))
    ready = str(api.enqueue("q", "fine")["item_id"])
    browser_sign_in(page, api.url, api.keys["operator"])
    page.goto(f"{api.url}/console/tenants/acme/items")
    page.get_by_role("checkbox", name="Select all on this page").check()
    boxes = page.locator('[data-live-region="list"] input[name="item_id"]')
    for n in range(3):
        expect(boxes.nth(n)).to_be_checked()

    page.get_by_role("button", name="Delete selected…").click()
    expect(page.get_by_role("heading", name="Delete 2 selected items?")).to_be_visible()
    expect(page.get_by_role("list", name="Items left as they are")).to_contain_text(ready)
    page.get_by_role("button", name="Confirm: delete 2").click()
    expect(page.get_by_role("status")).to_have_text("Deleted 2 items.")
    for item_id in done:
        assert api.operator.get(f"/v1/tenants/acme/items/{item_id}").status_code == 404
    assert _state(api, ready) == "ready"
