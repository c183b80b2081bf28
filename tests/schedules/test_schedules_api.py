"""Schedules over HTTP: the resource (put, show, list, delete), pause, resume, trigger,
roles and tenant isolation, validation, idempotency; a real server and its scheduler loop."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from datetime import datetime
from typing import Any

import httpx
import psycopg
import pytest

from tests.helpers.api import Api, setup_tenant

Db = psycopg.Connection[dict[str, object]]
PATH = "/v1/tenants/acme/schedules"


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def put(client: httpx.Client, name: str, key: str | None = None, **body: Any) -> httpx.Response:
    return client.put(
        f"{PATH}/{name}", json=body, headers={"Idempotency-Key": key or uuid.uuid4().hex}
    )


def act(client: httpx.Client, name: str, action: str) -> httpx.Response:
    return client.post(f"{PATH}/{name}/{action}", headers=_key())


def _times(values: list[str]) -> list[datetime]:
    return [datetime.fromisoformat(v.replace("Z", "+00:00")) for v in values]


def scheduled_items(db: Db, schedule: str) -> list[dict[str, Any]]:
    """Every item a schedule enqueued, by its `scheduled` ledger event."""
    rows = db.execute(
        "SELECT e.item_id::text AS item_id, e.data, w.queue, w.payload FROM item_events e"
        " JOIN work_items w USING (tenant_id, item_id)"
        " WHERE e.kind = 'scheduled' AND e.data->>'schedule' = %s ORDER BY e.data->>'tick_at'",
        (schedule,),
    ).fetchall()
    return [dict(r) for r in rows]


def test_put_creates_then_replaces_and_shows_the_next_fire_times(api: Api) -> None:
    created = put(
        api.operator,
        "nightly",
        queue="reports",
        payload={"report": "sales"},
        cron="30 2 * * *",
        timezone="Europe/Berlin",
        catch_up="latest",
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["schedule"] == "nightly"
    assert body["cron"] == "30 2 * * *"
    assert body["every"] is None
    assert (body["catch_up"], body["catch_up_limit"], body["paused"]) == ("latest", 100, False)
    fires = _times(body["next_fires"])
    assert len(fires) == 5
    assert fires == sorted(fires)
    # 02:30 in Berlin is 00:30 or 01:30 UTC, a day apart.
    assert all(f.minute == 30 and f.hour in (0, 1) for f in fires)
    assert {(b - a).total_seconds() for a, b in itertools.pairwise(fires)} <= {
        82800.0,
        86400.0,
        90000.0,
    }

    replaced = put(api.operator, "nightly", queue="reports", every=3600, catch_up="all-bounded")
    assert replaced.status_code == 200, replaced.text
    again = replaced.json()
    assert again["schedule_id"] == body["schedule_id"]
    assert (again["cron"], again["every"], again["payload"]) == (None, 3600, None)
    assert all(f.minute == 0 and f.second == 0 for f in _times(again["next_fires"]))

    shown = api.operator.get(f"{PATH}/nightly")
    assert shown.status_code == 200
    assert shown.json()["recent_fires"] == []
    put(api.operator, "hourly", queue="q", every=3600)
    listed = api.operator.get(PATH).json()
    assert [s["schedule"] for s in listed["schedules"]] == ["hourly", "nightly"]
    assert listed["next_cursor"] is None
    first = api.operator.get(PATH, params={"limit": 1}).json()
    assert [s["schedule"] for s in first["schedules"]] == ["hourly"]
    rest = api.operator.get(PATH, params={"limit": 1, "cursor": first["next_cursor"]}).json()
    assert [s["schedule"] for s in rest["schedules"]] == ["nightly"]
    assert rest["next_cursor"] is None  # the last page, full, says so


def test_invalid_schedules_are_refused_with_the_reason(api: Api) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"queue": "q"}, "exactly one of"),
        ({"queue": "q", "cron": "* * * * *", "every": 5}, "exactly one of"),
        ({"queue": "q", "cron": "61 * * * *"}, "not a cron expression"),
        ({"queue": "q", "cron": "* * * * * *"}, "not a cron expression"),
        ({"queue": "q", "cron": "0 0 30 2 *"}, "never fires"),
        ({"queue": "q", "every": 60, "timezone": "Mars/Olympus"}, "Unknown time zone"),
        ({"queue": "q", "every": 0}, "every"),
        ({"queue": "q", "every": 60, "catch_up": "sometimes"}, "catch_up"),
        ({"queue": "bad queue", "every": 60}, "queue"),
    ]
    for body, reason in cases:
        response = put(api.operator, "bad", **body)
        assert response.status_code == 422, (body, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        assert reason in response.text, (body, response.text)
    assert api.operator.get(f"{PATH}/bad").status_code == 404


def test_every_effect_needs_an_idempotency_key_and_a_repeat_replays(api: Api) -> None:
    body = {"queue": "q", "every": 60}
    assert api.operator.put(f"{PATH}/s", json=body).status_code == 400
    first = put(api.operator, "s", key="k1", **body)
    again = put(api.operator, "s", key="k1", **body)
    assert (first.status_code, again.status_code) == (201, 201)
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json() == first.json()
    assert put(api.operator, "s", key="k1", queue="other", every=60).status_code == 422
    for action in ("pause", "resume", "trigger"):
        assert api.operator.post(f"{PATH}/s/{action}").status_code == 400
    assert api.operator.delete(f"{PATH}/s").status_code == 400
    trigger = {"Idempotency-Key": "t1"}
    one = api.operator.post(f"{PATH}/s/trigger", headers=trigger)
    two = api.operator.post(f"{PATH}/s/trigger", headers=trigger)
    assert (one.status_code, two.status_code) == (201, 201)
    assert one.json()["item"]["item_id"] == two.json()["item"]["item_id"]
    gone = {"Idempotency-Key": "d1"}
    assert api.operator.delete(f"{PATH}/s", headers=gone).status_code == 204
    replay = api.operator.delete(f"{PATH}/s", headers=gone)
    assert (replay.status_code, replay.headers["Idempotent-Replayed"]) == (204, "true")
    assert api.operator.delete(f"{PATH}/s", headers=_key()).status_code == 404
    assert api.operator.get(f"{PATH}/s").json()["code"] == "schedule-not-found"


def test_another_tenants_schedule_is_a_404_and_a_worker_key_is_403(api: Api) -> None:
    assert put(api.operator, "mine", queue="q", every=60).status_code == 201
    other = setup_tenant(api.url, api.admin, "globex")
    for response in (
        other.operator.get(PATH),
        other.operator.get(f"{PATH}/mine"),
        put(other.operator, "mine", queue="q", every=5),
        other.operator.delete(f"{PATH}/mine", headers=_key()),
        *(act(other.operator, "mine", a) for a in ("pause", "resume", "trigger")),
    ):
        assert response.status_code == 404, response.text
        assert response.json()["code"] == "tenant-not-found"
    # Its own schedule of the same name is another schedule.
    theirs = other.operator.put(
        "/v1/tenants/globex/schedules/mine", json={"queue": "q", "every": 5}, headers=_key()
    )
    assert theirs.status_code == 201
    assert api.operator.get(f"{PATH}/mine").json()["every"] == 60
    assert api.worker.get(PATH).status_code == 403
    assert put(api.worker, "w", queue="q", every=60).status_code == 403
    assert act(api.worker, "mine", "trigger").status_code == 403
    assert api.admin.get(f"{PATH}/mine").status_code == 200


def test_trigger_enqueues_one_run_now_with_its_ledger_event_even_when_paused(
    api: Api, db: Db
) -> None:
    put(api.operator, "report", queue="reports", payload={"kind": "daily"}, cron="0 3 * * *")
    paused = act(api.operator, "report", "pause")
    assert paused.status_code == 200
    assert (paused.json()["paused"], paused.json()["next_fires"]) == (True, [])
    fired = act(api.operator, "report", "trigger")
    assert fired.status_code == 201, fired.text
    item = fired.json()["item"]
    assert (item["queue"], item["payload"], item["state"]) == (
        "reports",
        {"kind": "daily"},
        "ready",
    )
    ledger = api.operator.get(f"/v1/tenants/acme/items/{item['item_id']}/ledger").json()["events"]
    assert [e["kind"] for e in ledger] == ["enqueued", "scheduled"]
    assert ledger[1]["data"]["schedule"] == "report"
    assert ledger[1]["data"]["trigger"] is True
    assert _times([ledger[1]["data"]["tick_at"]]) == _times([fired.json()["tick_at"]])
    assert api.acquire("reports")[0]["item_id"] == item["item_id"]
    shown = api.operator.get(f"{PATH}/report").json()
    assert [(f["kind"], f["outcome"], f["item_id"]) for f in shown["recent_fires"]] == [
        ("trigger", "enqueued", item["item_id"])
    ]
    verify = api.operator.get("/v1/tenants/acme/ledger-verification")
    assert verify.status_code == 200, verify.text
    assert verify.json()["mismatches"] == []
    assert 'queue_server_schedule_fires_total{schedule="report",tenant="acme"} 1.0' in (
        api.admin.get("/metrics").text
    )


def test_a_schedule_holds_its_items_to_the_policys_attempt_cap(api: Api, db: Db) -> None:
    refused = put(api.operator, "s", queue="q", every=3600, max_acquisitions=6)
    assert refused.status_code == 422, refused.text
    [error] = refused.json()["errors"]
    assert (error["loc"], error["cell"]) == (
        ["body", "max_acquisitions"],
        "durable-leased-work/retry",
    )
    assert api.operator.get(f"{PATH}/s").status_code == 404
    assert put(api.operator, "s", queue="q", every=3600, max_acquisitions=5).status_code == 201
    # A schedule stored under a looser policy fires within the loaded one.
    db.execute("UPDATE schedules SET max_acquisitions = 50 WHERE name = 's'")
    assert act(api.operator, "s", "trigger").status_code == 201
    [item] = scheduled_items(db, "s")
    shown = api.worker.get(f"/v1/tenants/acme/items/{item['item_id']}").json()
    assert shown["max_acquisitions"] == 5


def test_trigger_at_the_backlog_cap_is_a_429_and_enqueues_nothing(api: Api, db: Db) -> None:
    api.admin.put(
        "/v1/tenants/acme",
        json={"backlog_cap": 1, "default_max_acquisitions": 3, "default_lease_ttl": 30},
    )
    api.enqueue("q")
    put(api.operator, "s", queue="q", every=3600)
    refused = act(api.operator, "s", "trigger")
    assert refused.status_code == 429
    assert refused.json()["code"] == "backlog-cap-reached"
    assert scheduled_items(db, "s") == []
    assert 'queue_server_schedule_refusals_total{schedule="s",tenant="acme"} 1.0' in (
        api.admin.get("/metrics").text
    )


@pytest.mark.parametrize("change", ["resume", "put"])
def test_a_change_that_waited_for_the_schedule_row_starts_after_the_moment_it_went_through(
    api: Api, db: Db, database_url: str, change: str
) -> None:
    """A resume, or a put that restarts the cursor, waiting on a held row (a scheduler pass,
    another change) reckons its first tick from when it got the row: the next fire it shows
    is after its `updated_at`, not a tick that went by while it waited."""
    assert put(api.operator, "tick", queue="ticks", every=1, paused=True).status_code == 201
    answers: list[httpx.Response] = []
    with psycopg.connect(database_url) as holder:
        holder.execute("SELECT 1 FROM schedules WHERE name = 'tick' FOR UPDATE")
        if change == "resume":
            waiter = threading.Thread(
                target=lambda: answers.append(act(api.operator, "tick", "resume"))
            )
        else:
            waiter = threading.Thread(
                target=lambda: answers.append(put(api.operator, "tick", queue="ticks", every=1))
            )
        waiter.start()
        deadline = time.monotonic() + 10
        while not db.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE '%%FROM schedules%%'"
        ).fetchone():
            assert time.monotonic() < deadline, "the change never waited for the row"
            time.sleep(0.02)
        time.sleep(1.1)  # past a whole second: a tick goes by while the change waits
        holder.rollback()
    waiter.join(timeout=10)
    assert len(answers) == 1, "the change did not answer"
    assert answers[0].status_code == 200, answers[0].text
    body = answers[0].json()
    assert body["paused"] is False
    assert _times(body["next_fires"])[0] > _times([body["updated_at"]])[0]


def test_the_loop_fires_each_second_pause_stops_it_and_resume_starts_after_now(
    api: Api, db: Db
) -> None:
    created = put(api.operator, "tick", queue="ticks", payload={"n": 1}, every=1)
    assert created.status_code == 201
    time.sleep(3.2)
    paused = act(api.operator, "tick", "pause").json()
    time.sleep(0.3)  # a pass that held the row when the pause came has committed
    before = scheduled_items(db, "tick")
    assert 2 <= len(before) <= 4
    ticks = _times([i["data"]["tick_at"] for i in before])
    assert all(t.microsecond == 0 for t in ticks)
    assert [(b - a).total_seconds() for a, b in itertools.pairwise(ticks)] == [1.0] * (
        len(ticks) - 1
    )
    assert all(i["queue"] == "ticks" and i["payload"] == {"n": 1} for i in before)
    assert paused["fires"] in (len(before), len(before) - 1)
    time.sleep(2)
    assert len(scheduled_items(db, "tick")) == len(before)

    resumed = act(api.operator, "tick", "resume").json()
    assert resumed["paused"] is False
    first_next = _times(resumed["next_fires"])[0]
    assert first_next > _times([resumed["updated_at"]])[0]
    time.sleep(2.2)
    act(api.operator, "tick", "pause")
    time.sleep(0.3)  # no fire after this: the items and the lag histogram agree
    after = scheduled_items(db, "tick")
    new_ticks = _times([i["data"]["tick_at"] for i in after[len(before) :]])
    assert new_ticks, "nothing fired after the resume"
    # The ticks of the pause were not caught up: the first new one is the first after resume.
    assert new_ticks[0] == first_next
    shown = api.operator.get(f"{PATH}/tick").json()
    assert (shown["skipped"], shown["refusals"]) == (0, 0)
    assert all(f["outcome"] == "enqueued" for f in shown["recent_fires"])
    metrics = api.admin.get("/metrics").text
    assert "queue_server_schedule_lag_seconds_count" in metrics
    lag_count = next(
        float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith("queue_server_schedule_lag_seconds_count")
    )
    assert lag_count == len(after)


@pytest.mark.live
def test_the_sdk_s_schedule_client_is_exported_with_the_client(api: Api) -> None:
    from queue_server.client import QueueClient, ScheduleClient, errors

    with QueueClient(api.url, api.keys["operator"], tenant=api.tenant) as qs:
        schedules = ScheduleClient(qs)
        schedules.put("nightly-sdk", queue="reports", cron="30 2 * * *", timezone="UTC")
        assert [s.schedule for s in schedules.list_schedules().schedules] == ["nightly-sdk"]
        # Every route of the client, each field of a put as the server keeps it.
        made = schedules.put(
            "hourly-sdk", queue="reports", every=3600, timezone="Europe/Berlin",
            payload={"report": "sales"}, priority=7, max_acquisitions=3, catch_up="all-bounded",
            catch_up_limit=5, paused=True,
        )  # fmt: skip
        shown = schedules.get("hourly-sdk")
        assert (shown.every, shown.cron, shown.timezone, shown.payload) == (
            3600, None, "Europe/Berlin", {"report": "sales"},
        )  # fmt: skip
        assert (shown.priority, shown.max_acquisitions, shown.catch_up) == (7, 3, "all-bounded")
        assert (shown.catch_up_limit, shown.paused, made.paused) == (5, True, True)
        assert schedules.resume("hourly-sdk").paused is False
        assert schedules.pause("hourly-sdk").paused is True
        fired = schedules.trigger("hourly-sdk")
        assert (fired.schedule, fired.item.queue, fired.item.payload) == (
            "hourly-sdk", "reports", {"report": "sales"},
        )  # fmt: skip
        assert fired.item.priority == 7
        assert schedules.get("hourly-sdk").recent_fires
        schedules.delete("hourly-sdk")
        with pytest.raises(errors.ScheduleNotFoundError):
            schedules.get("hourly-sdk")
        assert [s.schedule for s in schedules.list_schedules().schedules] == ["nightly-sdk"]
