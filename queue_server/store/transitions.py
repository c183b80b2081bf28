"""Every statement that changes a work item's state, lease or fence.

    ready --acquire--> leased --complete--> completed
      ^                  |--requeue / triage(requeue)--> ready
      |                  '--triage(quarantine)--> quarantined
      '--(expired lease: the next acquire takes it over, fence + 1)
    acquire past the budget -> quarantined (+ dead letter)
    operator replay: quarantined -> ready;  discard: any but completed -> cancelled
    operator cancel: ready, leased or quarantined -> cancelled (the holder's next
    heartbeat or complete is refused with item-cancelled)
    retention: completed or cancelled longer than the tenant's retention -> deleted,
    with its ledger
    a paused queue (`queues.paused_at`): acquire hands out nothing

Each acquire increments `fence`. A holder presents the fence it was given, and
every holder operation checks state, holder, fence and expiry in the same
statement that changes the row: the holder guard, written verbatim in each holder
statement of `sql/transitions.sql` (tests/test_sql_files.py holds the list and checks
each carries it). Each function takes the caller's connection and runs its named
statement, which appends the ledger events in the same statement (its `ev` CTE: the
INSERT into item_events), writes the outbox rows of its event (`outbox`: the body's
item is the `item_json` SQL function of migration 0012, inlined by the planner), and
counts finished work on the queue's counters (`counted`, after `release`). Every
function but `acquire` runs in the caller's transaction and never commits; `acquire`
owns its transactions (see there). Time is `statement_timestamp()`: the database
clock, fixed for one statement.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from psycopg.pq import TransactionStatus
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb

from queue_server import errors
from queue_server.models import ItemState
from queue_server.store import cursors
from queue_server.store.reads import FIRST_ITEM
from queue_server.store.sql import fetch_all, fetch_one, load
from queue_server.store.types import Conn, Row, uuid_array

_SQL = load("transitions")


async def enqueue(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    items: list[dict[str, Any]],
    actor: str,
    attempt_cap: int,
    backlog_ceiling: int,
) -> list[Row]:
    """(nothing) -> ready, one row per item, all or nothing, within the tenant's backlog cap:
    charged to admission shards of the tenant this transaction locks (`queue_server.
    admission_shards`, held until the caller's transaction ends; one another transaction
    holds is passed over, not waited for).

    The one admission (`queue_server.admit`, migration 0017) that `queue_server.enqueue`
    runs too. An item without its own `max_acquisitions` gets the queue's, else the
    tenant's default, each at most `attempt_cap`; the cap at most `backlog_ceiling`.
    Refusals are SQL errors (the caller translates them with `db.admission_refusals`).
    """
    params = {
        **_admission(tenant, queue, items, actor, attempt_cap),
        "backlog_ceiling": backlog_ceiling,
    }
    cur = await conn.execute(_SQL["enqueue"], params)
    rows = await cur.fetchall()
    order = {item["item_id"]: i for i, item in enumerate(items)}
    # The items it made in the order asked; then any holding a unique key it did not admit.
    rows.sort(key=lambda row: order.get(str(row["item_id"]), len(items)))
    return rows


def _admission(
    tenant: str, queue: str, items: list[dict[str, Any]], actor: str, attempt_cap: int
) -> dict[str, Any]:
    """The parameters the admission's rows are written with (`enqueue`, `enqueue_rows`)."""
    return {
        "items": Jsonb(items),
        "tenant": tenant,
        "queue": queue,
        "actor": actor,
        "attempt_cap": attempt_cap,
    }


# What `enqueue_rows` tells of one item: its budget, when it is available, when created,
# and its state (`waiting` behind others of its ordering key, else `ready`).
Written = tuple[int, datetime, datetime, str]


@dataclass(frozen=True, slots=True)
class Enqueued:
    """What an admission made (`written`, by item id) and, by unique key, the item that
    holds each key given (`holders`): one it made, or a ready or leased one made before,
    which the enqueue is answered with instead of a new item."""

    written: dict[str, Written]
    holders: dict[str, str]


