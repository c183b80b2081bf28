"""Watcher routes: registration with the SSRF check, isolation, idempotency, state changes,
deliveries, and dead deliveries in the dead-letter routes."""

from __future__ import annotations

import uuid

import httpx
import pytest

from queue_server.settings import Settings
from tests.helpers.api import Api, setup_tenant
from tests.helpers.items import quarantine
from tests.helpers.watchers import (
    Db,
    ModeReceiver,
    complete_one,
    deliver,
    make_due,
    paused_after_one,
    register,
    rows,
)


def test_registration_answers_the_secret_once_and_never_again(
    api: Api, receiver: ModeReceiver
) -> None:
    created = register(api, receiver.url("/hook"), ["item.completed", "item.enqueued"], ["q"])
    assert created["state"] == "active"
    assert created["secret"].startswith("whsec_")
    assert created["events"] == ["item.completed", "item.enqueued"]
    assert created["queues"] == ["q"]
    shown = api.operator.get(f"/v1/tenants/acme/watchers/{created['watcher_id']}").json()
    assert "secret" not in shown
    assert shown["deliveries"] == {"pending": 0, "delivered": 0, "dead": 0, "cancelled": 0}
    listed = api.operator.get("/v1/tenants/acme/watchers").json()["watchers"]
    assert [w["watcher_id"] for w in listed] == [created["watcher_id"]]
    assert all("secret" not in w for w in listed)


def test_registration_is_idempotent_by_key(api: Api, receiver: ModeReceiver, db: Db) -> None:
    body = {"url": receiver.url("/hook"), "events": ["item.completed"]}
    first = api.operator.post(
        "/v1/tenants/acme/watchers", json=body, headers={"Idempotency-Key": "k"}
    )
    again = api.operator.post(
        "/v1/tenants/acme/watchers", json=body, headers={"Idempotency-Key": "k"}
    )
    assert first.status_code == again.status_code == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["watcher_id"] == first.json()["watcher_id"]
    assert len(api.operator.get("/v1/tenants/acme/watchers").json()["watchers"]) == 1
    # The secret is shown once: the receipt keeps the answer without it.
    secret = first.json()["secret"]
    assert secret.startswith("whsec_")
    assert again.json()["secret"] is None
    receipts = db.execute("SELECT response_body FROM idempotency_receipts").fetchall()
    assert receipts
    assert all(secret not in str(r["response_body"]) for r in receipts)
    rotated = api.operator.post(
        f"/v1/tenants/acme/watchers/{first.json()['watcher_id']}/rotate-secret",
        headers={"Idempotency-Key": "rotate"},
    )
    new_secret = rotated.json()["secret"]
    assert new_secret.startswith("whsec_")
    rotated_again = api.operator.post(
        f"/v1/tenants/acme/watchers/{first.json()['watcher_id']}/rotate-secret",
        headers={"Idempotency-Key": "rotate"},
    )
    assert rotated_again.json()["secret"] is None
    receipts = db.execute("SELECT response_body FROM idempotency_receipts").fetchall()
    assert all(new_secret not in str(r["response_body"]) for r in receipts)
    missing = api.operator.post("/v1/tenants/acme/watchers", json=body)
    assert missing.status_code == 400
    assert missing.json()["code"] == "idempotency-key-required"


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/hook",
        "http://[::ffff:10.0.0.1]/hook",
        "http://0x7f000002/hook",
        "http://0.0.0.0/hook",
        "http://224.0.0.1/hook",
        "http://127.0.0.2:1/hook",
    ],
)
def test_registration_refuses_private_targets(api: Api, url: str) -> None:
    response = api.operator.post(
        "/v1/tenants/acme/watchers",
        json={"url": url, "events": ["item.completed"]},
        headers={"Idempotency-Key": url},
    )
    assert response.status_code == 422, response.text
    assert response.json()["code"] in ("target-refused", "invalid-request")


