"""Read-only queries: items, ledgers, counts."""

from __future__ import annotations

from queue_server.store.types import Conn, Row


async def get_item(conn: Conn, *, tenant: str, item_id: str) -> Row | None:
    cur = await conn.execute(
        "SELECT * FROM work_items WHERE tenant_id = %s AND item_id = %s", (tenant, item_id)
    )
    return await cur.fetchone()


async def ledger(conn: Conn, *, tenant: str, item_id: str) -> list[Row]:
    cur = await conn.execute(
        "SELECT seq, at, kind, fence, actor, data FROM item_events"
        " WHERE tenant_id = %s AND item_id = %s ORDER BY seq",
        (tenant, item_id),
    )
    return await cur.fetchall()


async def state_counts(conn: Conn, *, tenant: str) -> dict[str, int]:
    cur = await conn.execute(
        "SELECT state::text AS state, count(*) AS n FROM work_items WHERE tenant_id = %s"
        " GROUP BY state",
        (tenant,),
    )
    return {row["state"]: int(row["n"]) for row in await cur.fetchall()}


async def all_state_counts(conn: Conn) -> list[Row]:
    cur = await conn.execute(
        "SELECT tenant_id, state::text AS state, count(*) AS n FROM work_items"
        " GROUP BY tenant_id, state"
    )
    return await cur.fetchall()
