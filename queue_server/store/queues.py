"""Queues: pause and resume (with the queue's own ledger), and each queue's figures.

    (no row) or resumed --pause--> paused --resume--> resumed
    a paused queue: acquire hands out nothing (store/transitions.py reads `paused_at`)

The figures of a tenant's queues come from bounded reads only: the unfinished items
from each queue's cursor (`open_figures`), finished work from the view `counter_totals` (the latest
base of the counters and the deltas each transition's own statement inserted since:
store/counters.py), and rates from `queue_samples` (two index probes per queue). Nothing
here scans finished history.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from queue_server.store import cursors
from queue_server.store.sql import fetch_all, fetch_one, load
from queue_server.store.types import Conn, Row

_SQL = load("queues")


async def pause(conn: Conn, *, tenant: str, queue: str, actor: str, reason: str) -> Row | None:
    """resumed -> paused, ledgered; None when the queue was paused already.

    The caller holds the queue's lock (`transitions.lock_queue`), so no acquire that
    commits after this transaction hands anything out.
    """
    params = {"tenant": tenant, "queue": queue, "actor": actor, "reason": reason}
    return await fetch_one(conn, _SQL["pause"], params)


async def resume(conn: Conn, *, tenant: str, queue: str, actor: str, reason: str) -> Row | None:
    """paused -> resumed, ledgered, waking the queue's long polls; None when not paused."""
    params = {"tenant": tenant, "queue": queue, "actor": actor, "reason": reason}
    return await fetch_one(conn, _SQL["resume"], params)


async def put_concurrency(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    concurrency: int | None,
    approved: int,
    actor: str,
    reason: str,
) -> Row:
    """The queue's own concurrency set (None: the approved limit), ledgered with the value
    before and after and the approved limit then; the queue's long polls wake."""
    params = {
        "tenant": tenant,
        "queue": queue,
        "concurrency": concurrency,
        "approved": approved,
        "actor": actor,
        "reason": reason,
    }
    row = await fetch_one(conn, _SQL["put_concurrency"], params)
    assert row is not None
    return row


async def live_approvals(conn: Conn, *, tenant: str | None, warn: timedelta) -> list[Row]:
    """Per queue (of `tenant`, or of all), the live spend approval behind its approved limit:
    `expires_in` seconds, and `expiring` when that is within `warn`."""
    return await fetch_all(conn, _SQL["live_approvals"], {"tenant": tenant, "warn": warn})


async def ledger_expired_approvals(
    conn: Conn, *, base_limit: int, max_approved: int | None, limit: int
) -> list[Row]:
    """Write an `approval-expired` event in its queue's ledger for each spend approval whose
    expiry has passed since the last look (at most `limit`), with the limit the queue falls
    to; each approval is ledgered once."""
    params = {"base_limit": base_limit, "max_approved": max_approved, "limit": limit}
    return await fetch_all(conn, _SQL["ledger_expired_approvals"], params)


async def purge_rate_grants(conn: Conn, *, limit: int) -> int:
    """Delete at most `limit` rate grants older than their queue's interval; how many."""
    return len(await fetch_all(conn, _SQL["purge_rate_grants"], {"limit": limit}))


async def events(conn: Conn, *, tenant: str, queue: str, limit: int) -> list[Row]:
    """The queue's latest ledger events (pause, resume, settings, concurrency, an approval's
    expiry), newest first."""
    return await fetch_all(conn, _SQL["events"], {"tenant": tenant, "queue": queue, "limit": limit})


async def open_figures(conn: Conn, queues: Iterable[tuple[str, str]]) -> list[Row]:
    """Per (tenant, queue): ready, due, leased, active leases, quarantined, the oldest due
    item's and the oldest active lease's ages; read from the connection's cursor on the
    queue, which moves on (store/cursors.py), all in one round trip. What each costs is
    what changed since the connection's last look at the queue, not the history an old
    snapshot keeps in the indexes."""
    sent = []
    await cursors.learn_server(conn)
    async with conn.pipeline():
        for tenant, queue in queues:
            used = cursors.get(conn, tenant, queue)
            params = {"tenant": tenant, "queue": queue, **used.params()}
            moved = await conn.execute(cursors.ADVANCE, params)
            read = await conn.execute(_SQL["open_figures"], params)
            sent.append((tenant, queue, used, moved, read))
    figures = []
    for tenant, queue, used, moved, read in sent:
        cursor = await moved.fetchone()
        row = await read.fetchone()
        assert cursor is not None
        assert row is not None
        cursors.put(conn, tenant, queue, used.moved(cursor), used=used)
        figures.append(row)
    return figures


async def finished_counts(conn: Conn, *, tenant: str) -> list[Row]:
    """Per queue that ever finished work: completed and cancelled now, totals and rates."""
    return await fetch_all(conn, _SQL["finished_counts"], {"tenant": tenant})


async def settings(conn: Conn, *, tenant: str) -> list[Row]:
    """Every queue of the tenant that has a settings row (paused or once paused)."""
    return await fetch_all(conn, _SQL["settings"], {"tenant": tenant})


async def get(conn: Conn, *, tenant: str, queue: str) -> Row | None:
    return await fetch_one(conn, _SQL["get"], {"tenant": tenant, "queue": queue})