def test_unknown_event_and_bad_scheme_are_invalid(api: Api) -> None:
    for body in (
        {"url": "http://127.0.0.1:9/hook", "events": ["item.exploded"]},
        {"url": "ftp://127.0.0.1/hook", "events": ["item.completed"]},
        {"url": "http://127.0.0.1:9/hook", "events": []},
    ):
        response = api.operator.post(
            "/v1/tenants/acme/watchers", json=body, headers={"Idempotency-Key": uuid.uuid4().hex}
        )
        assert response.status_code == 422
        assert response.json()["code"] == "invalid-request"


def test_other_tenants_watchers_are_not_found(
    api: Api, admin: httpx.Client, receiver: ModeReceiver
) -> None:
    other = setup_tenant(api.url, admin, "globex")
    theirs = register(other, receiver.url("/hook"))
    wid = theirs["watcher_id"]
    assert api.operator.get(f"/v1/tenants/globex/watchers/{wid}").status_code == 404
    assert api.operator.get("/v1/tenants/globex/watchers").status_code == 404
    assert api.operator.get("/v1/tenants/acme/watchers").json()["watchers"] == []
    assert api.operator.get(f"/v1/tenants/acme/watchers/{wid}").status_code == 404
    paused = api.operator.post(
        f"/v1/tenants/acme/watchers/{wid}/pause", headers={"Idempotency-Key": "x"}
    )
    assert paused.status_code == 404
    assert paused.json()["code"] == "watcher-not-found"
    assert api.operator.get(f"/v1/tenants/acme/watchers/{wid}/deliveries").status_code == 404
    assert api.operator.get("/v1/tenants/acme/watchers/not-a-uuid").status_code == 404


def test_another_tenants_delivery_is_not_found_under_ones_own(
    api: Api, admin: httpx.Client, db: Db, receiver: ModeReceiver
) -> None:
    other = setup_tenant(api.url, admin, "globex")
    register(other, receiver.url("/hook"))
    complete_one(other)
    [theirs] = rows(db)
    did = theirs["delivery_id"]
    assert other.operator.get(f"/v1/tenants/globex/deliveries/{did}").status_code == 200
    mine = api.operator.get(f"/v1/tenants/acme/deliveries/{did}")
    assert mine.status_code == 404
    assert mine.json()["code"] == "delivery-not-found"