async def enqueue_rows(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    items: list[dict[str, Any]],
    actor: str,
    attempt_cap: int,
    backlog_ceiling: int,
) -> Enqueued:
    """(nothing) -> ready: `enqueue`'s admission (its shards locked until the caller's
    transaction ends), telling what the database decided, by item id: the budget (the
    item's, else the queue's, else the tenant's default, at most `attempt_cap`),
    `available_at` and `created_at`; and the item holding each unique key given. Each item
    needs its `item_id`. Refusals are SQL errors (the caller translates them with
    `db.admission_refusals`)."""
    params = {
        **_admission(tenant, queue, items, actor, attempt_cap),
        "backlog_ceiling": backlog_ceiling,
    }
    cur = conn.cursor(row_factory=tuple_row)
    await cur.execute(_SQL["enqueue_rows"], params)
    ours = {item["item_id"] for item in items}
    written: dict[str, Written] = {}
    holders: dict[str, str] = {}
    for item_id, budget, at, created, unique_key, state in await cur.fetchall():
        if item_id in ours:
            written[item_id] = (budget, at, created, state)
        if unique_key is not None:
            holders[unique_key] = item_id
    return Enqueued(written, holders)


async def lock_queue(conn: Conn, *, tenant: str, queue: str) -> None:
    """The queue's lock, exclusively, until the transaction ends: every acquire in flight
    has committed, and every later one reads what this transaction commits (a pause)."""
    await conn.execute(_SQL["lock_queue"], {"tenant": tenant, "queue": queue})


# How long a process goes straight to `acquire_rated` for a queue found rate-limited (that
# statement acquires any queue exactly; only its cost is the plain one's and more).
RATED_MEMORY = 10.0
_rated: dict[tuple[str, str], float] = {}


def lanes_read(max_items: int) -> int:
    """How many of a fair queue's lanes an acquire of `max_items` is sent (and its cursor's
    advance probes): a share of one item each, and four for keys with nothing due. The
    others wait for their turn, in the process's memory; when the keys sent have too few
    items, the acquire reads the others' from the priority's floor."""
    return max_items + 4


async def _warm_cursor(conn: Conn, tenant: str, queue: str) -> None:
    """A connection with no cursor on the queue reads one before its first acquire: from
    its lanes, that acquire takes a fair queue's keys in turn as every later one does (the
    whole index read in acquire order would hand out the oldest key's items first). Twice
    at most: the first read says whether the queue is fair, and its lanes are then made
    again per key."""
    for _ in range(2):
        cursor = cursors.get(conn, tenant, queue)
        if cursor.xmin is not None:
            return
        async with conn.pipeline():
            read = await conn.execute(
                cursors.ADVANCE, {**cursor.params(), "tenant": tenant, "queue": queue}
            )
        moved = await read.fetchone()
        assert moved is not None
        cursors.put(conn, tenant, queue, cursor.moved(moved), used=cursor)


@dataclass(frozen=True, slots=True)
class Acquired:
    leased: list[Row]  # in acquire order
    quarantined: list[Row]
    # The shared lock was tried and the room was too small for it: near the limit.
    contended: bool


