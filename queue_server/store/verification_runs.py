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

from queue_server.store.sql import Statements
from queue_server.store.types import Conn, Row

_SQL = Statements(__name__)

_RUN = (
    "tenant_id, run_id, artifact_version, verifier_version, items, state, created_at, completed_at,"
    " deadline_at, ended_at, ended_by, end_reason"
)
_CHECKPOINT = "tenant_id, run_id, item, result, recorded_at"

# ON CONFLICT covers the run key and the one-running-run index: a second start of
# the same pair or a start while another run is running inserts nothing. A new run of
# a key whose last run failed or was abandoned carries that run's checkpoints over.
_START = _SQL(
    "start",
    f"""
WITH ins AS (
    INSERT INTO verification_runs (tenant_id, run_id, artifact_version, verifier_version, items,
                                   deadline_at)
    VALUES (%(tenant)s, %(run_id)s, %(artifact)s, %(verifier)s, %(items)s,
            statement_timestamp() + %(deadline)s)
    ON CONFLICT DO NOTHING
    RETURNING {_RUN}
), previous AS (
    SELECT run_id FROM verification_runs
    WHERE tenant_id = %(tenant)s AND artifact_version = %(artifact)s
      AND verifier_version = %(verifier)s AND state IN ('failed', 'abandoned')
    ORDER BY run_id DESC LIMIT 1
), carried AS (
    INSERT INTO verification_checkpoints (tenant_id, run_id, item, result, recorded_at)
    SELECT c.tenant_id, ins.run_id, c.item, c.result, c.recorded_at
    FROM ins, previous, verification_checkpoints c
    WHERE c.tenant_id = %(tenant)s AND c.run_id = previous.run_id AND ins.items ? c.item
)
SELECT * FROM ins
""",
)

_RECORD = _SQL(
    "record",
    f"""
INSERT INTO verification_checkpoints (tenant_id, run_id, item, result)
VALUES (%(tenant)s, %(run_id)s, %(item)s, %(result)s)
ON CONFLICT DO NOTHING
RETURNING {_CHECKPOINT}
""",
)

# The terminal marker is written only when no declared item lacks a checkpoint,
# checked by the same statement that writes it.
_COMPLETE = _SQL(
    "complete",
    f"""
UPDATE verification_runs r
SET state = 'complete', completed_at = statement_timestamp()
WHERE r.tenant_id = %(tenant)s AND r.run_id = %(run_id)s AND r.state = 'running'
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_array_elements_text(r.items) AS declared(item)
      WHERE NOT EXISTS (
          SELECT 1 FROM verification_checkpoints c
          WHERE c.tenant_id = r.tenant_id AND c.run_id = r.run_id AND c.item = declared.item))
RETURNING {_RUN}
""",
)


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
    cur = await conn.execute(_START, params)
    return await cur.fetchone()


_BY_KEY = _SQL(
    "by_key",
    f"SELECT {_RUN} FROM verification_runs"
    " WHERE tenant_id = %s AND artifact_version = %s AND verifier_version = %s"
    " AND state IN ('running', 'complete')",
)


async def by_key(conn: Conn, *, tenant: str, artifact: str, verifier: str) -> Row | None:
    """The run of the key that is running or complete (ended ones leave the key free)."""
    cur = await conn.execute(_BY_KEY, (tenant, artifact, verifier))
    return await cur.fetchone()


_RUNNING = _SQL(
    "running",
    f"SELECT {_RUN} FROM verification_runs WHERE tenant_id = %s AND state = 'running'",
)


async def running(conn: Conn, *, tenant: str) -> Row | None:
    cur = await conn.execute(_RUNNING, (tenant,))
    return await cur.fetchone()


_GET = _SQL("get", f"SELECT {_RUN} FROM verification_runs WHERE tenant_id = %s AND run_id = %s")
# FOR SHARE pins the run while a checkpoint is recorded, so the terminal marker
# cannot be written between the state check and the checkpoint insert.
_GET_FOR_SHARE = _SQL("get_for_share", f"{_GET} FOR SHARE")


async def get(conn: Conn, *, tenant: str, run_id: str, lock: bool = False) -> Row | None:
    cur = await conn.execute(_GET_FOR_SHARE if lock else _GET, (tenant, run_id))
    return await cur.fetchone()


