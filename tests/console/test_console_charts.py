"""A queue's charts: the figures the server draws read back to the values it sampled, for the
hour (from real enqueues and completions) and for the day (from the day's samples)."""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta
from typing import Any

import psycopg

from tests.helpers import charts
from tests.helpers.api import Api, setup_tenant
from tests.helpers.console import sign_in
from tests.helpers.items import sample_queues

Db = psycopg.Connection[dict[str, Any]]


def test_a_queues_figures_show_its_depth_rates_and_latency_as_the_api_left_them(
    api: Api,
) -> None:
    batch = api.worker.post(
        "/v1/tenants/acme/queues/mail/items:batch",
        json={"items": [{"payload": n} for n in range(50)]},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert batch.status_code == 201, batch.text
    for _ in range(20):
        (lease,) = api.acquire("mail")
        done = api.holder("complete", str(lease["item_id"]), worker="w1", fence=lease["fence"])
        assert done.status_code == 200, done.text
    failure = {"class": "Boom", "message": "m", "transient": True}
    (lease,) = api.acquire("mail")
    api.holder("triage", str(lease["item_id"]), worker="w1", fence=lease["fence"],
               failure=failure, decision="requeue", delay=0)  # fmt: skip

    client, _ = sign_in(api.url, api.keys["operator"])
    live = client.get("/console/tenants/acme/queues/mail/charts/live")
    assert live.status_code == 200, live.text
    assert live.headers["Cache-Control"] == "no-store"
    body = live.json()
    assert body["values"]["ready"] == "30"
    assert body["values"]["completed"] == "20"
    assert body["values"]["failed"] == "1"
    figures = body["figures"]
    assert set(figures) == {"throughput", "ready", "age", "latency"}

    ready = whole(charts.series(figures["ready"], 60)["ready"])
    assert ready[-1] == 30
    assert "30 now" in charts.label(figures["ready"])
    rates = {k: whole(v) for k, v in charts.series(figures["throughput"], 60).items()}
    # All of it happened within the last minute or two (a minute may have turned meanwhile).
    assert sum(v or 0 for v in rates["done"][-2:]) == 20
    assert sum(v or 0 for v in rates["failed"][-2:]) == 1
    assert sum(v or 0 for v in rates["done"][:-2]) == 0
    assert "20 and 1 in all" in charts.label(figures["throughput"])
    latency = charts.series(figures["latency"], 60)["latency"]
    assert any(v is not None for v in latency[-2:])
    assert all(v is None for v in latency[:-2])
    age = charts.series(figures["age"], 60)["age"]
    assert age[-1] is not None
    assert age[-1] >= 0

    # The page without its script draws the same figures.
    page = client.get("/console/tenants/acme/queues/mail/charts")
    assert page.status_code == 200
    drawn = charts.figures(page.text)
    assert whole(charts.series(drawn["ready"], 60)["ready"])[-1] == 30
    assert 'aria-current="page">1 h</a>' in page.text

    assert client.get("/console/tenants/acme/queues/mail/charts?span=7d").status_code == 422
    assert client.get("/console/tenants/acme/queues/-bad/charts").status_code == 422
    setup_tenant(api.url, api.admin, "globex")
    assert client.get("/console/tenants/globex/queues/mail/charts").status_code == 404
    assert client.get("/console/tenants/globex/queues/mail/charts/live").status_code == 404


def whole(values: list[float | None]) -> list[int | None]:
    """Counts read back from the drawing (a tenth of a pixel off at most)."""
    return [None if v is None else round(v) for v in values]


def _day_sample(db: Db, at: datetime, totals: tuple[int, int, int, int], ready: int,
                oldest: datetime | None, table: str = "queue_day_samples") -> None:  # fmt: skip
    db.execute(
        f"INSERT INTO {table} (tenant_id, queue, sampled_at, completed, failed,"
        " timed_completions, completion_ms, ready, oldest_ready_at)"
        " VALUES ('acme', 'daily', %s, %s, %s, %s, %s, %s, %s)",
        (at, *totals, ready, oldest),
    )


def test_the_days_figures_put_each_quarter_hours_samples_in_its_place(api: Api, db: Db) -> None:
    now = charts.clock_clear_of_the_grid(db)
    grid = charts.quarter_of(now)  # the quarter hour now running began
    # The day begins from the last sample before it; 10 h ago 10 completions (1 s each, 3
    # failures) and 7 items ready, the oldest 2 minutes; 5 h ago 60 more (2 s each), none
    # ready; nothing since.
    _day_sample(db, now - timedelta(hours=26), (90, 0, 90, 45_000), 0, None)
    ten = grid - timedelta(hours=10, minutes=1)
    _day_sample(db, ten, (100, 3, 100, 55_000), 7, ten - timedelta(seconds=120))
    five = grid - timedelta(hours=5, minutes=1)
    _day_sample(db, five, (160, 3, 160, 175_000), 0, None)
    db.execute(
        "INSERT INTO counter_deltas (tenant_id, queue, completed, failed,"
        " timed_completions, completion_ms) VALUES ('acme', 'daily', 160, 3, 160, 175000)"
    )

    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/queues/daily/charts", params={"span": "24h"})
    assert page.status_code == 200, page.text
    assert 'aria-current="page">24 h</a>' in page.text
    drawn = charts.figures(page.text)
    # Step j ends at the mark 95 - j quarter hours back (on the grid; j = 95 ends now): 10 h
    # back is the 41st mark.
    at_ten, at_five = 95 - 41, 95 - 21
    done = {k: whole(v) for k, v in charts.series(drawn["throughput"], 96).items()}
    assert done["done"] == [10 if j == at_ten else 60 if j == at_five else 0 for j in range(96)]
    assert done["failed"] == [3 if j == at_ten else 0 for j in range(96)]
    ready = whole(charts.series(drawn["ready"], 96)["ready"])
    assert ready == [7 if at_ten <= j < at_five else 0 for j in range(96)]
    age = charts.series(drawn["age"], 96)["age"]
    expected = [180 + 900 * (j - at_ten) if at_ten <= j < at_five else 0 for j in range(96)]
    top = max(expected)
    assert all(abs((a or 0) - e) <= top / 100 for a, e in zip(age, expected, strict=True)), age
    latency = charts.series(drawn["latency"], 96)["latency"]
    assert [None if v is None else round(v, 1) for v in latency] == [
        1.0 if j == at_ten else 2.0 if j == at_five else None for j in range(96)
    ]
    assert "2 s in the latest 15 minutes with a completion" in charts.label(drawn["latency"])
    assert "0 now, at most 7" in charts.label(drawn["ready"])
    assert "no item waiting now. Longest 4h 48m." in charts.label(drawn["age"])
    live = client.get("/console/tenants/acme/queues/daily/charts/live", params={"span": "24h"})
    assert live.json()["values"] == {
        "ready": "0",
        "oldest_ready_age": "—",
        "completed": "70",
        "failed": "3",
        "latency": "2 s",
        "span": "day",
        "step": "quarter hour",
    }


def test_the_overviews_sparkline_has_a_point_for_each_of_the_last_sixty_minutes(api: Api) -> None:
    """The last point is the minute now running: its one completion is the peak."""
    api.enqueue("mail", 1)
    _complete_next(api, "mail")
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/queues")
    assert page.status_code == 200, page.text
    found = re.search(r'data-chart="mail".*?<polyline class="done" points="([^"]*)"', page.text)
    assert found, "no sparkline of mail"
    points = [tuple(float(v) for v in p.split(",")) for p in found.group(1).split()]
    assert len(points) == 60
    assert [y for _, y in points[:-1]] == [points[0][1]] * 59  # nothing before
    assert points[-1][1] < points[0][1]


def test_the_overviews_minutes_end_at_the_samples_taken_at_their_edges(
    api: Api, db: Db, database_url: str
) -> None:
    # Two completions, sampled a minute and a half ago; one more since: the minute now
    # running counts one, the minute before it the two (the sample is its end's total).
    for n in range(3):
        api.enqueue("mail", n)
    for n in range(3):
        if n == 2:
            sample_queues(database_url)
            db.execute("UPDATE queue_samples SET sampled_at = sampled_at - interval '90 seconds'")
        _complete_next(api, "mail")
    client, _ = sign_in(api.url, api.keys["operator"])
    live = client.get("/console/tenants/acme/queues/live")
    assert live.status_code == 200, live.text
    chart = live.json()["charts"]["mail"]
    assert (chart["peak"], chart["done_hour"]) == (2, 3)


def _complete_next(api: Api, queue: str) -> None:
    """Lease the queue's next item and complete it."""
    (lease,) = api.acquire(queue)
    done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"])
    assert done.status_code == 200, done.text