async def open_dead_letters(conn: Conn, *, tenant: str) -> dict[str, int]:
    """Open item dead letters per queue (the partial index of open letters)."""
    rows = await fetch_all(conn, _SQL["open_dead_letters"], {"tenant": tenant})
    return {row["queue"]: int(row["n"]) for row in rows}


# -- samples of the counters, the ready items and the oldest one: taken by the sweeper, a
# row when any of them changed; a day's worth kept at a 15-minute grain -----------------


async def sample(conn: Conn, *, min_gap: timedelta) -> int:
    """Record the counters' totals, ready items and oldest due item of every queue where
    any of them changed (unless a sample was taken less than `min_gap` ago); returns how
    many."""
    keys = [(r["tenant_id"], r["queue"]) for r in await fetch_all(conn, _SQL["counted_queues"], {})]
    figures = await open_figures(conn, keys)
    params = {
        "min_gap": min_gap,
        "tenants": [tenant for tenant, _ in keys],
        "queues": [queue for _, queue in keys],
        "ready": [int(row["ready"]) for row in figures],
        "oldest_ready_at": [row["oldest_ready_at"] for row in figures],
    }
    cur = await conn.execute(_SQL["sample"], params)
    return cur.rowcount


async def prune_samples(conn: Conn, *, limit: int) -> int:
    """Drop up to `limit` samples no longer needed for the last hour's rates."""
    cur = await conn.execute(_SQL["prune_samples"], {"limit": limit})
    return cur.rowcount


async def roll_up(conn: Conn) -> int:
    """Copy each queue's last sample of each ended 15-minute bucket of the last 45 minutes
    into the day's samples (once); returns how many were copied."""
    cur = await conn.execute(_SQL["roll_up"], {})
    return cur.rowcount


async def prune_day_samples(conn: Conn, *, limit: int) -> int:
    """Drop up to `limit` day samples no longer needed for the last day's charts."""
    cur = await conn.execute(_SQL["prune_day_samples"], {"limit": limit})
    return cur.rowcount


async def series(
    conn: Conn, *, tenant: str, queue: str, step: timedelta, points: int, aligned: bool
) -> list[Row]:
    """(i, at, completed, failed, timed_completions, completion_ms, ready, oldest_ready_age)
    of one queue at `points` marks `step` apart (on the `step` grid when `aligned`) and
    now, oldest first."""
    params = {
        "tenant": tenant,
        "queue": queue,
        "step": step,
        "points": points,
        "aligned": aligned,
    }
    return await fetch_all(conn, _SQL["queue_series"], params)


async def minute_totals(conn: Conn, *, tenant: str) -> list[Row]:
    """(queue, ago, completed, failed): the totals 60 minutes ago to now, oldest first."""
    return await fetch_all(conn, _SQL["minute_totals"], {"tenant": tenant})


async def all_finished_counts(conn: Conn) -> list[Row]:
    """`finished_counts` of every tenant's queues (without the rates' samples)."""
    return await fetch_all(conn, _SQL["all_finished_counts"], {})


async def all_settings(conn: Conn) -> list[Row]:
    """Every queue's settings row, of every tenant."""
    return await fetch_all(conn, _SQL["all_settings"], {})


async def all_open_dead_letters(conn: Conn) -> list[Row]:
    return await fetch_all(conn, _SQL["all_open_dead_letters"], {})


async def all_watcher_deliveries(conn: Conn) -> list[Row]:
    """(tenant_id, watcher_id, state, n): pending and dead deliveries of every watcher, and a
    `watching` row of 0 for each active or paused watcher (so zero reads as zero)."""
    return await fetch_all(conn, _SQL["all_watcher_deliveries"], {})


async def put_settings(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    actor: str,
    lease_ttl: timedelta | None,
    deadline: timedelta | None,
    max_acquisitions: int | None,
    retry_base: float | None,
    retry_cap: float | None,
    retry_jitter: bool | None,
    ordering_dead_letters: str,
    rate_limit: int | None,
    rate_interval: timedelta | None,
    rate_partitioned: bool,
    fairness: str,
) -> Row:
    """The queue's own settings, replaced all at once and ledgered (kind `settings`)."""
    params = {
        "tenant": tenant,
        "queue": queue,
        "actor": actor,
        "lease_ttl": lease_ttl,
        "deadline": deadline,
        "max_acquisitions": max_acquisitions,
        "retry_base": retry_base,
        "retry_cap": retry_cap,
        "retry_jitter": retry_jitter,
        "ordering_dead_letters": ordering_dead_letters,
        "rate_limit": rate_limit,
        "rate_interval": rate_interval,
        "rate_partitioned": rate_partitioned,
        "fairness": fairness,
    }
    row = await fetch_one(conn, _SQL["put_settings"], params)
    assert row is not None  # an upsert returns its row
    return row


async def terms(conn: Conn, *, tenant: str, queue: str) -> Row | None:
    """The queue's own settings beside its tenant's defaults; None without the tenant."""
    return await fetch_one(conn, _SQL["queue_terms"], {"tenant": tenant, "queue": queue})
