"""The console in a real browser (Debian's Chromium through Playwright): what an operator
does, clicked and read as they would."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Page, ViewportSize, expect

from queue_server.client import QueueClient
from queue_server.client.worker import Job, Result, Worker
from tests.helpers.api import Api
from tests.helpers.console import browser_sign_in as sign_in
from tests.helpers.items import enqueue_graph, quarantine

# The first test may install chromium with apt-get.
# A browser loads the pages over a socket.
pytestmark = [pytest.mark.timeout(600), pytest.mark.live]

PHONE: ViewportSize = {"width": 390, "height": 844}


def fits_the_width(page: Page) -> bool:
    """Nothing but a table's own scroller is wider than the window."""
    return bool(page.evaluate("document.documentElement.scrollWidth <= window.innerWidth"))


def test_operator_signs_in_and_sees_the_queues(page: Page, api: Api, shots: Path) -> None:
    quarantine(api, "emails")
    api.enqueue("emails", {"to": "a@example.com"})
    sign_in(page, api.url, api.keys["operator"])
    expect(page.get_by_role("status")).to_have_text("Signed in.")
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    row = page.get_by_role("row").filter(has_text="emails")
    expect(row).to_contain_text("1")  # one ready, one quarantined
    expect(page.get_by_role("link", name="1 open dead letter")).to_be_visible()
    page.screenshot(path=str(shots / "queues.png"), full_page=True)

    page.get_by_role("button", name="Sign out").click()
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.goto(f"{api.url}/console/tenants/acme/queues")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


def test_a_worker_key_is_refused(page: Page, api: Api) -> None:
    sign_in(page, api.url, api.keys["worker"])
    expect(page.get_by_role("alert")).to_have_text(
        "A worker key cannot sign in to the console: use an operator or admin key."
    )
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    assert [c for c in page.context.cookies() if c["name"] == "qs_console"] == []
    page.goto(f"{api.url}/console/tenants/acme/dead-letters")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()


def test_replay_a_dead_letter_and_a_worker_completes_it(page: Page, api: Api, shots: Path) -> None:
    item_id = quarantine(api, "emails", {"to": "b@example.com"})
    quarantine(api, "emails", {"to": "c@example.com"})  # stays quarantined
    results: list[Result] = []

    def handler(job: Job) -> dict[str, str]:
        return {"sent_to": job.payload["to"]}

    client = QueueClient(api.url, api.keys["worker"], tenant="acme")
    worker = Worker(
        client, "emails", handler, name="console-test", wait=2, on_result=results.append
    )
    running = threading.Thread(target=worker.run, kwargs={"max_items": 1}, daemon=True)
    running.start()
    try:
        sign_in(page, api.url, api.keys["operator"])
        page.get_by_role("navigation").get_by_role("link", name="Dead letters").click()
        expect(page.get_by_role("heading", name="Dead letters")).to_be_visible()
        page.screenshot(path=str(shots / "dead-letters.png"), full_page=True)
        first = page.get_by_role("row").filter(has_text="quarantined by triage").first
        first.get_by_role("checkbox").check()
        page.get_by_role("button", name="Replay selected…").click()
        expect(page.get_by_role("heading", name="Replay 1 dead letter?")).to_be_visible()
        page.get_by_role("button", name="Confirm: replay").click()
        expect(page.get_by_role("status")).to_have_text("Replayed 1 dead letter.")
        # The other one is still open; the replayed one is gone from the open list.
        expect(page.get_by_role("row").filter(has_text="quarantined by triage")).to_have_count(1)

        running.join(timeout=20)
        assert not running.is_alive(), "the worker did not take the replayed item"
        assert [(r.item_id, r.outcome) for r in results] == [(item_id, "completed")]

        page.goto(f"{api.url}/console/tenants/acme/items/{item_id}")
        expect(page.get_by_role("heading", name=f"Item {item_id}")).to_contain_text("completed")
        timeline = page.get_by_role("list", name="Ledger")
        expect(timeline.get_by_role("listitem")).to_have_count(6)
        expect(timeline).to_contain_text("replayed")
        expect(timeline.get_by_role("listitem").last).to_contain_text("completed")
        expect(page.locator("pre.json").nth(1)).to_contain_text('"sent_to": "b@example.com"')
        page.screenshot(path=str(shots / "item.png"), full_page=True)
    finally:
        worker.stop()
        running.join(timeout=10)
        client.close()


def test_pages_fit_a_phone_screen(page: Page, api: Api, shots: Path) -> None:
    quarantine(api, "emails", {"to": "d@example.com"})
    page.set_viewport_size(PHONE)
    sign_in(page, api.url, api.keys["operator"])
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    for link in ("Queues", "Dead letters", "Watchers", "Spend & concurrency", "Verification runs"):
        page.get_by_role("navigation").get_by_role("link", name=link).click()
        expect(page.get_by_role("navigation").get_by_role("link", name=link)).to_have_attribute(
            "aria-current", "page"
        )
        assert fits_the_width(page), f"the {link} page is wider than a phone"
    page.get_by_role("navigation").get_by_role("link", name="Dead letters").click()
    page.screenshot(path=str(shots / "dead-letters-phone.png"), full_page=True)


