"""The database's own health, as the statistics views tell it: what holds back the xmin
horizon (snapshots, replication slots, prepared transactions) and the live and dead row
versions of the queue's hot tables."""

from __future__ import annotations

from queue_server.store.sql import fetch_all, load
from queue_server.store.types import Conn, Row

_SQL = load("health")

# The tables every transition, admission or delivery updates (names as in store/tables.py,
# which a server process does not import): while the horizon is held, their dead versions
# stay.
HOT_TABLES = (
    "work_items",
    "item_events",
    "counter_deltas",
    "counter_bases",
    "tenants",
    "outbox_deliveries",
    "idempotency_receipts",
)


async def horizon_holders(conn: Conn) -> list[Row]:
    """One row per kind of holder (`snapshot`, `replication_slot`, `prepared_transaction`):
    `holders`, `age_seconds` of the oldest (None without one, or for slots), `xid_age`."""
    return await fetch_all(conn, _SQL["horizon_holders"], {})


async def table_tuples(conn: Conn, tables: tuple[str, ...] = HOT_TABLES) -> list[Row]:
    """`table`, `live` and `dead` row versions of each of `tables`."""
    return await fetch_all(conn, _SQL["table_tuples"], {"tables": list(tables)})


# Run at start by `serve`, on a connection of its own (queue_server/infra/budget.py).
CONNECTION_LIMITS = _SQL["connection_limits"]