async def acquire(
    conn: Conn,
    *,
    tenant: str,
    queue: str,
    worker: str,
    key_id: str,
    ttl: timedelta | None,
    max_ttl: timedelta,
    deadline: timedelta,
    max_items: int,
    base_limit: int = 1,
    max_approved: int | None = None,
    shared_first: bool = False,
) -> Acquired:
    """ready (due) or leased (expired) -> leased, fence + 1; past the budget -> quarantined.

    The lease expires after `ttl` (None: the queue's lease TTL, else the tenant's default;
    at most `max_ttl`) and lives at most the queue's deadline (at most `deadline`) from now:
    no heartbeat extends it past that instant. A taken-over lease that ran to its
    deadline is ledgered `deadline_exceeded` before its `acquired` (or `quarantined`).

    The queue leases at most `base_limit` at once, or with a live spend approval (not
    expired, not revoked) its `max_concurrency`, at most `max_approved` (an approval
    stored under a looser policy is held to the loaded one).

    The spend-gated concurrency limit holds when many acquires race: see the queue
    lock above. With `shared_first`, the acquire first tries the shared lock, which
    leases only while the room left covers every acquire in flight (`in_flight`);
    without it, or when the room is smaller, it takes the lock exclusively. This
    transition owns its transactions: the lock and the acquire are sent together in
    pipeline mode, with no BEGIN or COMMIT: statements before a pipeline's Sync form one implicit
    transaction, committed at the Sync (and rolled back whole by an error), each
    statement with its own snapshot. So the lock is held only while PostgreSQL
    works, never while the event loop is busy with other requests, and the request
    costs one round trip and no transaction bookkeeping in the driver (a third of
    the CPU of an acquire in this process). `conn` must be idle, outside any
    transaction: inside one, the statements would join it.
    """
    if conn.info.transaction_status != TransactionStatus.IDLE:
        raise RuntimeError("acquire owns its transactions: the connection must be idle")
    contended = False
    await cursors.learn_server(conn)
    await _warm_cursor(conn, tenant, queue)
    # A queue with a rate limit is acquired by its own statement, exclusively: the plain
    # one leases nothing from it and says so (as it does when the shared lock has too little
    # room); the process remembers the queue a while and goes to that statement first.
    # (rated, shared) of each attempt, in order.
    attempts: list[tuple[bool, bool]] = (
        [(True, False)]
        if _rated.get((tenant, queue), 0.0) > time.monotonic()
        else [(False, True), (False, False)]
        if shared_first
        else [(False, False)]
    )
    while attempts:
        rated, shared = attempts.pop(0)
        cursor = cursors.get(conn, tenant, queue)
        sent = cursor.front(cursors.turns(tenant, queue), lanes_read(max_items))
        params = {
            **cursor.params(sent),
            "tenant": tenant,
            "queue": queue,
            "worker": worker,
            "key_id": key_id,
            "ttl": ttl,
            "max_ttl": max_ttl,
            "deadline": deadline,
            "base_limit": base_limit,
            "max_approved": max_approved,
            "max_items": max_items,
            "shared": shared,
        }
        async with conn.pipeline():
            if shared:
                await conn.execute(_SQL["lock_queue_shared"], params)
                await conn.execute(_SQL["in_flight"], params)
            else:
                await conn.execute(_SQL["lock_queue"], params)
            advanced = await conn.execute(cursors.ADVANCE, params)
            acquire = _SQL["acquire_rated"] if rated else _SQL["acquire"]
            cur = await conn.execute(acquire, params)
        rows = await cur.fetchall()
        moved = await advanced.fetchone()
        assert moved is not None
        cursors.put(conn, tenant, queue, cursor.moved(moved, sent), used=cursor)
        if not any(row["leased"] is None for row in rows):
            break
        # The shared attempt found too little room: the exclusive one follows. The
        # exclusive plain one found a rate limit: the queue's own statement follows.
        contended = True
        if not shared and not rated:
            _rated[(tenant, queue)] = time.monotonic() + RATED_MEMORY
            attempts = [(True, False)]
    leased: list[Row] = []
    quarantined: list[Row] = []
    for row in rows:
        (leased if row.pop("leased") else quarantined).append(row)
    leased.sort(key=lambda row: (-row["priority"], row["available_at"], str(row["item_id"])))
    if moved is not None and moved["fairness"] == "partition_key":
        cursors.took_turns(tenant, queue, sent, leased, full=len(leased) >= max_items)
    return Acquired(leased=leased, quarantined=quarantined, contended=contended)


async def release_unsent(
    conn: Conn, *, tenant: str, worker: str, key_id: str, leases: list[Row]
) -> int:
    """leased -> ready: leases whose client left before they were sent never count.

    The fence keeps its new value (the next acquire raises it again); the
    acquisition is not charged to the budget. Returns how many were released.
    """
    entries = [{"item_id": str(row["item_id"]), "fence": row["fence"]} for row in leases]
    cur = await conn.execute(
        _SQL["release_unsent"],
        {
            "leases": Jsonb(entries),
            "ids": uuid_array(entry["item_id"] for entry in entries),
            "tenant": tenant,
            "worker": worker,
            "key_id": key_id,
        },
    )
    return len(await cur.fetchall())


@dataclass(frozen=True, slots=True)
class Backoff:
    """The defaults of `"delay": "backoff"` where the queue sets none: the first delay, and
    the cap (the loaded policy's backoff cap, also the most a queue's own cap may be)."""

    base: float
    cap: float

    def params(self) -> dict[str, float]:
        return {"backoff_base": self.base, "backoff_cap": self.cap}


def _holder_params(
    conn: Conn, tenant: str, item_id: str, worker: str, key_id: str, fence: int
) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "item_id": item_id,
        "worker": worker,
        "key_id": key_id,
        "fence": fence,
    }


async def heartbeat(
    conn: Conn,
    *,
    tenant: str,
    item_id: str,
    worker: str,
    key_id: str,
    fence: int,
    ttl: timedelta | None,
    max_ttl: timedelta,
) -> Row | None:
    """leased -> leased: the holder, with its fence, extends a lease that has not expired
    by `ttl` (None: the queue's lease TTL, else the tenant's default; at most `max_ttl`),
    up to the lease's deadline and never past it."""
    params = {
        **_holder_params(conn, tenant, item_id, worker, key_id, fence),
        "ttl": ttl,
        "max_ttl": max_ttl,
    }
    return await fetch_one(conn, _SQL["heartbeat"], params)