_LIST_PAGE = _SQL(
    "list_page",
    f"""
SELECT {_RUN}, jsonb_array_length(r.items) AS item_count,
       (SELECT count(*) FROM verification_checkpoints c
        WHERE c.tenant_id = r.tenant_id AND c.run_id = r.run_id) AS checkpoint_count
FROM verification_runs r
WHERE r.tenant_id = %(tenant)s AND (%(before)s::uuid IS NULL OR r.run_id < %(before)s::uuid)
ORDER BY r.run_id DESC
LIMIT %(limit)s
""",
)


async def list_page(conn: Conn, *, tenant: str, before: str | None, limit: int) -> list[Row]:
    """Runs newest first (run ids are time-ordered UUIDs: the primary key serves the order),
    each with its declared item count and checkpoint count."""
    cur = await conn.execute(_LIST_PAGE, {"tenant": tenant, "before": before, "limit": limit})
    return await cur.fetchall()


_CHECKPOINTS = _SQL(
    "checkpoints",
    f"SELECT {_CHECKPOINT} FROM verification_checkpoints"
    " WHERE tenant_id = %s AND run_id = %s ORDER BY recorded_at, item",
)


async def checkpoints(conn: Conn, *, tenant: str, run_id: str) -> list[Row]:
    cur = await conn.execute(_CHECKPOINTS, (tenant, run_id))
    return await cur.fetchall()


async def record(conn: Conn, *, tenant: str, run_id: str, item: str, result: Any) -> Row | None:
    """Checkpoint one item; None when the item already has a checkpoint."""
    params = {"tenant": tenant, "run_id": run_id, "item": item, "result": Jsonb(result)}
    cur = await conn.execute(_RECORD, params)
    return await cur.fetchone()


_CHECKPOINT = _SQL(
    "checkpoint",
    f"SELECT {_CHECKPOINT} FROM verification_checkpoints"
    " WHERE tenant_id = %s AND run_id = %s AND item = %s",
)


async def checkpoint(conn: Conn, *, tenant: str, run_id: str, item: str) -> Row | None:
    cur = await conn.execute(_CHECKPOINT, (tenant, run_id, item))
    return await cur.fetchone()


async def complete(conn: Conn, *, tenant: str, run_id: str) -> Row | None:
    """running -> complete; None while any declared item lacks a checkpoint (or not running)."""
    cur = await conn.execute(_COMPLETE, {"tenant": tenant, "run_id": run_id})
    return await cur.fetchone()


# The deadline, applied by the statement that checks it: a running run past its
# deadline_at fails (at its next checkpoint or complete, or by the server's sweeper).
_FAIL_OVERDUE = _SQL(
    "fail_overdue",
    f"""
UPDATE verification_runs
SET state = 'failed', ended_at = statement_timestamp(), ended_by = 'server',
    end_reason = 'deadline-exceeded'
WHERE (%(tenant)s::text IS NULL OR tenant_id = %(tenant)s)
  AND (%(run_id)s::uuid IS NULL OR run_id = %(run_id)s::uuid)
  AND state = 'running' AND deadline_at <= statement_timestamp()
RETURNING {_RUN}
""",
)


async def fail_overdue(conn: Conn, *, tenant: str, run_id: str | None = None) -> Row | None:
    """running -> failed (deadline-exceeded) when the run (the tenant's running run when
    `run_id` is None) is past its deadline; else None."""
    cur = await conn.execute(_FAIL_OVERDUE, {"tenant": tenant, "run_id": run_id})
    return await cur.fetchone()


async def fail_every_overdue(conn: Conn) -> list[Row]:
    """running -> failed (deadline-exceeded) for every run of every tenant past its deadline."""
    cur = await conn.execute(_FAIL_OVERDUE, {"tenant": None, "run_id": None})
    return await cur.fetchall()


_ABANDON = _SQL(
    "abandon",
    f"""
UPDATE verification_runs
SET state = 'abandoned', ended_at = statement_timestamp(), ended_by = %(actor)s,
    end_reason = %(reason)s
WHERE tenant_id = %(tenant)s AND run_id = %(run_id)s AND state = 'running'
RETURNING {_RUN}
""",
)


async def abandon(conn: Conn, *, tenant: str, run_id: str, actor: str, reason: str) -> Row | None:
    """running -> abandoned, recording who and why; None when the run is not running."""
    params = {"tenant": tenant, "run_id": run_id, "actor": actor, "reason": reason}
    cur = await conn.execute(_ABANDON, params)
    return await cur.fetchone()
