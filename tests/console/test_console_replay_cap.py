"""The console's replays obey the backlog cap, and say what did not fit."""

from __future__ import annotations

from tests.helpers.api import Api
from tests.helpers.console import CSRF, KEY, form_value, sign_in
from tests.helpers.items import dead_letter_of, quarantine


def test_console_replays_at_the_cap_say_what_did_not_fit(api: Api) -> None:
    letters = [dead_letter_of(api, quarantine(api, "q", {"n": n})) for n in range(3)]
    api.admin.put("/v1/tenants/acme", json={"backlog_cap": 2})
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/dead-letters", params={"queue": "q"}).text
    action = "/console/tenants/acme/queues/q/dead-letters/replay"
    done = client.post(
        action, data={"csrf": form_value(page, CSRF), "idempotency_key": form_value(page, KEY)}
    )
    assert done.status_code == 303
    flash = client.get(done.headers["location"]).text
    assert "Replayed 2 of q&#39;s dead letters" in flash
    assert "1 did not fit: the tenant&#39;s backlog cap is reached." in flash
    # Full now: the bulk form and a single replay both say so, and change nothing.
    page = client.get("/console/tenants/acme/dead-letters", params={"queue": "q"}).text
    again = client.post(
        action, data={"csrf": form_value(page, CSRF), "idempotency_key": form_value(page, KEY)}
    )
    assert (
        "Nothing replayed: Backlog 2 + 1 replayed would exceed the cap of 2."
        in client.get(again.headers["location"]).text
    )
    confirm = client.post(
        "/console/tenants/acme/dead-letters/confirm",
        data={"csrf": form_value(page, CSRF), "action": "replay", "dead_letter_id": letters[2]},
    )
    single = client.post(
        "/console/tenants/acme/dead-letters/replay",
        data={
            "csrf": form_value(confirm.text, CSRF),
            "idempotency_key": form_value(confirm.text, KEY),
            "dead_letter_id": letters[2],
        },
    )
    assert single.status_code == 303
    assert "Refused 1" in client.get(single.headers["location"]).text
    assert api.admin.get("/v1/tenants/acme").json()["backlog"] == 2
