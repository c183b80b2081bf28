"""SQL of artifact verification runs: start (by run key), per-item checkpoints, the terminal marker.

    (none) --start--> running --complete (every declared item checkpointed)--> complete
                         |--past its deadline (next checkpoint, complete or the sweeper)--> failed
                         '--abandon (an operator, with a reason)--> abandoned

A run is keyed by (tenant, artifact version, verifier version) while it runs or once
complete; a partial unique index keeps at most one `running` run per tenant. A failed
or abandoned run frees both: the same key starts a new run, which carries the ended
run's checkpoints over (it resumes). Checkpoints are idempotent rows (tenant, run,
item). Each function takes the caller's connection and never commits.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg.types.json import Jsonb

from queue_server.store.sql import load
from queue_server.store.types import Conn, Row

_SQL = load("verification_runs")


async def start(
    conn: Conn,
    *,
    tenant: str,
    run_id: str,
    artifact: str,
    verifier: str,
    items: list[str],
    deadline: timedelta,
) -> Row | None:
    """(none) -> running until `deadline` from now; None when the run key is running or
    complete, or another run of the tenant is running."""
    params = {
        "tenant": tenant,
        "run_id": run_id,
        "artifact": artifact,
        "verifier": verifier,
        "items": Jsonb(items),
        "deadline": deadline,
    }
    cur = await conn.execute(_SQL["start"], params)
    return await cur.fetchone()


async def by_key(conn: Conn, *, tenant: str, artifact: str, verifier: str) -> Row | None:
    """The run of the key that is running or complete (ended ones leave the key free)."""
    cur = await conn.execute(_SQL["by_key"], (tenant, artifact, verifier))
    return await cur.fetchone()


async def running(conn: Conn, *, tenant: str) -> Row | None:
    cur = await conn.execute(_SQL["running"], (tenant,))
    return await cur.fetchone()


async def get(conn: Conn, *, tenant: str, run_id: str, lock: bool = False) -> Row | None:
    cur = await conn.execute(_SQL["get_for_share"] if lock else _SQL["get"], (tenant, run_id))
    return await cur.fetchone()


async def list_page(conn: Conn, *, tenant: str, before: str | None, limit: int) -> list[Row]:
    """Runs newest first (run ids are time-ordered UUIDs: the primary key serves the order),
    each with its declared item count and checkpoint count."""
    cur = await conn.execute(
        _SQL["list_page"], {"tenant": tenant, "before": before, "limit": limit}
    )
    return await cur.fetchall()


async def checkpoints(conn: Conn, *, tenant: str, run_id: str) -> list[Row]:
    cur = await conn.execute(_SQL["checkpoints"], (tenant, run_id))
    return await cur.fetchall()


async def record(conn: Conn, *, tenant: str, run_id: str, item: str, result: Any) -> Row | None:
    """Checkpoint one item; None when the item already has a checkpoint."""
    params = {"tenant": tenant, "run_id": run_id, "item": item, "result": Jsonb(result)}
    cur = await conn.execute(_SQL["record"], params)
    return await cur.fetchone()


async def checkpoint(conn: Conn, *, tenant: str, run_id: str, item: str) -> Row | None:
    cur = await conn.execute(_SQL["checkpoint"], (tenant, run_id, item))
    return await cur.fetchone()


async def complete(conn: Conn, *, tenant: str, run_id: str) -> Row | None:
    """running -> complete; None while any declared item lacks a checkpoint (or not running)."""
    cur = await conn.execute(_SQL["complete"], {"tenant": tenant, "run_id": run_id})
    return await cur.fetchone()


async def fail_overdue(conn: Conn, *, tenant: str, run_id: str | None = None) -> Row | None:
    """running -> failed (deadline-exceeded) when the run (the tenant's running run when
    `run_id` is None) is past its deadline; else None."""
    cur = await conn.execute(_SQL["fail_overdue"], {"tenant": tenant, "run_id": run_id})
    return await cur.fetchone()


async def fail_every_overdue(conn: Conn) -> list[Row]:
    """running -> failed (deadline-exceeded) for every run of every tenant past its deadline."""
    cur = await conn.execute(_SQL["fail_overdue"], {"tenant": None, "run_id": None})
    return await cur.fetchall()


async def abandon(conn: Conn, *, tenant: str, run_id: str, actor: str, reason: str) -> Row | None:
    """running -> abandoned, recording who and why; None when the run is not running."""
    params = {"tenant": tenant, "run_id": run_id, "actor": actor, "reason": reason}
    cur = await conn.execute(_SQL["abandon"], params)
    return await cur.fetchone()
