"""The backlog ceiling: a tenant's backlog cap is at most the loaded policy's
durable-leased-work max-queued. A PUT above it is refused naming the cell; a cap stored
under a looser policy is held to the ceiling when work is admitted."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from queue_server.settings import Settings
from tests.helpers.api import Api, live_api, policy_file
from tests.helpers.invariants import Db
from tests.helpers.items import dead_letter_of, quarantine, replay

CELL = "durable-leased-work/backpressure"


def test_a_backlog_cap_above_the_policy_s_max_queued_is_refused_naming_the_cell(
    api: Api,
) -> None:
    above = api.admin.put("/v1/tenants/acme", json={"backlog_cap": 10_001})
    assert above.status_code == 422, above.text
    problem = above.json()
    assert [(e["loc"], e["cell"]) for e in problem["errors"]] == [(["body", "backlog_cap"], CELL)]
    assert CELL in problem["detail"]
    assert api.admin.get("/v1/tenants/acme").json()["backlog_cap"] == 1000  # unchanged
    at = api.admin.put("/v1/tenants/acme", json={"backlog_cap": 10_000})
    assert at.status_code == 200, at.text


@contextlib.contextmanager
def held_to(max_queued: int, tmp_path: Path, database_url: str, db: Db) -> Iterator[Api]:
    """A live server whose policy's max-queued is `max_queued`, and tenant acme's cap as
    stored under a looser policy: 1,000, which the loaded one would refuse."""
    backpressure: dict[str, Any] = {
        "mechanism": "durable-backlog-cap",
        "max-queued": max_queued,
        "reserve-for-active": True,
    }
    cells: dict[str, dict[str, object]] = {"durable-leased-work": {"backpressure": backpressure}}
    policy = policy_file(tmp_path / "small.json", cells, version="test.small-backlog")
    settings = Settings(data_dir=tmp_path, poll_interval=0.2, policy=str(policy))
    with live_api(settings, database_url, backlog_cap=max_queued) as api:
        db.execute("UPDATE tenants SET backlog_cap = 1000 WHERE tenant_id = 'acme'")
        yield api


def test_a_stored_cap_above_the_ceiling_is_held_to_it_at_admission(
    tmp_path: Path, database_url: str, db: Db
) -> None:
    with held_to(3, tmp_path, database_url, db) as api:
        for n in range(3):
            api.enqueue("q", {"n": n})
        refused = api.worker.post(
            "/v1/tenants/acme/queues/q/items",
            json={"payload": {"n": 3}},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert refused.status_code == 429, refused.text
        assert refused.json()["backlog_cap"] == 3
        batch = api.worker.post(
            "/v1/tenants/acme/queues/q/items:batch",
            json={"items": [{"payload": 1}]},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert batch.status_code == 429, batch.text
    row = db.execute("SELECT count(*) AS n FROM work_items").fetchone()
    assert row == {"n": 3}


def test_a_stored_cap_above_the_ceiling_is_held_to_it_at_replay(
    tmp_path: Path, database_url: str, db: Db
) -> None:
    with held_to(2, tmp_path, database_url, db) as api:
        letter = dead_letter_of(api, quarantine(api))  # out of the backlog: 0 of 2
        api.enqueue("q", {"n": 1})
        api.enqueue("q", {"n": 2})  # 2 of 2
        refused = replay(api, letter)
        assert refused.status_code == 429, refused.text
        assert refused.json()["backlog_cap"] == 2
    row = db.execute("SELECT count(*) AS n FROM work_items WHERE state = 'ready'").fetchone()
    assert row == {"n": 2}