async def complete(
    conn: Conn, *, tenant: str, item_id: str, worker: str, key_id: str, fence: int, result: Any
) -> Row | None:
    """leased -> completed: the holder, with its fence, on an unexpired lease."""
    params = {
        **_holder_params(conn, tenant, item_id, worker, key_id, fence),
        "result": Jsonb(result),
    }
    return await fetch_one(conn, _SQL["complete"], params)


async def requeue(
    conn: Conn,
    *,
    tenant: str,
    item_id: str,
    worker: str,
    key_id: str,
    fence: int,
    reason: str,
    delay: float | None,
    backoff: Backoff,
    failure: dict[str, Any] | None = None,
) -> Row | None:
    """leased -> ready, due after `delay` seconds (None: the queue's backoff for the item's
    acquisition count): the holder gives the item back; the next acquire raises the fence.
    A `failure` becomes the item's last failure and goes into the `requeued` event."""
    params = {
        **_holder_params(conn, tenant, item_id, worker, key_id, fence),
        "reason": reason,
        "delay": delay,
        "failure": Jsonb(failure) if failure is not None else None,
        **backoff.params(),
    }
    return await fetch_one(conn, _SQL["requeue"], params)


async def triage(
    conn: Conn,
    *,
    tenant: str,
    item_id: str,
    worker: str,
    key_id: str,
    fence: int,
    failure: dict[str, Any],
    quarantine: bool,
    delay: float | None,
    backoff: Backoff,
) -> Row | None:
    """leased -> ready after `delay` (decision requeue; None: the queue's backoff) or
    quarantined (+ dead letter), failure recorded. A requeue of an item with no attempt
    left (acquisition_count at max_acquisitions) quarantines it at once: its failure was
    its last, and its dead letter is written now, not at the next acquire."""
    params = {
        **_holder_params(conn, tenant, item_id, worker, key_id, fence),
        "failure": Jsonb(failure),
        "delay": delay,
        "exhausted": False,
        **backoff.params(),
    }
    if quarantine:
        return await fetch_one(conn, _SQL["triage_quarantine"], params)
    requeued = await fetch_one(conn, _SQL["triage_requeue"], params)
    if requeued is not None:
        return requeued
    # Nothing changed: a refusal (the caller explains it), or no attempt left.
    return await fetch_one(conn, _SQL["triage_quarantine"], {**params, "exhausted": True})


async def record_triage_rejected(
    conn: Conn,
    *,
    tenant: str,
    item_id: str,
    worker: str,
    fence: int,
    failure: dict[str, Any],
    reason: str,
    actor: str,
) -> None:
    """No state change: a refused triage still leaves the reported failure in the ledger,
    by `actor` (the worker name a worker key presented, else the key), with the worker
    name and the fence presented."""
    params = {
        **_holder_params(conn, tenant, item_id, worker, "", fence),
        "failure": Jsonb(failure),
        "reason": reason,
        "actor": actor,
    }
    await conn.execute(_SQL["record_triage_rejected"], params)


async def record_scheduled(
    conn: Conn,
    *,
    tenant: str,
    item_id: str,
    actor: str,
    schedule: str,
    schedule_id: str,
    tick_at: Any,
    trigger: bool,
) -> None:
    """No state change: the item just enqueued is a schedule's fire of the tick `tick_at`
    (or its manual trigger); the ledger says which."""
    params = {
        "tenant": tenant,
        "item_id": item_id,
        "actor": actor,
        "schedule": schedule,
        "schedule_id": schedule_id,
        "tick_at": tick_at,
        "trigger": trigger,
    }
    await conn.execute(_SQL["record_scheduled"], params)


