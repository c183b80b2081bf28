"""An item's own page offers what can be done with it from there: a quarantined item links
to its open dead letter and can be retried or cancelled; a completed one shows its result
and can be deleted; a ready one can be cancelled. Each action goes through its confirmation
page, and the retry from there is the same one the REST route makes."""

from __future__ import annotations

import re
import uuid

import pytest

from tests.helpers.api import Api
from tests.helpers.console import CSRF, KEY, form_value, sign_in
from tests.helpers.items import dead_letter_of, dead_letters, enqueue_graph, quarantine, replay

ACTIONS = re.compile(r'name="action" value="(\w+)"')


def test_an_item_quarantined_again_links_its_open_dead_letter_not_its_closed_one(
    api: Api,
) -> None:
    item_id = quarantine(api, "q", "poison")
    first = dead_letter_of(api, item_id)
    assert replay(api, first).status_code == 200
    (lease,) = api.acquire("q")
    failure = {"class": "Boom", "message": "again", "transient": False}
    again = api.holder(
        "triage", item_id, worker="w1", fence=lease["fence"], failure=failure, decision="quarantine"
    )
    assert again.json()["state"] == "quarantined", again.text
    (second,) = dead_letters(api.operator, status="open")["dead_letters"]
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{item_id}").text
    assert f'/console/tenants/acme/dead-letters/{second["dead_letter_id"]}"' in page
    assert f"/dead-letters/{first}" not in page


def test_a_quarantined_item_links_its_dead_letter_and_can_be_retried_from_its_page(
    api: Api,
) -> None:
    item_id = quarantine(api, "q", "poison")
    (dead,) = api.operator.get("/v1/tenants/acme/dead-letters").json()["dead_letters"]
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{item_id}").text
    assert f'/console/tenants/acme/dead-letters/{dead["dead_letter_id"]}"' in page
    assert ACTIONS.findall(page) == ["retry"]
    assert "Cancel item…" in page
    assert "<h2>Result</h2>" not in page  # nothing to show before it completes

    confirm = client.post(
        "/console/tenants/acme/items/selection/confirm",
        data={"csrf": form_value(page, CSRF), "action": "retry", "item_id": item_id},
    )
    assert confirm.status_code == 200, confirm.text
    done = client.post(
        "/console/tenants/acme/items/selection",
        data={
            "csrf": form_value(confirm.text, CSRF),
            "idempotency_key": form_value(confirm.text, KEY),
            "action": "retry",
            "selected": f"quarantined:{item_id}",
        },
    )
    assert done.status_code == 303, done.text
    assert api.operator.get(f"/v1/tenants/acme/items/{item_id}").json()["state"] == "ready"
    page = client.get(f"/console/tenants/acme/items/{item_id}").text
    assert "/dead-letters/" not in page  # closed by the retry
    assert ACTIONS.findall(page) == []
    assert "Cancel item…" in page


def test_a_completed_item_shows_its_result_and_can_be_deleted_but_not_cancelled(
    api: Api,
) -> None:
    item = api.enqueue("q", "work")
    (lease,) = api.acquire("q")
    done = api.holder("complete", item["item_id"], worker="w1", fence=lease["fence"], result=42)
    assert done.status_code == 200, done.text
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{item['item_id']}").text
    assert "<h2>Result</h2>" in page
    assert ACTIONS.findall(page) == ["delete"]
    assert "Cancel item…" not in page


