"""A queue's charts in a real browser: they follow what happens without a reload, the span
switch works with and without the script, and the console is readable in the dark. With
QUEUE_SERVER_CONSOLE_SCREENSHOTS set (`make console-screenshots`) this draws the
screenshots of docs/console.md: the charts in the light, in the dark and on a phone."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.helpers import charts
from tests.helpers.api import Api
from tests.helpers.console import browser_sign_in
from tests.helpers.items import quarantine

pytestmark = [pytest.mark.timeout(300), pytest.mark.live]

Db = psycopg.Connection[dict[str, Any]]
PHONE: ViewportSize = {"width": 390, "height": 844}


def _complete(api: Api, queue: str, n: int) -> None:
    for _ in range(n):
        (lease,) = api.acquire(queue)
        done = api.holder("complete", str(lease["item_id"]), worker="w1", fence=lease["fence"])
        assert done.status_code == 200, done.text


def _drawn(page: Page, key: str, steps: int = 60) -> dict[str, list[float | None]]:
    svg = page.locator(f'svg[data-figure="{key}"]').evaluate("e => e.outerHTML")
    return charts.series(str(svg), steps)


def test_a_queues_charts_follow_enqueues_and_completions_without_a_reload(
    page: Page, api: Api
) -> None:
    api.enqueue("mail", "first")
    browser_sign_in(page, api.url, api.keys["operator"])
    page.goto(f"{api.url}/console/tenants/acme/queues")
    page.get_by_role("link", name="Charts of mail").click()
    expect(page.get_by_role("heading", name="mail")).to_be_visible()
    loaded = page.evaluate("performance.timeOrigin")
    depth = page.locator('svg[data-figure="ready"]')
    expect(depth).to_have_attribute("aria-label", "Ready items, the last hour: 1 now, at most 1.")
    expect(page.locator("[data-live-status]")).to_have_text("live")

    response = api.worker.post(
        "/v1/tenants/acme/queues/mail/items:batch",
        json={"items": [{"payload": n} for n in range(50)]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 201, response.text
    expect(depth).to_have_attribute(
        "aria-label", "Ready items, the last hour: 51 now, at most 51.", timeout=5_000
    )
    assert round(_drawn(page, "ready")["ready"][-1] or 0) == 51
    _complete(api, "mail", 20)
    expect(page.locator('[data-live="completed"]')).to_have_text("20", timeout=5_000)
    # The sweeper samples every 5 s: the 51 may or may not have been sampled meanwhile.
    expect(depth).to_have_attribute(
        "aria-label",
        re.compile(r"^Ready items, the last hour: 31 now, at most (31|51)\.$"),
        timeout=5_000,
    )
    done = _drawn(page, "throughput")["done"]
    assert round(sum(v or 0 for v in done[-2:])) == 20
    assert page.evaluate("performance.timeOrigin") == loaded  # the same page: no reload

    # The day, in place: the address follows, the figures are the day's.
    page.get_by_role("navigation", name="Chart span").get_by_role("link", name="24 h").click()
    expect(page.locator('svg[data-figure="ready"]')).to_have_attribute(
        "aria-label", re.compile(r"^Ready items, the last day: 31 now"), timeout=5_000
    )
    expect(page.locator('svg[data-figure="ready"] .tick').nth(2)).to_have_text("24 h ago")
    expect(page.get_by_role("link", name="24 h")).to_have_attribute("aria-current", "page")
    assert page.url.endswith("/charts?span=24h")
    assert page.evaluate("performance.timeOrigin") == loaded


def test_the_span_switch_is_a_link_without_the_script(browser: Browser, api: Api) -> None:
    api.enqueue("mail", "first")
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        browser_sign_in(page, api.url, api.keys["operator"])
        page.goto(f"{api.url}/console/tenants/acme/queues/mail/charts")
        page.get_by_role("link", name="24 h").click()
        expect(page.get_by_role("link", name="24 h")).to_have_attribute("aria-current", "page")
        expect(page.locator('svg[data-figure="ready"]')).to_have_attribute(
            "aria-label", "Ready items, the last day: 1 now, at most 1."
        )
    finally:
        context.close()


COLOURS = """() => {
  const css = (el, prop) => el ? getComputedStyle(el)[prop] : null;
  return {
    page: css(document.documentElement, "backgroundColor"),
    text: css(document.documentElement, "color"),
    card: css(document.querySelector(".card, .table-wrap"), "backgroundColor"),
    tabs: css(document.querySelector("nav.tabs"), "backgroundColor"),
    line: css(document.querySelector("svg.figure path.ready"), "stroke"),
    tick: css(document.querySelector("svg.figure .tick"), "fill"),
  };
}"""


def test_the_console_is_drawn_dark_when_the_system_asks(
    browser: Browser, api: Api, db: Db, shots: Path
) -> None:
    charts.seed_history(db, "acme", "emails")
    failed = quarantine(api, "emails", {"to": "a@example.com"})
    for n in range(3):
        api.enqueue("emails", {"to": f"user{n}@example.com"})
    api.enqueue("invoices", {"n": 1})
    seen: dict[str, dict[str, str]] = {}
    for scheme in ("light", "dark"):
        context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme=scheme)
        try:
            page = context.new_page()
            browser_sign_in(page, api.url, api.keys["operator"])
            page.goto(f"{api.url}/console/tenants/acme/queues/emails/charts")
            expect(page.locator('svg[data-figure="latency"]')).to_be_visible()
            seen[scheme] = page.evaluate(COLOURS)
            suffix = "" if scheme == "light" else "-dark"
            page.screenshot(path=str(shots / f"queue-charts{suffix}.png"), full_page=True)
            if scheme == "dark":
                page.get_by_role("navigation", name="Chart span").get_by_role(
                    "link", name="24 h"
                ).click()
                expect(page.get_by_role("link", name="24 h")).to_have_attribute(
                    "aria-current", "page"
                )
                page.wait_for_timeout(500)
                page.screenshot(path=str(shots / "queue-charts-day-dark.png"), full_page=True)
                page.goto(f"{api.url}/console/tenants/acme/queues")
                page.screenshot(path=str(shots / "queues-dark.png"), full_page=True)
                page.goto(f"{api.url}/console/tenants/acme/items/{failed}")
                expect(page.get_by_role("list", name="Ledger")).to_be_visible()
                page.screenshot(path=str(shots / "item-dark.png"), full_page=True)
        finally:
            context.close()
    light, dark = seen["light"], seen["dark"]
    assert light["page"] == "rgb(246, 247, 249)"
    assert dark["page"] == "rgb(15, 20, 27)"
    for part in ("text", "card", "tabs", "line", "tick"):
        assert light[part] != dark[part], part


def test_a_queues_charts_fit_a_phone(page: Page, api: Api, db: Db, shots: Path) -> None:
    charts.seed_history(db, "acme", "emails")
    api.enqueue("emails", {"to": "a@example.com"})
    page.set_viewport_size(PHONE)
    browser_sign_in(page, api.url, api.keys["operator"])
    page.goto(f"{api.url}/console/tenants/acme/queues/emails/charts")
    expect(page.locator('svg[data-figure="latency"]')).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    box = page.locator('svg[data-figure="ready"]').bounding_box()
    assert box is not None
    assert box["x"] >= 0
    assert box["x"] + box["width"] <= PHONE["width"]
    page.screenshot(path=str(shots / "queue-charts-phone.png"), full_page=True)
