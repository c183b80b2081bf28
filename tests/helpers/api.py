"""A tenant and its clients: admin, operator and worker keys over HTTP to the server under test."""

from __future__ import annotations

import contextlib
import copy
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from queue_server.client.connection import tls_context
from queue_server.settings import Settings
from tests.helpers.server import LiveServer, make_admin_key, transport_for


@dataclass
class Api:
    """HTTP clients of one tenant: admin, operator and worker keys."""

    url: str
    tenant: str
    admin: httpx.Client
    operator: httpx.Client
    worker: httpx.Client
    keys: dict[str, str] = field(default_factory=dict)

    def client(self, key: str | None) -> httpx.Client:
        """Another client of the same server: with `key`, or none."""
        return client_for(self.url, key)

    def enqueue(
        self, queue: str = "q", payload: object = None, **fields: object
    ) -> dict[str, object]:
        response = self.worker.post(
            f"/v1/tenants/{self.tenant}/queues/{queue}/items",
            json={"payload": payload, **fields},
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert response.status_code == 201, response.text
        body: dict[str, object] = response.json()
        return body

    def acquire(
        self, queue: str = "q", worker: str = "w1", ttl: float = 30, **fields: object
    ) -> list[dict[str, object]]:
        response = self.worker.post(
            f"/v1/tenants/{self.tenant}/queues/{queue}/leases",
            json={"worker": worker, "lease_ttl": ttl, **fields},
        )
        assert response.status_code == 200, response.text
        leases: list[dict[str, object]] = response.json()["leases"]
        return leases

    def holder(
        self, action: str, item_id: object, key: str | None = None, **body: object
    ) -> httpx.Response:
        return self.worker.post(
            f"/v1/tenants/{self.tenant}/items/{item_id}/{action}",
            json=body,
            headers={"Idempotency-Key": key or uuid.uuid4().hex},
        )

    def approve(self, queue: str, max_concurrency: int, days: float = 30) -> dict[str, object]:
        """A spend approval by the operator key, for `days` (an approval lasts up to a year)."""
        expires_at = datetime.now(UTC) + timedelta(days=days)
        response = self.operator.post(
            f"/v1/tenants/{self.tenant}/queues/{queue}/spend-approvals",
            json={
                "max_concurrency": max_concurrency,
                "expires_at": expires_at.isoformat(),
                "reason": "load test",
            },
            headers={"Idempotency-Key": uuid.uuid4().hex},
        )
        assert response.status_code == 201, response.text
        approval: dict[str, object] = response.json()
        return approval


def client_for(url: str, key: str | None) -> httpx.Client:
    """A client of the server at `url` with `key`: over its socket, or into an in-process app."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(
        base_url=url,
        headers=headers,
        timeout=30,
        transport=transport_for(url),
        verify=tls_context(),
    )


def setup_tenant(url: str, admin: httpx.Client, tenant: str, backlog_cap: int = 1000) -> Api:
    response = admin.put(
        f"/v1/tenants/{tenant}",
        json={"backlog_cap": backlog_cap, "default_max_acquisitions": 3},
    )
    assert response.status_code == 200, response.text
    keys = {}
    for role in ("worker", "operator"):
        created = admin.post(f"/v1/tenants/{tenant}/keys", json={"role": role})
        assert created.status_code == 201, created.text
        keys[role] = created.json()["secret"]
    return Api(
        url=url,
        tenant=tenant,
        admin=admin,
        operator=client_for(url, keys["operator"]),
        worker=client_for(url, keys["worker"]),
        keys=keys,
    )


def policy_document(
    cells: dict[str, dict[str, object]], version: str = "test.v1"
) -> dict[str, Any]:
    """A policy document of one's own: the built-in one under `version`, with `cells`
    ({class: {dimension: cell}}) replaced."""
    from queue_server.policy.v2 import OPERATION_RELIABILITY_V2

    doc = copy.deepcopy(OPERATION_RELIABILITY_V2)
    doc["version"] = version
    for cls, replaced in cells.items():
        doc["classes"][cls].update(replaced)
    return doc


def policy_file(path: Path, cells: dict[str, dict[str, object]], version: str = "test.v1") -> Path:
    """`policy_document(cells, version)` written to `path`, for --policy /
    QUEUE_SERVER_POLICY / Settings.policy."""
    path.write_text(json.dumps(policy_document(cells, version)))
    return path


@contextlib.contextmanager
def live_api(
    settings: Settings, database_url: str, tenant: str = "acme", backlog_cap: int = 1000
) -> Iterator[Api]:
    """A live server with `settings` (e.g. a policy file) and one tenant with its keys."""
    server = LiveServer(settings, database_url)
    server.start()
    try:
        with client_for(server.url, make_admin_key(settings, database_url)) as admin:
            yield setup_tenant(server.url, admin, tenant, backlog_cap)
    finally:
        server.stop()


def tight_policy(path: Path, *, max_acquisitions: int, max_queued: int) -> Path:
    """A policy file whose retry cell caps an item's budget at `max_acquisitions` and whose
    backpressure cell holds every tenant's backlog cap to `max_queued`."""
    return policy_file(
        path,
        {
            "durable-leased-work": {
                "retry": {
                    "kind": "queue-reacquisition",
                    "max-acquisitions": max_acquisitions,
                    "delay-seconds": 0,
                    "advances-fence": True,
                    "advances-acquisition-count": True,
                    "on-exhausted": "quarantine",
                },
                "backpressure": {
                    "mechanism": "durable-backlog-cap",
                    "max-queued": max_queued,
                    "reserve-for-active": True,
                },
            }
        },
    )