def _refusal(
    row: Row | None, *, item_id: str, worker: str | None, key_id: str | None, fence: int
) -> errors.QueueServerError:
    """Why the holder guard refused `worker` with `fence`; `worker` None: a key that holds no
    lease (an operator's), whatever name and fence it presented."""
    if row is None:
        return errors.ItemNotFoundError(item_id=item_id)
    cancelled = row["cancellation"] or {}
    if (
        worker is not None
        and cancelled.get("data", {}).get("lease_holder") == worker
        and fence == row["fence"]
    ):
        # This holder's own lease was ended by an operator's cancel.
        return errors.ItemCancelledError(
            item_id=item_id,
            cancelled_by=cancelled["actor"],
            cancelled_at=cancelled["at"],
            reason=cancelled["data"].get("reason", ""),
        )
    if row["state"] != ItemState.LEASED:
        return errors.ItemNotLeasedError(
            f"The item is {row['state']}, not leased.", item_id=item_id, state=row["state"]
        )
    if worker is None:
        return errors.NotLeaseHolderError(item_id=item_id)
    if fence < row["fence"]:
        return errors.StaleFenceError(item_id=item_id, current_fence=row["fence"])
    if fence > row["fence"]:
        # stale-fence is a lower fence (a newer lease superseded it); a higher one was never
        # handed out (docs/guarantees.md, the refusal codes).
        return errors.FenceAheadError(item_id=item_id, current_fence=row["fence"])
    if row["lease_holder"] != worker or row["lease_key_id"] not in (None, key_id):
        # Another name, or the right name and fence from a key that did not take the lease.
        return errors.NotLeaseHolderError(item_id=item_id)
    if row["expired"] and row["lease_expires_at"] >= row["lease_deadline_at"]:
        return errors.LeaseDeadlineExceededError(
            item_id=item_id, lease_deadline_at=row["lease_deadline_at"].isoformat()
        )
    if row["expired"]:
        return errors.LeaseExpiredError(
            item_id=item_id, expired_at=row["lease_expires_at"].isoformat()
        )
    # The row changed between the guarded update and this read.
    return errors.StaleFenceError(item_id=item_id, current_fence=row["fence"])


async def explain_rejections(
    conn: Conn, *, tenant: str, worker: str | None, key_id: str | None, fences: dict[str, int]
) -> dict[str, errors.QueueServerError]:
    """Why guarded holder operations changed nothing: the precise refusal of each item."""
    cur = await conn.execute(
        _SQL["explain_rejections"], {"tenant": tenant, "item_ids": list(fences)}
    )
    rows = {row["item_id"]: row for row in await cur.fetchall()}
    return {
        item_id: _refusal(
            rows.get(item_id), item_id=item_id, worker=worker, key_id=key_id, fence=fence
        )
        for item_id, fence in fences.items()
    }


async def explain_rejection(
    conn: Conn, *, tenant: str, item_id: str, worker: str | None, key_id: str | None, fence: int
) -> errors.QueueServerError:
    """Why a guarded holder operation changed nothing: the precise refusal (`worker` None: the
    caller's key holds no lease)."""
    refusals = await explain_rejections(
        conn, tenant=tenant, worker=worker, key_id=key_id, fences={item_id: fence}
    )
    return refusals[item_id]


async def heartbeat_many(
    conn: Conn,
    *,
    tenant: str,
    worker: str,
    key_id: str,
    leases: list[dict[str, Any]],
    ttl: timedelta | None,
    max_ttl: timedelta,
) -> dict[str, Row]:
    """leased -> leased for each lease whose own fence, holder and expiry pass the guard,
    each up to its lease's deadline and never past it (as `heartbeat`).

    Returns the extended leases by item id; the others changed nothing.
    """
    cur = await conn.execute(
        _SQL["heartbeat_many"],
        {
            "leases": Jsonb(leases),
            "ids": uuid_array(entry["item_id"] for entry in leases),
            "tenant": tenant,
            "worker": worker,
            "key_id": key_id,
            "ttl": ttl,
            "max_ttl": max_ttl,
        },
    )
    return {row["item_id"]: row for row in await cur.fetchall()}


async def complete_many(
    conn: Conn, *, tenant: str, worker: str, key_id: str, completions: list[dict[str, Any]]
) -> dict[str, Row]:
    """leased -> completed for each item whose own fence, holder and expiry pass the guard.

    Returns the completed rows by item id; the others changed nothing.
    """
    cur = await conn.execute(
        _SQL["complete_many"],
        {
            "items": Jsonb(completions),
            "ids": uuid_array(entry["item_id"] for entry in completions),
            "tenant": tenant,
            "worker": worker,
            "key_id": key_id,
        },
    )
    return {str(row["item_id"]): row for row in await cur.fetchall()}


