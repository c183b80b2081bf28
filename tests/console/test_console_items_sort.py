"""The items list newest first by default, sorted by a column heading or the order control,
the filters kept; its pages follow the order (keyset cursors of that order)."""

from __future__ import annotations

import html
import re

from tests.helpers.api import Api
from tests.helpers.console import sign_in

ROW = re.compile(r'<input type="checkbox" name="item_id" value="([0-9a-f-]{36})"')
NEXT = re.compile(r'href="([^"]+)" rel="next"')


def _pages(client: object, url: str | None) -> tuple[list[list[str]], list[str]]:
    pages: list[list[str]] = []
    urls: list[str] = []
    while url:
        urls.append(url)
        page = client.get(url)  # type: ignore[attr-defined]
        assert page.status_code == 200, page.text
        pages.append(ROW.findall(page.text))
        found = NEXT.search(page.text)
        url = html.unescape(found.group(1)) if found else None
    return pages, urls


def test_newest_first_by_default_and_each_order_pages_through_every_item_once(
    api: Api,
) -> None:
    made = []
    for n in range(3):  # three batches: three creation times
        response = api.worker.post(
            "/v1/tenants/acme/queues/q/items:batch",
            json={"items": [{"payload": [n, m], "priority": (m * 7) % 5} for m in range(20)]},
            headers={"Idempotency-Key": f"batch-{n}"},
        )
        assert response.status_code == 201, response.text
        made += [i["item_id"] for i in response.json()["items"]]
    api.enqueue("other", "not in the filter")
    client, _ = sign_in(api.url, api.keys["operator"])

    first = client.get("/console/tenants/acme/items").text
    newest = api.operator.get("/v1/tenants/acme/items", params={"sort": "-created"}).json()
    assert ROW.findall(first) == [i["item_id"] for i in newest["items"]]
    assert 'aria-sort="descending"><a href="/console/tenants/acme/items?sort=created"' in first

    for sort in ("-created", "priority", "-attempts"):
        pages, urls = _pages(client, f"/console/tenants/acme/items?queue=q&sort={sort}")
        assert [len(p) for p in pages] == [50, 10], sort
        # The pager keeps the filter and the order (the default order goes unsaid).
        kept = "sort=" not in urls[1] if sort == "-created" else f"sort={sort}" in urls[1]
        assert "queue=q" in urls[1]
        assert kept, urls
        listed = [i for p in pages for i in p]
        want = api.operator.get(
            "/v1/tenants/acme/items", params={"queue": "q", "sort": sort, "limit": 100}
        ).json()["items"]
        assert listed == [i["item_id"] for i in want], sort
        assert sorted(listed) == sorted(made)


def test_a_heading_sorts_by_its_column_and_keeps_the_filters(api: Api) -> None:
    for n in range(3):
        api.enqueue("q", n, priority=n)
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/items", params={"queue": "q", "state": "ready"}).text
    link = re.search(r'<a href="([^"]+)" title="Sort by priority">Priority</a>', page)
    assert link is not None
    href = html.unescape(link.group(1))
    assert "queue=q" in href
    assert "state=ready" in href
    assert "sort=-priority" in href
    by_priority = client.get(href).text
    assert 'aria-sort="descending"><a href' in by_priority
    assert "Priority ▼" in by_priority
    shown = ROW.findall(by_priority)
    priorities = [api.operator.get(f"/v1/tenants/acme/items/{i}").json()["priority"] for i in shown]
    assert priorities == [2, 1, 0]
    # The same heading again turns the direction.
    again = re.search(r'<a href="([^"]+)" title="Sort by priority">Priority ▼</a>', by_priority)
    assert again is not None
    assert "sort=priority" in html.unescape(again.group(1))


def test_an_unknown_order_is_said_above_the_form(api: Api) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/items", params={"sort": "payload"})
    assert page.status_code == 422
    assert "Sort must be one of" in page.text