def test_cancel_cancels_pending_deliveries_and_stops_new_ones(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    watcher = register(api, receiver.url("/hook"))
    complete_one(api)
    assert deliver(settings, database_url).delivered == 1  # its history: kept as it is
    complete_one(api)
    complete_one(api)
    path = f"/v1/tenants/acme/watchers/{watcher['watcher_id']}"
    cancelled = api.operator.post(f"{path}/cancel", headers={"Idempotency-Key": "c"})
    assert cancelled.status_code == 200
    assert cancelled.json()["state"] == "cancelled"
    assert cancelled.json()["cancelled_deliveries"] == 2
    assert [r["state"] for r in rows(db)] == ["delivered", "cancelled", "cancelled"]
    complete_one(api)
    assert len(rows(db)) == 3
    assert deliver(settings, database_url).claimed == 0
    assert len(receiver.hook_requests()) == 1
    for action in ("resume", "rotate-secret"):
        again = api.operator.post(f"{path}/{action}", headers={"Idempotency-Key": action})
        assert again.status_code == 409, action
        assert again.json()["code"] == "invalid-state"


def test_cancel_of_a_paused_watcher_cancels_it_and_its_pending_deliveries(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    _, path = paused_after_one(api, receiver.url("/hook"))
    cancelled = api.operator.post(f"{path}/cancel", headers={"Idempotency-Key": "c"})
    assert cancelled.status_code == 200, cancelled.text
    assert (cancelled.json()["state"], cancelled.json()["cancelled_deliveries"]) == ("cancelled", 1)
    assert [r["state"] for r in rows(db)] == ["cancelled"]
    assert deliver(settings, database_url).claimed == 0
    assert receiver.hook_requests() == []


def test_deliveries_list_shows_key_attempts_schedule_outcome_and_receipts(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "fail"
    watcher = register(api, receiver.url("/hook"))
    complete_one(api)
    complete_one(api)
    deliver(settings, database_url)
    path = f"/v1/tenants/acme/watchers/{watcher['watcher_id']}/deliveries"
    page = api.operator.get(path, params={"limit": 1}).json()
    [first] = page["deliveries"]
    assert first["delivery_key"].startswith("msg_")
    assert first["attempts"] == 1
    assert first["state"] == "pending"
    assert first["next_attempt_at"] is not None
    assert first["last_outcome"]["status"] == 500
    assert first["receipts"][0]["status"] == 500
    rest = api.operator.get(path, params={"limit": 1, "cursor": page["next_cursor"]}).json()
    assert len(rest["deliveries"]) == 1
    assert rest["next_cursor"] is None  # the last page, full, says so
    assert api.operator.get(path, params={"state": "delivered"}).json()["deliveries"] == []
    # A cursor this server did not issue is refused, whatever number it spells.
    for foreign in ("\u00b2", "-1", "9" * 19, "1e3"):
        refused = api.operator.get(path, params={"cursor": foreign})
        assert refused.status_code == 422, (foreign, refused.text)
        assert "not one this server issued" in refused.json()["detail"]
    one = api.operator.get(f"/v1/tenants/acme/deliveries/{first['delivery_id']}").json()
    assert one["delivery_key"] == first["delivery_key"]


def test_dead_delivery_is_a_dead_letter_and_replay_resends_under_the_same_key(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "fail"
    register(api, receiver.url("/hook"))
    complete_one(api)
    for _ in range(5):
        make_due(db)
        deliver(settings, database_url)
    [row] = rows(db)
    assert row["state"] == "dead"
    listed = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"})
    [letter] = listed.json()["dead_letters"]
    assert letter["kind"] == "delivery"
    assert (
        api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "item"}).json()[
            "dead_letters"
        ]
        == []
    )
    # Nor is it one of the queue's item dead letters in its figures.
    assert api.operator.get("/v1/tenants/acme/queues/q").json()["open_dead_letters"] == 0
    detail = api.operator.get(f"/v1/tenants/acme/dead-letters/{letter['dead_letter_id']}").json()
    assert detail["delivery"]["delivery_key"] == row["delivery_key"]
    assert detail["delivery"]["attempts"] == 5

    receiver.mode = "ok"
    replay_path = f"/v1/tenants/acme/dead-letters/{letter['dead_letter_id']}/replay"
    replayed = api.operator.post(replay_path, json={}, headers={"Idempotency-Key": "rp"})
    assert replayed.status_code == 200, replayed.text
    assert replayed.json()["state"] == "pending"
    assert replayed.json()["attempts"] == 0
    assert replayed.json()["delivery_key"] == row["delivery_key"]
    again = api.operator.post(replay_path, json={}, headers={"Idempotency-Key": "rp2"})
    assert again.status_code == 409
    assert deliver(settings, database_url).delivered == 1
    keys = [r.headers["webhook-id"] for r in receiver.hook_requests()]
    assert keys == [row["delivery_key"]] * 6
    [row] = rows(db)
    assert row["state"] == "delivered"
    # The receipts of the dead attempts stay with the row.
    assert len(row["receipts"]) == 6
    assert (
        api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"}).json()[
            "dead_letters"
        ]
        == []
    )


def test_a_queues_bulk_replay_leaves_a_dead_delivery_of_that_queue_to_its_own_replay(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    """The bulk replay of a queue's dead letters sends its dead items back; a watcher's dead
    delivery of an event on that queue is not an item: neither replayed nor counted as
    skipped, it stays open for its own replay."""
    receiver.mode = "redirect"
    register(api, receiver.url("/hook"))
    complete_one(api)
    deliver(settings, database_url)
    [row] = rows(db)
    assert row["state"] == "dead"
    item_id = quarantine(api)
    response = api.operator.post(
        "/v1/tenants/acme/queues/q/dead-letters:replay",
        json={},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["replayed"], body["skipped"], body["item_ids"]) == (1, 0, [item_id])
    listed = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"})
    [letter] = listed.json()["dead_letters"]
    assert letter["delivery_id"] == str(row["delivery_id"])


def test_discarding_a_dead_delivery_cancels_it(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "fail"
    register(api, receiver.url("/hook"))
    complete_one(api)
    for _ in range(5):
        make_due(db)
        deliver(settings, database_url)
    [letter] = api.operator.get(
        "/v1/tenants/acme/dead-letters", params={"kind": "delivery"}
    ).json()["dead_letters"]
    discarded = api.operator.post(
        f"/v1/tenants/acme/dead-letters/{letter['dead_letter_id']}/discard",
        json={"reason": "receiver retired"},
        headers={"Idempotency-Key": "d"},
    )
    assert discarded.status_code == 200, discarded.text
    assert discarded.json()["state"] == "cancelled"
    assert rows(db)[0]["state"] == "cancelled"


def test_the_allowance_opens_no_port_of_the_servers_own(
    api: Api, receiver: ModeReceiver, settings: Settings, database_url: str, db: Db
) -> None:
    # 127.0.0.1 is allowed here, but never on the API's port or a database's.
    for port in (settings.port, 5432):
        refused = api.operator.post(
            "/v1/tenants/acme/watchers",
            json={"url": f"http://127.0.0.1:{port}/hook", "events": ["item.completed"]},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert refused.status_code == 422, refused.text
        assert "one of the server's own" in refused.text
    # A watcher whose URL points there anyway (changed in the database) is refused at dispatch.
    watcher = register(api, receiver.url("/hook"), events=["item.completed"])
    db.execute(
        "UPDATE watchers SET url = %s WHERE watcher_id = %s",
        (f"http://127.0.0.1:{settings.port}/hook", watcher["watcher_id"]),
    )
    complete_one(api)
    deliver(settings, database_url)
    (row,) = rows(db)
    assert row["state"] != "delivered"
    assert "one of the server's own" in str(row["last_outcome"])
    assert receiver.hook_requests() == []


@pytest.mark.live
def test_the_sdk_s_watcher_client_drives_every_watcher_route(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    from queue_server.client import QueueClient, WatcherClient, errors

    with QueueClient(api.url, api.keys["operator"], tenant=api.tenant) as qs:
        hooks = WatcherClient(qs)
        made = hooks.create(receiver.url("/hook"), ["item.completed"], queues=["q"])
        assert made.secret is not None  # shown once
        assert (made.url, made.events, made.queues) == (
            receiver.url("/hook"),
            ["item.completed"],
            ["q"],
        )
        assert [w.watcher_id for w in hooks.list_watchers()] == [made.watcher_id]
        assert hooks.get(made.watcher_id).secret is None
        assert hooks.pause(made.watcher_id).state == "paused"
        assert hooks.resume(made.watcher_id).state == "active"
        rotated = hooks.rotate_secret(made.watcher_id)
        assert rotated.secret not in (None, made.secret)
        assert rotated.previous_secret_expires_at is not None
        # A delivery that fails until it is dead, then its replay.
        receiver.mode = "fail"
        complete_one(api)
        for _ in range(5):
            make_due(db)
            deliver(settings, database_url)
        (dead,) = hooks.deliveries(made.watcher_id, state="dead").deliveries
        assert hooks.deliveries(made.watcher_id, state="pending").deliveries == []
        assert hooks.delivery(dead.delivery_id).attempts == 5
        letters = api.operator.get("/v1/tenants/acme/dead-letters", params={"kind": "delivery"})
        (letter,) = letters.json()["dead_letters"]
        replayed = hooks.replay(letter["dead_letter_id"])
        assert (replayed.delivery_id, replayed.state, replayed.attempts) == (
            dead.delivery_id,
            "pending",
            0,
        )
        assert hooks.cancel(made.watcher_id).state == "cancelled"
        assert hooks.get(made.watcher_id).deliveries is not None
        with pytest.raises(errors.WatcherNotFoundError):
            hooks.get(str(uuid.uuid4()))
