"""The queues page keeps itself current: its numbers and its last-hour chart change while
items are enqueued and completed, with no navigation, and a pause stops it."""

from __future__ import annotations

import uuid

import pytest
from playwright.sync_api import Page, expect

from tests.helpers.api import Api, setup_tenant
from tests.helpers.console import browser_sign_in, sign_in
from tests.helpers.server import LiveServer

pytestmark = [pytest.mark.timeout(300), pytest.mark.live]


def _complete(api: Api, queue: str, n: int) -> None:
    for _ in range(n):
        (lease,) = api.acquire(queue)
        done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        assert done.status_code == 200, done.text


def test_the_queues_page_counts_and_draws_what_happens_without_a_reload(
    page: Page, live: LiveServer, api: Api
) -> None:
    api.enqueue("mail", "first")
    browser_sign_in(page, live.url, api.keys["operator"])
    page.goto(f"{live.url}/console/tenants/acme/queues")
    loaded = page.evaluate("performance.timeOrigin")
    ready = page.locator('[data-live="mail|ready"]')
    completed = page.locator('[data-live="mail|completed"]')
    done_line = page.locator('svg[data-chart="mail"] polyline.done')
    expect(ready).to_have_text("1")
    expect(page.locator("[data-live-status]")).to_have_text("live")
    before = done_line.get_attribute("points")

    response = api.worker.post(
        "/v1/tenants/acme/queues/mail/items:batch",
        json={"items": [{"payload": n} for n in range(50)]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 201, response.text
    expect(ready).to_have_text("51", timeout=5_000)
    _complete(api, "mail", 20)
    expect(completed).to_have_text("20", timeout=5_000)
    expect(ready).to_have_text("31", timeout=5_000)
    expect(page.locator('svg[data-chart="mail"]')).to_have_attribute(
        "data-peak", "20", timeout=5_000
    )
    assert done_line.get_attribute("points") != before
    assert page.evaluate("performance.timeOrigin") == loaded  # the same page: no reload

    # Paused, it stops asking; live again, it catches up.
    page.get_by_role("button", name="Stop updating").click()
    expect(page.locator("[data-live-status]")).to_have_text("paused")
    api.enqueue("mail", "while paused")
    page.wait_for_timeout(3_000)
    expect(ready).to_have_text("31")
    page.get_by_role("button", name="Update live").click()
    expect(ready).to_have_text("32", timeout=5_000)


def test_the_live_numbers_are_the_pages_own_and_another_tenants_are_not_found(
    api: Api,
) -> None:
    api.enqueue("mail", "x")
    _complete(api, "mail", 1)
    client, _ = sign_in(api.url, api.keys["operator"])
    answer = client.get("/console/tenants/acme/queues/live")
    assert answer.status_code == 200
    assert answer.headers["Cache-Control"] == "no-store"
    body = answer.json()
    assert body["values"]["mail|completed"] == "1"
    assert body["values"]["mail|ready"] == "0"
    chart = body["charts"]["mail"]
    assert len(chart["completed"].split()) == 60  # a point a minute, the last hour
    assert (chart["peak"], chart["done_hour"], chart["failed_hour"]) == (1, 1, 0)
    # The page draws the same chart without its script.
    page = client.get("/console/tenants/acme/queues").text
    assert f'points="{chart["completed"]}"' in page
    other = setup_tenant(api.url, api.admin, "globex")
    assert other.tenant == "globex"
    assert client.get("/console/tenants/globex/queues/live").status_code == 404


def test_an_item_page_and_the_dead_letters_follow_what_happens_without_a_reload(
    page: Page, api: Api
) -> None:
    item = api.enqueue("mail", "x")
    browser_sign_in(page, api.url, api.keys["operator"])
    page.goto(f"{api.url}/console/tenants/acme/items/{item['item_id']}")
    loaded = page.evaluate("performance.timeOrigin")
    heading = page.get_by_role("heading", level=1)
    expect(heading).to_contain_text("ready")
    (lease,) = api.acquire("mail", worker="w9")
    expect(heading).to_contain_text("leased", timeout=5_000)
    expect(page.get_by_text("w9 leased it, fence 1.")).to_be_visible(timeout=5_000)
    failure = {"class": "ValueError", "message": "bad", "transient": False}
    api.holder("triage", item["item_id"], worker="w9", fence=lease["fence"], failure=failure,
               decision="quarantine")  # fmt: skip
    expect(heading).to_contain_text("quarantined", timeout=5_000)
    expect(
        page.get_by_text("w9 reported ValueError: bad, fence 1, and quarantined it.")
    ).to_be_visible()
    assert page.evaluate("performance.timeOrigin") == loaded

    page.goto(f"{api.url}/console/tenants/acme/dead-letters")
    loaded = page.evaluate("performance.timeOrigin")
    rows = page.locator('[data-live-region="list"] tbody tr')
    expect(rows).to_have_count(1)
    page.get_by_role("checkbox").first.check()  # the reader is choosing: left alone
    second = api.enqueue("mail", "y")
    (lease,) = api.acquire("mail", worker="w9")
    assert lease["item_id"] == second["item_id"]
    api.holder("triage", second["item_id"], worker="w9", fence=lease["fence"], failure=failure,
               decision="quarantine")  # fmt: skip
    page.wait_for_timeout(3_000)
    expect(rows).to_have_count(1)
    page.get_by_role("checkbox").first.uncheck()
    expect(rows).to_have_count(2, timeout=5_000)
    assert page.evaluate("performance.timeOrigin") == loaded