async def replay(
    conn: Conn,
    *,
    tenant: str,
    dead_letter_id: str,
    max_acquisitions: int | None,
    actor: str,
    shard: int,
) -> Row | None:
    """quarantined -> ready with a renewed budget; the dead letter is closed. Fence unchanged.

    The item re-enters the backlog charged to admission shard `shard`, which the caller
    took for it (`tenants.take_admission`), as for an enqueue.
    """
    params = {
        "tenant": tenant,
        "dead_letter_id": dead_letter_id,
        "max_acquisitions": max_acquisitions,
        "actor": actor,
        "shard": shard,
    }
    return await fetch_one(conn, _SQL["replay"], params)


async def retry(
    conn: Conn, *, tenant: str, item_ids: list[str], shards: list[int], state: str, actor: str
) -> list[Row]:
    """quarantined or cancelled (`state`) -> ready, due now with a renewed budget, as a
    replay; an open dead letter closes. Fence unchanged.

    The items re-enter the backlog, each charged to the admission shard the caller took
    for it (`shards[i]` for `item_ids[i]`, `tenants.take_admission`). Returns the retried
    rows.
    """
    params = {**_bulk(conn, tenant, item_ids, state, actor), "shards": shards}
    return await fetch_all(conn, _SQL["retry"], params)


async def delete_finished(
    conn: Conn, *, tenant: str, item_ids: list[str], state: str, actor: str
) -> list[Row]:
    """completed or cancelled (`state`) -> deleted with its ledger; the queue's ledger says
    who deleted which. Returns the deleted (item_id, queue)."""
    return await fetch_all(
        conn, _SQL["delete_finished"], _bulk(conn, tenant, item_ids, state, actor)
    )


def _bulk(conn: Conn, tenant: str, item_ids: list[str], state: str, actor: str) -> dict[str, Any]:
    """The parameters of an operator's bulk transition of `item_ids`, those in `state`."""
    return {
        "tenant": tenant,
        "item_ids": item_ids,
        "state": state,
        "actor": actor,
    }


async def discard(
    conn: Conn, *, tenant: str, dead_letter_id: str, reason: str, actor: str
) -> Row | None:
    """quarantined (any state but completed) -> cancelled; the dead letter is closed."""
    params = {
        "tenant": tenant,
        "dead_letter_id": dead_letter_id,
        "reason": reason,
        "actor": actor,
    }
    return await fetch_one(conn, _SQL["discard"], params)


async def cancel(
    conn: Conn,
    *,
    tenant: str,
    item_ids: list[str],
    reason: str,
    actor: str,
    state: str | None = None,
) -> list[Row]:
    """ready, leased or quarantined (and `state`, when given) -> cancelled, by an operator.

    A leased item's lease ends here: its holder's next heartbeat or complete is refused
    with item-cancelled. Ready and leased items leave the backlog; a quarantined item's
    dead letter is closed. Returns the cancelled rows (the others changed nothing).
    """
    params = {
        "tenant": tenant,
        "item_ids": item_ids,
        "state": state,
        "reason": reason,
        "actor": actor,
    }
    cur = await conn.execute(_SQL["cancel"], params)
    return await cur.fetchall()


# -- retention: finished items leave with their ledgers ----------------------------------


async def finished_queues(conn: Conn, *, tenant: str) -> list[tuple[str, str]]:
    """The (state, queue) pairs of the tenant that hold completed or cancelled items."""
    rows = await fetch_all(conn, _SQL["finished_queues"], {"tenant": tenant})
    return [(row["state"], row["queue"]) for row in rows]


@dataclass(frozen=True, slots=True)
class Purged:
    scanned: int
    deleted: int
    # Where the next batch of the same (state, queue) starts; None when none was scanned.
    last: tuple[str, str] | None


async def purge_finished(
    conn: Conn,
    *,
    tenant: str,
    state: str,
    queue: str,
    after: tuple[str, str] | None,
    limit: int,
) -> Purged:
    """completed or cancelled, finished longer than the tenant's retention ago -> deleted,
    with every ledger event of the item; counted as purged on the queue's counters.

    Reads at most `limit` entries of the list index after `after`; items created before
    the cutoff but finished after it are passed over (a later round takes them).
    """
    params = {
        "tenant": tenant,
        "state": state,
        "queue": queue,
        "after_at": after[0] if after else "-infinity",
        "after_id": after[1] if after else FIRST_ITEM,
        "limit": limit,
    }
    row = await fetch_one(conn, _SQL["purge_finished"], params)
    assert row is not None
    last = (row["last_at"].isoformat(), row["last_id"]) if row["last_id"] else None
    return Purged(scanned=int(row["scanned"]), deleted=int(row["deleted"]), last=last)
