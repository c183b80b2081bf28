"""The console's watcher pages: pause and resume, and replay of a dead delivery, through the
same service calls (and receipts) as the REST routes."""

from __future__ import annotations

import re

from queue_server.settings import Settings
from tests.helpers.api import Api
from tests.helpers.console import CSRF, form_value, sign_in
from tests.helpers.watchers import Db, ModeReceiver, complete_one, deliver, make_due, register, rows

KEYED_FORM = re.compile(
    r'<form method="post" action="([^"]+/(?:pause|resume|replay))">'
    r'<input type="hidden" name="csrf" value="([^"]+)">\s*'
    r'<input type="hidden" name="idempotency_key" value="([^"]+)">'
)


def _forms(page: str) -> dict[str, tuple[str, str]]:
    """action path -> (csrf, idempotency key) of each button form of the page."""
    return {action: (csrf, key) for action, csrf, key in KEYED_FORM.findall(page)}


def test_pause_and_resume_a_watcher_from_the_console(api: Api) -> None:
    watcher = register(api, "http://127.0.0.1:9/hook")
    path = f"/console/tenants/acme/watchers/{watcher['watcher_id']}"
    client, _ = sign_in(api.url, api.keys["operator"])
    forms = _forms(client.get("/console/tenants/acme/watchers").text)
    csrf, key = forms[f"{path}/pause"]
    paused = client.post(f"{path}/pause", data={"csrf": csrf, "idempotency_key": key})
    assert paused.status_code == 303
    assert "Paused the watcher." in client.get(paused.headers["location"]).text
    rest = api.operator.get(f"/v1/tenants/acme/watchers/{watcher['watcher_id']}").json()
    assert rest["state"] == "paused"

    page = client.get(path).text
    assert form_value(page, CSRF) == csrf
    csrf, key = _forms(page)[f"{path}/resume"]
    resumed = client.post(f"{path}/resume", data={"csrf": csrf, "idempotency_key": key})
    assert resumed.status_code == 303
    rest = api.operator.get(f"/v1/tenants/acme/watchers/{watcher['watcher_id']}").json()
    assert rest["state"] == "active"


def test_replay_a_dead_delivery_from_the_watcher_page(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "fail"
    watcher = register(api, receiver.url("/hook"))
    complete_one(api)
    for _ in range(5):
        make_due(db)
        deliver(settings, database_url)
    [row] = rows(db)
    assert row["state"] == "dead"

    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/watchers/{watcher['watcher_id']}?state=dead")
    assert page.status_code == 200
    action = f"/console/tenants/acme/deliveries/{row['delivery_id']}/replay"
    csrf, key = _forms(page.text)[action]
    replayed = client.post(action, data={"csrf": csrf, "idempotency_key": key})
    assert replayed.status_code == 303
    assert "The delivery is pending again." in client.get(replayed.headers["location"]).text
    [row] = rows(db)
    assert row["state"] == "pending"
    assert row["attempts"] == 0
    letters = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"})
    assert letters.json()["dead_letters"] == []  # closed by the replay

    # The same form sent again replays its first answer; a new one is refused: already replayed.
    again = client.post(action, data={"csrf": csrf, "idempotency_key": key})
    assert "The delivery is pending again." in client.get(again.headers["location"]).text
    fresh = client.post(action, data={"csrf": csrf, "idempotency_key": "another-key"})
    assert "This dead letter was already replayed." in client.get(fresh.headers["location"]).text
    [row] = rows(db)
    assert row["state"] == "pending"

    receiver.mode = "ok"
    make_due(db)
    assert deliver(settings, database_url).delivered == 1
