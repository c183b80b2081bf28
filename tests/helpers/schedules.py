"""A scheduler without a server: the services of one API process on a test database, with
the clock pinned per pass (`fire_due(now=...)`), so days of ticks run in milliseconds."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, TypeVar

import orjson
import psycopg

from queue_server.auth import Principal
from queue_server.background.notifier import Notifier
from queue_server.db import Database
from queue_server.idempotency import Idempotency
from queue_server.infra.metrics import Metrics
from queue_server.models import Role
from queue_server.services import Services
from queue_server.services.keys import Keys
from queue_server.services.schedules import ScheduleSpec
from queue_server.services.ticks import CatchUp
from queue_server.settings import Settings

T = TypeVar("T")
Db = psycopg.Connection[dict[str, object]]
ADMIN = Principal(key_id="0" * 16, tenant=None, role=Role.ADMIN)


class Scheduler:
    """One process's services; `put` a schedule, `start_at` its cursor, `run` passes."""

    def __init__(self, services: Services, db: Db, tenant: str) -> None:
        self.services = services
        self.db = db
        self.tenant = tenant

    async def put(self, name: str, **fields: Any) -> dict[str, Any]:
        if "catch_up" in fields:
            fields["catch_up"] = CatchUp(fields["catch_up"])
        idem = Idempotency.of(
            uuid.uuid4().hex, caller=ADMIN.key_id, method="PUT", path=name, body=fields
        )
        answer = await self.services.schedules.put(
            ADMIN, self.tenant, name, ScheduleSpec(**fields), idem, instance=name
        )
        assert answer.status in (200, 201), answer.body
        return {"status": answer.status}

    async def trigger(self, name: str) -> int:
        idem = Idempotency.of(
            uuid.uuid4().hex, caller=ADMIN.key_id, method="POST", path=name, body={}
        )
        answer = await self.services.schedules.trigger(
            ADMIN, self.tenant, name, idem, instance=name
        )
        return answer.status

    async def pause(self, name: str, pause: bool = True) -> int:
        """Pause (or with False, resume) it as the pause and resume routes do."""
        idem = Idempotency.of(
            uuid.uuid4().hex, caller=ADMIN.key_id, method="POST", path=name, body={}
        )
        answer = await self.services.schedules.change(
            ADMIN, self.tenant, name, idem, instance=name, pause=pause
        )
        return answer.status

    async def show(self, name: str) -> dict[str, Any]:
        answer = await self.services.schedules.get(ADMIN, self.tenant, name)
        body: dict[str, Any] = orjson.loads(answer.body)
        return body

    def start_at(self, name: str, cursor: datetime) -> None:
        """As if the schedule had been created just before `cursor`."""
        self.db.execute(
            "UPDATE schedules SET next_tick_at = %s, due_at = %s WHERE name = %s",
            (cursor, cursor, name),
        )

    async def run(self, now: datetime) -> float | None:
        return await self.services.schedules.fire_due(now=now)

    def ticks(self, name: str) -> list[datetime]:
        """The tick of every item the schedule enqueued, in order (from their ledgers)."""
        rows = self.db.execute(
            "SELECT (data->>'tick_at')::timestamptz AS tick FROM item_events"
            " WHERE kind = 'scheduled' AND data->>'schedule' = %s AND NOT (data->>'trigger')::bool"
            " ORDER BY 1",
            (name,),
        ).fetchall()
        return [r["tick"] for r in rows]  # type: ignore[misc]

    def row(self, name: str) -> dict[str, Any]:
        row = self.db.execute("SELECT * FROM schedules WHERE name = %s", (name,)).fetchone()
        assert row is not None
        return dict(row)

    def fires(self, name: str) -> list[dict[str, Any]]:
        rows = self.db.execute(
            "SELECT f.* FROM schedule_fires f JOIN schedules s USING (tenant_id, schedule_id)"
            " WHERE s.name = %s ORDER BY tick_at, kind",
            (name,),
        ).fetchall()
        return [dict(r) for r in rows]


@asynccontextmanager
async def scheduler(
    settings: Settings, database_url: str, db: Db, tenant: str = "acme"
) -> AsyncIterator[Scheduler]:
    database = Database.for_api(settings, database_url)
    await database.open(wait=True)
    try:
        notifier = Notifier(database_url)  # never started: acquire is not used here
        services = Services.build(
            settings, database, keys=Keys(database), wakeups=notifier, metrics=Metrics()
        )
        yield Scheduler(services, db, tenant)
    finally:
        await database.close()
