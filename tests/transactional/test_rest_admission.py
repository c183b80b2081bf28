"""The REST route's enqueue goes through the same SQL admission (`queue_server.admit`):
with the early, lock-free refusal out of the way, the admission itself holds a stored cap to
the loaded policy's max-queued, a stored default budget to its attempt cap, refuses a batch
all or nothing, and its refusal is the API's 429 with the figures."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from queue_server.services.items import Items
from queue_server.settings import Settings
from tests.helpers.api import Api, client_for, setup_tenant, tight_policy
from tests.helpers.server import LiveServer, make_admin_key

DB = psycopg.Connection[dict[str, object]]


@pytest.fixture
def tight(tmp_path: Path, database_url: str, db: DB) -> Iterator[Api]:
    """A server under a policy of attempt cap 3 and max-queued 3, and a tenant stored under
    a looser one (cap 1000, default budget 5); its early refusal turned off."""
    path = tight_policy(tmp_path / "tight.json", max_acquisitions=3, max_queued=3)
    settings = Settings(data_dir=tmp_path, poll_interval=0.2, policy=str(path))
    server = LiveServer(settings, database_url)
    server.start()
    try:
        items: Items = server.app.state.services.items

        async def admit_everything(*args: object) -> None:
            return None

        # Only the exact admission under the tenant's lock decides here.
        items._refuse_early_at_cap = admit_everything  # type: ignore[method-assign,assignment]
        with client_for(server.url, make_admin_key(settings, database_url)) as admin:
            api = setup_tenant(server.url, admin, "acme", backlog_cap=3)
            db.execute("UPDATE tenants SET backlog_cap = 1000, default_max_acquisitions = 5")
            yield api
    finally:
        server.stop()


def post(api: Api, path: str, body: object) -> tuple[int, dict[str, object]]:
    response = api.worker.post(
        f"/v1/tenants/acme/queues/q/{path}",
        json=body,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    return response.status_code, response.json()


def test_the_rest_admission_holds_the_stored_cap_and_budget_to_the_loaded_policy(
    tight: Api,
) -> None:
    status, first = post(tight, "items", {"payload": 1})
    assert status == 201
    assert first["max_acquisitions"] == 3  # the stored default 5, held to the attempt cap
    status, refused = post(tight, "items:batch", {"items": [{"payload": 2}] * 3})
    assert status == 429
    assert (refused["code"], refused["backlog"], refused["backlog_cap"], refused["requested"]) == (
        "backlog-cap-reached",
        1,
        3,
        3,
    )
    assert refused["detail"] == "Backlog 1 + 3 new would exceed the cap of 3."
    status, _ = post(tight, "items:batch", {"items": [{"payload": 2}] * 2})
    assert status == 201
    status, full = post(tight, "items", {"payload": 4})
    assert status == 429
    assert (full["backlog"], full["requested"]) == (3, 1)
    assert tight.operator.get("/v1/tenants/acme").json()["backlog"] == 3
