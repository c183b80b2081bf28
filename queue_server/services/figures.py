"""The figures `/metrics` publishes, read at scrape time from bounded queries only: per
queue its items by state (from the queue's cursor: store/queues.py `open_figures`), ages, leases, dead letters, pause and the counters of finished
work; per watcher its pending and dead deliveries; every tenant's items by state; and the
database's health: what holds back its xmin horizon, and (in the admin's view only) the
live and dead row versions of the hot tables."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from queue_server.db import Database
from queue_server.services.queues import queue_figures
from queue_server.store import health, queues, tenants
from queue_server.store.types import Conn, Row

# Enough for every tenant of a deployment: one page of them per scrape.
MAX_TENANTS = 100_000


@dataclass(frozen=True, slots=True)
class Horizon:
    """One kind of holder of the database's xmin horizon (`snapshot`, `replication_slot`,
    `prepared_transaction`): how many, the oldest one's age in seconds (None without one,
    and for replication slots, which keep no time) and in transactions."""

    holder: str
    holders: int
    age_seconds: float | None
    xid_age: int


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one scrape publishes, as plain values."""

    tenants: list[str]
    # One queue's figures (`queue_figures`) with its "tenant".
    queues: list[dict[str, Any]]
    # {"tenant", "watcher_id", "pending", "dead"} per active or paused watcher.
    watchers: list[dict[str, Any]] = field(default_factory=list)
    # What holds back the horizon, each kind (database-wide: no tenant's data).
    horizon: list[Horizon] = field(default_factory=list)
    # {"table", "live", "dead"} per hot table: every tenant's traffic, so only in the
    # view of every tenant (`tenant` None).
    tables: list[dict[str, Any]] = field(default_factory=list)
    # {"tenant", "queue", "expires_in", "expiring"} per queue with a live spend approval:
    # the one behind its approved limit.
    approvals: list[dict[str, Any]] = field(default_factory=list)


async def horizon(conn: Conn) -> list[Horizon]:
    """Each kind of holder of the xmin horizon, every kind present."""
    return [
        Horizon(
            holder=r["holder"],
            holders=int(r["holders"]),
            age_seconds=None if r["age_seconds"] is None else float(r["age_seconds"]),
            xid_age=int(r["xid_age"]),
        )
        for r in await health.horizon_holders(conn)
    ]


async def snapshot(
    conn: Conn, *, tenant: str | None, approval_warning: timedelta = timedelta(days=1)
) -> Snapshot:
    """Every tenant's figures (`tenant` None), or one tenant's; the horizon's holders in
    both, the hot tables' row versions only in the first; the live spend approvals, each
    `expiring` when it ends within `approval_warning`."""
    if tenant is None:
        names = [
            r["tenant_id"] for r in await tenants.list_tenants(conn, after=None, limit=MAX_TENANTS)
        ]
        finished = await queues.all_finished_counts(conn)
        settings = await queues.all_settings(conn)
        letters = {
            (r["tenant_id"], r["queue"]): int(r["n"])
            for r in await queues.all_open_dead_letters(conn)
        }
    else:
        names = [tenant]
        finished = await queues.finished_counts(conn, tenant=tenant)
        settings = await queues.settings(conn, tenant=tenant)
        letters = {
            (tenant, name): n
            for name, n in (await queues.open_dead_letters(conn, tenant=tenant)).items()
        }
    set_up: dict[tuple[str, str], Row] = {(r["tenant_id"], r["queue"]): r for r in settings}
    done = {(r["tenant_id"], r["queue"]): r for r in finished}
    # Every queue that ever admitted an item has counters.
    keys = sorted({*done, *set_up, *letters})
    opened = dict(zip(keys, await queues.open_figures(conn, keys), strict=True))
    figures = []
    for key in keys:
        row = queue_figures(
            key[1],
            open_row=opened.get(key),
            finished=done.get(key),
            setting=set_up.get(key),
            open_dead_letters=letters.get(key, 0),
            limits=None,
        )
        figures.append({**row, "tenant": key[0]})
    watchers: dict[tuple[str, str], dict[str, Any]] = defaultdict(dict)
    for r in await queues.all_watcher_deliveries(conn):
        if tenant is not None and r["tenant_id"] != tenant:
            continue
        counts = watchers[(r["tenant_id"], r["watcher_id"])]
        counts[r["state"]] = int(r["n"])
    return Snapshot(
        tenants=names,
        queues=figures,
        watchers=[
            {
                "tenant": t,
                "watcher_id": w,
                "pending": counts.get("pending", 0),
                "dead": counts.get("dead", 0),
                "backlogged": counts.get("backlogged", 0),
                "oldest_pending_age": counts.get("lag", 0),
            }
            for (t, w), counts in sorted(watchers.items())
        ],
        horizon=await horizon(conn),
        tables=[] if tenant is not None else await health.table_tuples(conn),
        approvals=[
            {
                "tenant": r["tenant_id"],
                "queue": r["queue"],
                "expires_in": float(r["expires_in"]),
                "expiring": bool(r["expiring"]),
            }
            for r in await queues.live_approvals(conn, tenant=tenant, warn=approval_warning)
        ],
    )


class Figures:
    """The scrape-time figures of the API's `/metrics`, and the console's horizon warning."""

    def __init__(
        self,
        db: Database,
        *,
        horizon_warning_age: float,
        approval_warning: timedelta = timedelta(days=1),
    ) -> None:
        self.db = db
        self.horizon_warning_age = horizon_warning_age
        self.approval_warning = approval_warning

    async def snapshot(self, tenant: str | None) -> Snapshot:
        async with self.db.conn() as conn:
            return await snapshot(conn, tenant=tenant, approval_warning=self.approval_warning)

    async def held_horizon(self) -> Horizon | None:
        """The oldest snapshot or prepared transaction, when it has held the horizon longer
        than `horizon_warning_age` seconds; else None (slots keep no time to compare)."""
        async with self.db.conn() as conn:
            holders = await horizon(conn)
        timed = [h for h in holders if h.age_seconds is not None]
        oldest = max(timed, key=lambda h: h.age_seconds or 0.0, default=None)
        if oldest is None or (oldest.age_seconds or 0.0) < self.horizon_warning_age:
            return None
        return oldest