def test_the_queues_table_fits_a_laptop_screen_to_its_last_column(page: Page, api: Api) -> None:
    """At 1366 px, the commonest laptop width, every column of the queues table (its
    actions last) is on screen without scrolling the table."""
    quarantine(api, "emails-to-customers", {"to": "f@example.com"})
    for n in range(3):
        api.enqueue("emails-to-customers", {"n": n})
    api.enqueue("thumbnails", {"n": 0})
    page.set_viewport_size({"width": 1366, "height": 768})
    sign_in(page, api.url, api.keys["operator"])
    expect(page.get_by_role("heading", name="Queues")).to_be_visible()
    wrap = page.locator("main .table-wrap").first
    assert wrap.evaluate("w => w.scrollWidth <= w.clientWidth"), "the queues table scrolls"
    for name in ("Settings of thumbnails", "Pause thumbnails"):
        box = page.get_by_role("link", name=name).or_(page.get_by_role("button", name=name))
        bounds = box.bounding_box()
        assert bounds is not None
        assert bounds["x"] + bounds["width"] <= 1366, (name, bounds)
    assert fits_the_width(page)


def test_spend_approval_watchers_and_verification_runs(page: Page, api: Api, shots: Path) -> None:
    api.enqueue("emails", {"to": "e@example.com"})
    run = api.worker.post(
        "/v1/tenants/acme/verification-runs",
        json={
            "artifact_version": "site-2.4.0",
            "verifier_version": "linkcheck-7",
            "items": ["a", "b"],
        },
    ).json()
    checkpoint = f"/v1/tenants/acme/verification-runs/{run['run_id']}/checkpoints/a"
    assert api.worker.put(checkpoint, json={"result": {"ok": True}}).status_code == 201
    watcher = api.operator.post(
        "/v1/tenants/acme/watchers",
        json={"url": "http://127.0.0.1:9/hook", "events": ["item.completed"]},
        headers={"Idempotency-Key": "w1"},
    )
    assert watcher.status_code == 201, watcher.text
    nav = page.get_by_role("navigation")
    sign_in(page, api.url, api.keys["operator"])

    nav.get_by_role("link", name="Spend & concurrency").click()
    page.get_by_label("Queue").fill("emails")
    page.get_by_label("Max concurrent leases").fill("4")
    soon = datetime.now(UTC) + timedelta(days=30)
    page.get_by_label("Expires (UTC)").fill(soon.strftime("%Y-%m-%dT%H:%M"))
    page.get_by_label("Reason").fill("launch week")
    page.get_by_role("button", name="Approve").click()
    expect(page.get_by_role("status")).to_have_text("Approved 4 concurrent leases on emails.")
    row = page.get_by_role("row").filter(has_text="launch week")
    expect(row.get_by_role("cell").nth(2)).to_have_text("4")
    limit = api.operator.get("/v1/tenants/acme/queues/emails/concurrency").json()
    assert limit["limit"] == 4
    # The queue's own concurrency, set live in its row below the approved limit.
    page.get_by_label("Concurrency of emails").fill("2")
    page.get_by_role("button", name="Set emails's concurrency").click()
    expect(page.get_by_role("status")).to_have_text("emails now leases at most 2 at a time.")
    expect(row.get_by_role("cell").nth(2)).to_have_text("2")
    limit = api.operator.get("/v1/tenants/acme/queues/emails/concurrency").json()
    assert (limit["limit"], limit["approved_limit"], limit["concurrency"]) == (2, 4, 2)
    page.screenshot(path=str(shots / "spend.png"), full_page=True)

    nav.get_by_role("link", name="Watchers").click()
    page.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("status")).to_have_text("Paused the watcher.")
    state = api.operator.get(f"/v1/tenants/acme/watchers/{watcher.json()['watcher_id']}")
    assert state.json()["state"] == "paused"
    page.get_by_role("button", name="Resume").click()
    expect(page.get_by_role("status")).to_have_text("Resumed the watcher.")
    page.screenshot(path=str(shots / "watchers.png"), full_page=True)

    nav.get_by_role("link", name="Verification runs").click()
    expect(page.get_by_role("row").filter(has_text="site-2.4.0")).to_contain_text("1 / 2")
    page.get_by_role("link", name=f"…{run['run_id'][-12:]}").click()
    expect(page.get_by_role("heading", name="Remaining (1)")).to_be_visible()
    page.screenshot(path=str(shots / "verification-run.png"), full_page=True)


