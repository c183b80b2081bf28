"""/metrics counts each watcher's pending and dead deliveries."""

from __future__ import annotations

from queue_server.settings import Settings
from tests.helpers.api import Api, setup_tenant
from tests.helpers.items import sample
from tests.helpers.watchers import (
    Db,
    ModeReceiver,
    complete_one,
    deliver,
    make_due,
    register,
)


def test_metrics_count_a_watchers_pending_and_dead_deliveries(
    api: Api, db: Db, receiver: ModeReceiver, settings: Settings, database_url: str
) -> None:
    receiver.mode = "fail"
    watcher = register(api, receiver.url("/hook"))
    labels = {"tenant": "acme", "watcher": watcher["watcher_id"]}
    text = api.admin.get("/metrics").text
    assert sample(text, "queue_server_watcher_deliveries", **labels, state="pending") == 0
    assert sample(text, "queue_server_watcher_deliveries", **labels, state="dead") == 0

    complete_one(api)
    for _ in range(5):  # every attempt fails: the delivery is dead-lettered
        make_due(db)
        deliver(settings, database_url)
    complete_one(api)  # and one more waits
    text = api.operator.get("/metrics").text
    assert sample(text, "queue_server_watcher_deliveries", **labels, state="pending") == 1
    assert sample(text, "queue_server_watcher_deliveries", **labels, state="dead") == 1
    # A dead delivery's letter is the watcher's, not one of the queue's item dead letters:
    # in the tenant's scrape and in the admin's scrape of every tenant alike.
    everyone = api.admin.get("/metrics").text
    assert sample(everyone, "queue_server_watcher_deliveries", **labels, state="dead") == 1
    for scrape in (text, everyone):
        letters = sample(scrape, "queue_server_queue_open_dead_letters", tenant="acme", queue="q")
        assert letters == 0


def test_an_operators_scrape_shows_no_other_tenants_watcher(
    api: Api, receiver: ModeReceiver
) -> None:
    mine = register(api, receiver.url("/hook"))
    other = setup_tenant(api.url, api.admin, "globex")
    theirs = register(other, receiver.url("/hook"))
    text = api.operator.get("/metrics").text
    labels = {"tenant": "acme", "watcher": mine["watcher_id"]}
    assert sample(text, "queue_server_watcher_deliveries", **labels, state="pending") == 0
    assert theirs["watcher_id"] not in text
    assert "globex" not in text
    everyone = api.admin.get("/metrics").text
    their_labels = {"tenant": "globex", "watcher": theirs["watcher_id"]}
    assert sample(everyone, "queue_server_watcher_deliveries", **their_labels, state="pending") == 0


def test_a_watchers_series_are_zero_while_it_is_not_backlogged_and_gone_once_cancelled(
    api: Api, receiver: ModeReceiver
) -> None:
    watcher = register(api, receiver.url("/hook"))
    labels = {"tenant": "acme", "watcher": watcher["watcher_id"]}
    text = api.admin.get("/metrics").text
    assert sample(text, "queue_server_watcher_backlogged", **labels) == 0
    assert sample(text, "queue_server_watcher_deliveries", **labels, state="pending") == 0
    path = f"/v1/tenants/acme/watchers/{watcher['watcher_id']}/cancel"
    cancelled = api.operator.post(path, headers={"Idempotency-Key": "cancel-1"})
    assert cancelled.status_code == 200, cancelled.text
    text = api.admin.get("/metrics").text
    assert sample(text, "queue_server_watcher_deliveries", **labels, state="pending") is None
