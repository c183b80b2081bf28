"""The items list as an operator reads it: rows that never look alike, and a filter typed
wrong that is said beside the form, which keeps every other filter."""

from __future__ import annotations

import html
import re

import psycopg

from tests.helpers.api import Api
from tests.helpers.console import sign_in
from tests.helpers.items import quarantine

Db = psycopg.Connection[dict[str, object]]
ROW_ID = re.compile(r'<a class="id" href="[^"]*/items/([0-9a-f-]{36})" title="\1">([^<]+)</a>')


def test_a_hundred_rows_made_together_show_a_hundred_different_ids(api: Api) -> None:
    response = api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": n} for n in range(100)]},
        headers={"Idempotency-Key": "a-hundred"},
    )
    assert response.status_code == 201, response.text
    client, _ = sign_in(api.url, api.keys["operator"])
    shown: dict[str, str] = {}
    url: str | None = "/console/tenants/acme/items"
    while url:
        page = client.get(url)
        assert page.status_code == 200
        shown.update((text, item_id) for item_id, text in ROW_ID.findall(page.text))
        found = re.search(r'href="([^"]+)" rel="next"', page.text)
        url = html.unescape(found.group(1)) if found else None
    assert len(shown) == 100  # a hundred texts: no two rows alike
    for text, item_id in shown.items():
        assert item_id.endswith(text.removeprefix("…")), (text, item_id)
    # What a row shows names its item for the API (and so for the CLI).
    text, item_id = next(iter(shown.items()))
    got = api.operator.get(f"/v1/tenants/acme/items/{text.removeprefix('…')}")
    assert got.json()["item_id"] == item_id


def test_a_filter_typed_wrong_is_said_above_the_form_that_keeps_the_others(api: Api) -> None:
    api.enqueue("mail", {"customer": 42})
    client, _ = sign_in(api.url, api.keys["operator"])
    for params, problem in (
        ({"created_after": "yesterday"}, "Created after is not a date and time."),
        ({"state": "sleeping"}, "State must be one of"),
        ({"payload": "{customer"}, "payload"),
    ):
        page = client.get(
            "/console/tenants/acme/items", params={"queue": "mail", "state": "ready", **params}
        )
        assert page.status_code == 422
        (alert,) = re.findall(r'<p class="flash error" role="alert">([^<]*)</p>', page.text)
        assert problem.lower() in alert.lower(), alert
        assert '<input name="queue" value="mail"' in page.text  # the others, as typed
        if "state" not in params:  # a text field shows what was typed, to correct it
            typed = html.escape(next(iter(params.values())), quote=True)
            assert f'value="{typed}"' in page.text
        assert "<h1>Items</h1>" in page.text  # the page itself, not an error page
    ok = client.get("/console/tenants/acme/items", params={"queue": "mail", "state": "ready"})
    assert ok.status_code == 200
    assert 'role="alert"' not in ok.text


def test_counts_have_separators_times_say_how_long_ago_and_dates_are_typed_in_iso(
    api: Api,
) -> None:
    item = api.enqueue("mail", "x")
    client, _ = sign_in(api.url, api.keys["operator"])
    queues = client.get("/console/tenants/acme/queues").text
    assert 'Backlog <span data-live="backlog">1</span> of 1,000' in queues  # cap 1000
    page = client.get("/console/tenants/acme/items").text
    # A past time: how long ago, the exact UTC time on hover.
    created = re.search(r'<time datetime="([^"]+)" title="([^"]+)">([^<]+)</time>', page)
    assert created is not None
    iso, exact, shown = created.groups()
    assert iso.startswith(str(item["created_at"])[:19])
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} UTC", exact)
    assert re.fullmatch(r"just now|\d+ s ago", shown), shown
    # No browser date picker (it shows the locale's mm/dd/yyyy under a UTC label).
    assert "datetime-local" not in page
    assert 'name="created_after" value="" inputmode="numeric"' in page
    since = client.get(
        "/console/tenants/acme/items", params={"created_after": "2000-01-01T00:00:00"}
    )
    assert since.status_code == 200
    assert str(item["item_id"])[-12:] in since.text
    later = client.get("/console/tenants/acme/items", params={"created_after": "2999-01-01 00:00"})
    assert "No items match." in later.text


def test_an_older_time_says_its_minutes_hours_or_days_ago(api: Api, db: Db) -> None:
    """Moved back 10.5 minutes, 3.5 hours and 2.5 days: each reads in its own unit (the
    half keeps each reading steady while the test runs)."""
    ages = {"10 min ago": "630 seconds", "3 h ago": "210 minutes", "2 d ago": "60 hours"}
    for shown, back in ages.items():
        item_id = api.enqueue("mail", shown)["item_id"]
        db.execute(
            "UPDATE work_items SET created_at = created_at - %s::interval WHERE item_id = %s",
            (back, item_id),
        )
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/items").text
    times = re.findall(r'<time datetime="[^"]+" title="[^"]+">([^<]+)</time>', page)
    assert set(ages) <= set(times), times


def test_the_bulk_count_agrees_with_the_list_at_its_bounds_and_payload(api: Api) -> None:
    first, second = quarantine(api, "q", "p1"), quarantine(api, "q", "p2")
    created = {
        item_id: api.operator.get(f"/v1/tenants/acme/items/{item_id}").json()["created_at"]
        for item_id in (first, second)
    }
    client, _ = sign_in(api.url, api.keys["operator"])
    # Both bounds are exclusive, in the count as in the list: an item made at the very
    # instant a bound names is neither listed nor counted.
    for bound, at, shown in (
        ("created_after", created[first], second),
        ("created_before", created[second], first),
    ):
        page = client.get("/console/tenants/acme/items", params={"state": "quarantined", bound: at})
        assert page.status_code == 200, page.text
        assert [item_id for item_id, _ in ROW_ID.findall(page.text)] == [shown]
        assert "Retry all 1 matching…" in page.text, bound
    # A payload filter matches the items whose payload contains it, in the count too.
    wanted = quarantine(api, "q", {"kind": "a", "n": 1})
    quarantine(api, "q", {"kind": "b"})
    page = client.get(
        "/console/tenants/acme/items", params={"state": "quarantined", "payload": '{"kind": "a"}'}
    )
    assert page.status_code == 200, page.text
    assert [item_id for item_id, _ in ROW_ID.findall(page.text)] == [wanted]
    assert "Retry all 1 matching…" in page.text
    # And a queue filter: only that queue's items, in the count too.
    elsewhere = quarantine(api, "other", "x")
    page = client.get(
        "/console/tenants/acme/items", params={"state": "quarantined", "queue": "other"}
    )
    assert [item_id for item_id, _ in ROW_ID.findall(page.text)] == [elsewhere]
    assert "Retry all 1 matching…" in page.text
