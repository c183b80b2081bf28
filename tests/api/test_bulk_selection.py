"""Bulk retry and delete of a selection: `item_ids` in the filter names the items, each of
which must still match the rest of the filter (state, queue, ...); every other item is
left as it is, the backlog cap and the paging hold as for a filter."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
import pytest

from tests.helpers.api import Api, setup_tenant
from tests.helpers.items import quarantine


def _post(api: Api, action: str, tenant: str = "acme", **body: Any) -> httpx.Response:
    return api.operator.post(
        f"/v1/tenants/{tenant}/items:{action}",
        json=body,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )


def _states(api: Api) -> dict[str, str]:
    items = api.operator.get("/v1/tenants/acme/items", params={"limit": 500}).json()["items"]
    return {i["item_id"]: i["state"] for i in items}


def test_retry_of_a_selection_makes_just_those_ready(api: Api) -> None:
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(5)]
    elsewhere = quarantine(api, "other")
    ready = str(api.enqueue("q", "fine")["item_id"])
    chosen = [poisoned[0], poisoned[2], poisoned[4], elsewhere, ready]
    response = _post(
        api, "retry", filter={"state": "quarantined", "queue": "q", "item_ids": chosen}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["retried"] == 3
    assert sorted(body["item_ids"]) == sorted(chosen[:3])
    assert body["next_cursor"] is None
    states = _states(api)
    assert {i: states[i] for i in poisoned} == {
        poisoned[0]: "ready",
        poisoned[1]: "quarantined",
        poisoned[2]: "ready",
        poisoned[3]: "quarantined",
        poisoned[4]: "ready",
    }
    assert states[elsewhere] == "quarantined"  # another queue than the filter's
    assert states[ready] == "ready"


def test_a_selection_keeps_the_filter_s_payload_test(api: Api) -> None:
    wanted = quarantine(api, "q", {"kind": "a"})
    other = quarantine(api, "q", {"kind": "b"})
    response = _post(
        api,
        "retry",
        filter={"state": "quarantined", "item_ids": [wanted, other], "payload": {"kind": "a"}},
    )
    assert response.status_code == 200, response.text
    assert response.json()["item_ids"] == [wanted]
    assert _states(api)[other] == "quarantined"


def test_a_selection_pages_by_limit_and_stops_at_the_backlog_cap(api: Api) -> None:
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(4)]
    first = _post(api, "retry", filter={"state": "quarantined", "item_ids": poisoned}, limit=2)
    assert first.json()["retried"] == 2, first.text
    cursor = first.json()["next_cursor"]
    assert cursor
    assert api.admin.put("/v1/tenants/acme", json={"backlog_cap": 3}).status_code == 200
    rest = _post(
        api,
        "retry",
        filter={"state": "quarantined", "item_ids": poisoned},
        limit=2,
        cursor=cursor,
    )
    assert rest.status_code == 200, rest.text
    assert (rest.json()["retried"], rest.json()["over_cap"]) == (1, 1)
    assert sorted(_states(api)[i] for i in poisoned) == ["quarantined", "ready", "ready", "ready"]


def test_a_selections_page_holds_only_items_still_in_the_filtered_state(api: Api) -> None:
    """An item of the selection in another state takes no room in a page: two quarantined
    items after a ready one are both retried in a page of two, and nothing is left."""
    ready = str(api.enqueue("other", "fine")["item_id"])
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(2)]
    response = _post(
        api, "retry", filter={"state": "quarantined", "item_ids": [ready, *poisoned]}, limit=2
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["retried"], sorted(body["item_ids"])) == (2, sorted(poisoned))
    assert body["next_cursor"] is None
    assert _states(api)[ready] == "ready"


def test_delete_of_a_selection_removes_just_those_finished_items(api: Api) -> None:
    done = []
    for n in range(3):
        api.enqueue("q", n)
        (lease,) = api.acquire("q")
        api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
        done.append(str(lease["item_id"]))
    ready = str(api.enqueue("q", "fine")["item_id"])
    response = _post(
        api, "delete", filter={"state": "completed", "item_ids": [done[0], done[2], ready]}
    )
    assert response.status_code == 200, response.text
    assert response.json()["deleted"] == 2
    states = _states(api)
    assert done[0] not in states
    assert done[2] not in states
    assert states[done[1]] == "completed"
    assert states[ready] == "ready"


def test_a_selection_never_reaches_another_tenants_items(api: Api) -> None:
    other = setup_tenant(api.url, api.admin, "globex")
    theirs = quarantine(other, "q")
    response = _post(api, "retry", filter={"state": "quarantined", "item_ids": [theirs]})
    assert response.status_code == 200, response.text
    assert response.json()["retried"] == 0
    item = other.operator.get(f"/v1/tenants/globex/items/{theirs}").json()
    assert item["state"] == "quarantined"


@pytest.mark.parametrize(
    "item_ids",
    [[], ["not-an-id"], [str(uuid.uuid4()) for _ in range(1001)]],
    ids=["empty", "not-a-uuid", "1001-ids"],
)
def test_a_selection_must_be_1_to_1000_item_ids(api: Api, item_ids: list[str]) -> None:
    for action, state in (("retry", "quarantined"), ("delete", "completed")):
        response = _post(api, action, filter={"state": state, "item_ids": item_ids})
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["code"] == "invalid-request"
        assert body["errors"][0]["loc"][:3] == ["body", "filter", "item_ids"]