def test_filter_items_and_cancel_a_leased_one(page: Page, api: Api, shots: Path) -> None:
    for n in range(3):
        api.enqueue("emails", {"to": f"user{n}@example.com", "campaign": "spring"})
    api.enqueue("invoices", {"to": "user1@example.com"})
    # One of the emails is leased: its worker will be refused after the cancel.
    (lease,) = api.acquire("emails", worker="w1")
    target = str(lease["item_id"])
    to = lease["payload"]["to"]  # type: ignore[index]

    sign_in(page, api.url, api.keys["operator"])
    page.get_by_role("navigation").get_by_role("link", name="Items").click()
    expect(page.get_by_role("row")).to_have_count(5)  # the header and four items
    page.get_by_label("Queue").fill("emails")
    page.get_by_label("Payload contains (JSON)").fill(f'{{"to": "{to}"}}')
    page.get_by_role("button", name="Filter").click()
    rows = page.get_by_role("row")
    expect(rows).to_have_count(2)
    expect(rows.nth(1)).to_contain_text("leased")
    page.screenshot(path=str(shots / "items.png"), full_page=True)

    rows.nth(1).get_by_role("link", name=f"…{target[-12:]}").click()
    expect(page.get_by_role("heading", name=f"Item {target}")).to_contain_text("leased")
    page.get_by_role("button", name="Cancel item…").click()
    expect(page.get_by_role("heading", name="Cancel 1 item?")).to_be_visible()
    page.get_by_label("Reason (kept in each item's ledger)").fill("customer unsubscribed")
    page.get_by_role("button", name="Confirm: cancel").click()
    expect(page.get_by_role("status")).to_have_text("Cancelled 1 item.")
    expect(page.get_by_role("heading", name=f"Item {target}")).to_contain_text("cancelled")
    last = page.get_by_role("list", name="Ledger").get_by_role("listitem").last
    expect(last).to_contain_text("cancelled")
    expect(last).to_contain_text("customer unsubscribed")

    refused = api.holder("complete", target, worker="w1", fence=lease["fence"], result="sent")
    assert refused.status_code == 409
    assert refused.json()["code"] == "item-cancelled"


def test_pause_and_resume_a_queue_while_a_worker_waits(page: Page, api: Api, shots: Path) -> None:
    api.enqueue("emails", {"to": "first@example.com"})
    results: list[Result] = []
    client = QueueClient(api.url, api.keys["worker"], tenant="acme")
    worker = Worker(
        client, "emails", lambda job: "sent", name="pause-test", wait=1, on_result=results.append
    )
    running = threading.Thread(target=worker.run, kwargs={"max_items": 2}, daemon=True)
    try:
        sign_in(page, api.url, api.keys["operator"])
        row = page.get_by_role("row").filter(has_text="emails")
        row.get_by_role("button", name="Pause emails").click()
        expect(page.get_by_role("heading", name="Pause emails?")).to_be_visible()
        page.get_by_label("Reason (kept in the ledger)").fill("provider outage")
        page.get_by_role("button", name="Confirm: pause").click()
        expect(page.get_by_role("status")).to_contain_text("Paused emails")
        expect(row).to_contain_text("paused")
        page.screenshot(path=str(shots / "queues-paused.png"), full_page=True)

        running.start()
        second = api.enqueue("emails", {"to": "second@example.com"})  # still admitted
        running.join(timeout=2.5)
        assert results == []  # nothing was handed out while paused
        assert (
            api.operator.get(f"/v1/tenants/acme/items/{second['item_id']}").json()["state"]
            == "ready"
        )

        row.get_by_role("button", name="Resume emails").click()
        expect(page.get_by_role("status")).to_have_text("Resumed emails.")
        running.join(timeout=20)
        assert not running.is_alive(), "the worker did not get the items after the resume"
        assert sorted(r.outcome for r in results) == ["completed", "completed"]
        page.reload()
        expect(row.get_by_role("cell").nth(3)).to_have_text("2")  # completed
    finally:
        worker.stop()
        if running.is_alive() or running.ident is not None:
            running.join(timeout=10)
        client.close()


def test_the_workflow_graph_is_drawn_and_a_click_on_an_item_opens_it(
    page: Page, api: Api, shots: Path
) -> None:
    fetch, _, _, publish = enqueue_graph(api)
    sign_in(page, api.url, api.keys["operator"])
    page.goto(f"{api.url}/console/tenants/acme/items/{fetch}")
    graph = page.get_by_role("img", name="The workflow: 4 items")
    expect(graph).to_be_visible()
    assert fits_the_width(page)
    page.screenshot(path=str(shots / "workflow.png"), full_page=True)
    page.locator(f'a[data-item="{publish}"]').click()
    expect(page.get_by_role("heading", name=f"Item {publish}")).to_be_visible()
    expect(page.get_by_role("region", name="Depends on")).to_contain_text("waiting")
    # Stopped as a whole from its first step: every item below it is cancelled with it.
    page.locator(f'a[data-item="{fetch}"]').click()
    page.get_by_role("button", name="Cancel item…").click()
    page.get_by_label("Also cancel every unfinished item that depends on it").check()
    page.get_by_role("button", name="Confirm: cancel").click()
    expect(page.get_by_role("status")).to_have_text("Cancelled 1 item.")
    states = page.locator("svg.workflow a")
    expect(states).to_have_count(4)
    for n in range(4):
        expect(states.nth(n)).to_have_attribute("data-state", "cancelled")
