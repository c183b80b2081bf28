"""A selection's retry over plain HTTP: the confirmation page draws each item with its
state, the form is CSRF-checked, and the same form sent twice replays its first answer
(the REST route's receipt) instead of acting again."""

from __future__ import annotations

import uuid

import psycopg

from tests.helpers.api import Api
from tests.helpers.console import CSRF, KEY, form_value, sign_in
from tests.helpers.items import quarantine

DB = psycopg.Connection[dict[str, object]]


def test_a_resubmitted_selection_replays_and_a_forged_one_is_refused(api: Api, db: DB) -> None:
    poisoned = [quarantine(api, "q", f"p{n}") for n in range(3)]
    client, _ = sign_in(api.url, api.keys["operator"])
    csrf = form_value(client.get("/console/tenants/acme/items").text, CSRF)
    confirm = client.post(
        "/console/tenants/acme/items/selection/confirm",
        data={"csrf": csrf, "action": "retry", "item_id": poisoned[:2]},
    )
    assert confirm.status_code == 200, confirm.text
    assert "Retry 2 selected items?" in confirm.text
    form = {
        "csrf": form_value(confirm.text, CSRF),
        "idempotency_key": form_value(confirm.text, KEY),
        "action": "retry",
        "selected": [f"quarantined:{i}" for i in poisoned[:2]],
    }
    for _ in range(2):  # the second time replays the first answer
        done = client.post("/console/tenants/acme/items/selection", data=form)
        assert done.status_code == 303, done.text
        assert "Retried 2 items." in client.get(done.headers["location"]).text
    retried = db.execute(
        "SELECT item_id::text AS i FROM item_events WHERE kind = 'retried' ORDER BY 1"
    ).fetchall()
    assert [r["i"] for r in retried] == sorted(poisoned[:2])  # one ledger row each

    forged = client.post(
        "/console/tenants/acme/items/selection",
        data={**form, "csrf": "not-the-token", "selected": f"quarantined:{poisoned[2]}"},
    )
    assert forged.status_code == 403
    drawn_otherwise = client.post(
        "/console/tenants/acme/items/selection",
        data={**form, "selected": f"ready:{poisoned[2]}"},
    )
    assert drawn_otherwise.status_code == 422
    state = api.operator.get(f"/v1/tenants/acme/items/{poisoned[2]}").json()["state"]
    assert state == "quarantined"


def test_a_selection_takes_up_to_a_hundred_items(api: Api) -> None:
    made = api.worker.post(
        "/v1/tenants/acme/queues/q/items:batch",
        json={"items": [{"payload": n} for n in range(101)]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert made.status_code == 201, made.text
    ids = [i["item_id"] for i in made.json()["items"]]
    cancelled = api.operator.post(
        "/v1/tenants/acme/items:cancel",
        json={"filter": {"queue": "q"}, "reason": "to retry", "limit": 1000},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert cancelled.json()["cancelled"] == 101, cancelled.text
    client, _ = sign_in(api.url, api.keys["operator"])
    csrf = form_value(client.get("/console/tenants/acme/items").text, CSRF)
    for chosen, status in ((ids, 422), (ids[:100], 200)):
        confirm = client.post(
            "/console/tenants/acme/items/selection/confirm",
            data={"csrf": csrf, "action": "retry", "item_id": chosen},
        )
        assert confirm.status_code == status, (len(chosen), confirm.text)
    assert "Retry 100 selected items?" in confirm.text
    form = {
        "csrf": form_value(confirm.text, CSRF),
        "idempotency_key": form_value(confirm.text, KEY),
        "action": "retry",
    }
    over = client.post(
        "/console/tenants/acme/items/selection",
        data={**form, "selected": [f"cancelled:{i}" for i in ids]},
    )
    assert over.status_code == 422
    assert "at most 100" in over.text
    done = client.post(
        "/console/tenants/acme/items/selection",
        data={**form, "selected": [f"cancelled:{i}" for i in ids[:100]]},
    )
    assert done.status_code == 303, done.text
    assert "Retried 100 items." in client.get(done.headers["location"]).text