def test_an_item_page_lists_what_it_waits_for_with_each_ones_state(api: Api) -> None:
    api.approve("q", 10)
    first = api.enqueue("q", "first")
    second = api.enqueue("q", "second")
    joined = api.enqueue("q", "joined", depends_on=[first["item_id"], second["item_id"]])
    leases = {lease["item_id"]: lease for lease in api.acquire("q", max_items=10)}
    lease = leases[first["item_id"]]
    assert api.holder("complete", first["item_id"], worker="w1", fence=lease["fence"]).is_success
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{joined['item_id']}").text
    assert "<h2>Depends on</h2>" in page
    assert "Waiting for 1 of 2: until each of these has completed." in page
    assert "waiting for 2 items to complete" in page  # its ledger's first line
    listed = re.findall(r'href="/console/tenants/acme/items/([0-9a-f-]{36})">', page)
    assert set(listed) >= {first["item_id"], second["item_id"]}
    shown = page[page.index("<h2>Depends on</h2>") :]
    assert "completed" in shown
    assert "leased" in shown
    # An item without dependencies has no such section.
    plain = client.get(f"/console/tenants/acme/items/{first['item_id']}").text
    assert "Depends on" not in plain


def test_an_item_page_draws_the_workflow_it_is_part_of(api: Api) -> None:
    """Drawn on the server: each item of the graph a link to its page, coloured by its
    state, in columns after what it depends on; the item itself drawn bold."""
    fetch, parse, index, publish = enqueue_graph(api)
    graph = api.worker.get(f"/v1/tenants/acme/items/{parse}/workflow").json()
    # From parse: what it waits for (fetch), what waits for it (publish), and itself.
    assert sorted(n["item_id"] for n in graph["nodes"]) == sorted([fetch, parse, publish])
    assert graph["complete"] is True
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{fetch}").text
    assert "<h2>Workflow</h2>" in page
    drawn = dict(re.findall(r'data-item="([0-9a-f-]{36})" data-state="(\w+)"', page))
    assert drawn == {fetch: "ready", parse: "waiting", index: "waiting", publish: "waiting"}
    columns = {
        item: int(x)
        for item, x in re.findall(
            r'data-item="([0-9a-f-]{36})"[^>]*><rect class="node [^"]*" x="(\d+)"', page
        )
    }
    assert columns[fetch] < columns[parse] == columns[index] < columns[publish]
    assert re.search(rf'data-item="{fetch}"[^>]*><rect class="node s-ready focus"', page)
    assert page.count('<line class="edge"') == 4
    assert f'href="/console/tenants/acme/items/{publish}"' in page
    plain = client.get(f"/console/tenants/acme/items/{api.enqueue('q', 'alone')['item_id']}")
    assert "<h2>Workflow</h2>" not in plain.text


def test_a_fan_in_s_page_counts_what_it_waits_for_beyond_the_graph_drawn(api: Api) -> None:
    """A callback over 300 items: the first 50 listed, the rest counted."""
    made = api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": n} for n in range(300)], "callback": {"payload": "sum"}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert made.status_code == 201, made.text
    callback = made.json()["callback"]["item_id"]
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{callback}").text
    assert "Waiting for 300 of 300: until each of these has completed." in page
    listed = page[
        page.index("<h2>Depends on</h2>") : page.index(
            "</section>", page.index("<h2>Depends on</h2>")
        )
    ]
    shown = len(re.findall(r'href="/console/tenants/acme/items/[0-9a-f-]{36}"', listed))
    assert shown == 50
    assert "and 250 more not listed here" in listed
    assert f"queue-server items dependencies {callback}" in listed
    # Its ledger's first event names the 300, shortened on the page (not over REST).
    ledger = page[page.index('aria-label="Ledger"') :]
    assert "... and 280 more" in ledger


@pytest.mark.parametrize(("items", "note"), [(20, None), (21, "... and 1 more")])
def test_a_ledger_event_lists_twenty_entries_whole_and_counts_the_rest(
    api: Api, items: int, note: str | None
) -> None:
    made = api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": n} for n in range(items)], "callback": {"payload": "sum"}},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert made.status_code == 201, made.text
    callback = made.json()["callback"]["item_id"]
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{callback}").text
    ledger = page[page.index('aria-label="Ledger"') :]
    shortened = re.findall(r"\.\.\. and [0-9,]+ more", ledger)
    assert shortened == ([] if note is None else [note])
