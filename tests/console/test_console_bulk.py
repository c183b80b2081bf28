"""Retry or delete every item a filter matches, from the items page: the button says how
many, the confirmation says what happens, and the flash what was done."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.helpers.api import Api
from tests.helpers.console import browser_sign_in
from tests.helpers.items import quarantine

pytestmark = [pytest.mark.timeout(300), pytest.mark.live]


def test_select_all_matching_retries_the_quarantined_items_then_deletes_the_finished(
    page: Page, api: Api
) -> None:
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(3)]
    quarantine(api, "other")
    browser_sign_in(page, api.url, api.keys["operator"])
    page.goto(f"{api.url}/console/tenants/acme/items?queue=q&state=quarantined")
    page.get_by_role("button", name="Retry all 3 matching…").click()
    expect(
        page.get_by_role("heading", name="Retry all 3 quarantined items matching?")
    ).to_be_visible()
    page.get_by_role("button", name="Confirm: retry 3").click()
    expect(page.get_by_role("status")).to_have_text("Retried 3 items.")
    for item_id in poisoned:
        assert api.operator.get(f"/v1/tenants/acme/items/{item_id}").json()["state"] == "ready"
    other = api.operator.get("/v1/tenants/acme/items", params={"queue": "other"}).json()
    assert [i["state"] for i in other["items"]] == ["quarantined"]  # not in the filter
    # Back on the filtered page: nothing left to retry.
    expect(page.get_by_role("button", name="Retry all 0 matching…")).to_be_disabled()

    for _ in poisoned:
        (lease,) = api.acquire("q")
        api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    page.goto(f"{api.url}/console/tenants/acme/items?queue=q&state=completed")
    page.get_by_role("button", name="Delete all 3 matching…").click()
    page.get_by_role("button", name="Confirm: delete 3").click()
    expect(page.get_by_role("status")).to_have_text("Deleted 3 items.")
    for item_id in poisoned:
        assert api.operator.get(f"/v1/tenants/acme/items/{item_id}").status_code == 404
    verified = api.operator.get("/v1/tenants/acme/ledger-verification").json()
    assert verified["mismatches"] == []


def test_a_bulk_retry_past_the_cap_says_where_it_stopped(page: Page, api: Api) -> None:
    for n in range(3):
        quarantine(api, "q", f"p{n}")
    api.enqueue("q", "holds the backlog")
    assert api.admin.put("/v1/tenants/acme", json={"backlog_cap": 2}).status_code == 200
    browser_sign_in(page, api.url, api.keys["operator"])
    page.goto(f"{api.url}/console/tenants/acme/items?state=quarantined")
    page.get_by_role("button", name="Retry all 3 matching…").click()
    page.get_by_role("button", name="Confirm: retry 3").click()
    expect(page.get_by_role("status")).to_contain_text(
        "Retried 1 item. Stopped: the backlog is at its cap of 2"
    )
    assert api.admin.get("/v1/tenants/acme").json()["backlog"] == 2
