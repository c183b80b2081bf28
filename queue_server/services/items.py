"""Transaction boundaries and policy: authorisation, idempotency, the backlog cap, lease TTLs."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
import psycopg
import psycopg.errors
from psycopg.rows import dict_row
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from queue_server import auth, errors, views
from queue_server.infra.keycache import KeyCache
from queue_server.infra.metrics import Metrics
from queue_server.models import Role, is_uuid, uuid7
from queue_server.settings import Settings
from queue_server.store import idempotency_receipts, reads, tenants, transitions
from queue_server.store.types import Conn, Row
from queue_server.workers.notifier import Notifier

WORKER_OR_OPERATOR = (Role.WORKER, Role.OPERATOR)

# How long a queue found near its concurrency limit skips the shared-lock attempt.
NEAR_LIMIT_MEMORY = 5.0

# jsonb in and out through orjson: several times faster than the standard library
# on the payloads of a batch.
set_json_dumps(orjson.dumps)
set_json_loads(orjson.loads)


@dataclass(frozen=True, slots=True)
class Answer:
    """A finished answer: what the client gets now, and what a replay of its key gets later."""

    status: int
    body: bytes
    replayed: bool = False
    problem: bool = False


@dataclass(frozen=True, slots=True)
class Idempotency:
    """An effecting request's key and the fingerprint of what it asked for."""

    key: str
    fingerprint: str

    @classmethod
    def of(cls, key: str | None, *, method: str, path: str, body: Any) -> Idempotency:
        if key is None or not 1 <= len(key) <= 255 or not all(33 <= ord(c) <= 126 for c in key):
            raise errors.IdempotencyKeyRequiredError()
        canonical = orjson.dumps([method, path, body], option=orjson.OPT_SORT_KEYS)
        return cls(key=key, fingerprint=hashlib.sha256(canonical).hexdigest())


@dataclass(frozen=True, slots=True)
class NewItem:
    payload: Any
    priority: int = 0
    delay: float = 0.0
    max_acquisitions: int | None = None


def _ok(status: int, body: Any) -> Answer:
    return Answer(status=status, body=views.dumps(body))


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)


class QueueService:
    """The one object the API talks to. Owns the connection pool and the notifier."""

    def __init__(self, settings: Settings, conninfo: str) -> None:
        self.settings = settings
        self.conninfo = conninfo
        options = (
            f"-c statement_timeout={settings.statement_timeout_ms}"
            f" -c lock_timeout={settings.lock_timeout_ms}"
            " -c idle_in_transaction_session_timeout=60000 -c TimeZone=UTC"
            # Plans that do not depend on one tenant's statistics: a tenant whose rows
            # ANALYZE has not seen yet must not send acquire down the primary key.
            " -c plan_cache_mode=force_generic_plan"
        )
        self.pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            conninfo,
            min_size=settings.pool_min_size,
            max_size=settings.pool_max_size,
            kwargs={
                "autocommit": True,
                "row_factory": dict_row,
                "options": options,
                # Every statement prepared at first use, so every one runs its generic plan.
                "prepare_threshold": 0,
            },
            # No check on checkout (it costs a round trip per request): a connection that
            # broke fails its request with a 503 and the pool replaces it.
            timeout=10.0,
            open=False,
            name="queue-server",
        )
        self.keys = KeyCache()
        self._slack: int | None = None
        self._near_limit: dict[tuple[str, str], float] = {}
        self.notifier = Notifier(conninfo, on_keys_changed=self._keys_changed)
        self.metrics = Metrics()

    async def open(self) -> None:
        await self.pool.open(wait=False)
        await self.notifier.start()

    async def close(self) -> None:
        await self.notifier.stop()
        await self.pool.close()

    # -- connections -------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _conn(self, timeout: float | None = None) -> AsyncIterator[Conn]:
        """A pooled connection; driver failures become domain errors here and nowhere else."""
        try:
            async with self.pool.connection(timeout=timeout or self.settings.pool_timeout) as conn:
                yield conn
        except PoolTimeout as exc:
            raise errors.ServiceUnavailableError() from exc
        except (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable) as exc:
            raise errors.TimeoutExceededError() from exc
        except psycopg.OperationalError as exc:
            raise errors.ServiceUnavailableError() from exc

    @contextlib.asynccontextmanager
    async def _tx(self) -> AsyncIterator[Conn]:
        # Not in pipeline mode: measured here, psycopg spent more CPU on the pipeline
        # than the round trips it saved cost.
        async with self._conn() as conn, conn.transaction():
            yield conn

    async def ready(self) -> bool:
        """The database answers and its schema is at the head revision."""
        from queue_server.infra import migrate

        try:
            # Readiness probes have short timeouts of their own: answer within a second.
            async with self._conn(timeout=1.0) as conn:
                cur = await conn.execute("SELECT version_num FROM alembic_version")
                rows = await cur.fetchall()
        except (errors.QueueServerError, psycopg.Error):
            return False
        return {row["version_num"] for row in rows} == migrate.head_revisions()

    # -- idempotent effects ------------------------------------------------

    async def _effect(
        self,
        tenant: str,
        idem: Idempotency,
        instance: str,
        operation: Callable[[Conn], Awaitable[Answer]],
    ) -> Answer:
        """Run `operation` once per (tenant, key); a repeat gets the first answer back.

        The receipt is claimed before any authority check, in the operation's
        transaction: a concurrent request with the same key waits on it and then
        replays. 2xx answers and 409/422 refusals are kept; anything else rolls back.
        """
        async with self._tx() as conn:
            try:
                claimed = await idempotency_receipts.claim(
                    conn,
                    tenant=tenant,
                    key=idem.key,
                    fingerprint=idem.fingerprint,
                    retention=self.settings.idempotency_retention,
                )
            except psycopg.errors.LockNotAvailable as exc:
                raise errors.IdempotencyKeyInFlightError() from exc
            if not claimed:
                receipt = await idempotency_receipts.get(conn, tenant=tenant, key=idem.key)
                if receipt is None:
                    raise errors.IdempotencyKeyInFlightError()
                if receipt["fingerprint"] != idem.fingerprint:
                    raise errors.IdempotencyKeyReuseError(idempotency_key=idem.key)
                status = receipt["response_status"]
                return Answer(
                    status=status,
                    body=receipt["response_body"].encode(),
                    replayed=True,
                    problem=status >= 400,
                )
            try:
                answer = await operation(conn)
            except errors.QueueServerError as exc:
                if exc.status not in (409, 422):
                    raise
                body = errors.problem(
                    exc, base_uri=self.settings.problem_base_uri, instance=instance
                )
                answer = Answer(status=exc.status, body=views.dumps(body), problem=True)
            await idempotency_receipts.fill(
                conn, tenant=tenant, key=idem.key, status=answer.status, body=answer.body.decode()
            )
            return answer

    async def purge_receipts(self) -> int:
        async with self._tx() as conn:
            return await idempotency_receipts.purge_expired(conn)

    # -- authentication ----------------------------------------------------

    def _keys_changed(self) -> None:
        self.keys.clear()
        self.keys.enabled = self.notifier.connected.is_set()

    async def authenticate(self, authorization: str | None) -> auth.Principal:
        key_id = auth.parse_bearer(authorization)
        row = self.keys.get(key_id)
        if row is None:
            generation = self.keys.generation
            async with self._conn() as conn:
                row = await tenants.get_key(conn, key_id)
            if row is not None and row["revoked_at"] is None:
                self.keys.put(key_id, row, generation)
        secret = (authorization or "").partition(" ")[2].strip()
        if row is None or row["revoked_at"] is not None:
            raise errors.UnauthorizedError("The API key is unknown or revoked.")
        if not auth.secret_matches(secret, row["secret_hash"]):
            raise errors.UnauthorizedError("The API key is unknown or revoked.")
        return auth.Principal(key_id=key_id, tenant=row["tenant_id"], role=Role(row["role"]))

    async def ensure_admin_key(self) -> str | None:
        """Create an admin key if none exists; returns its secret (shown once) or None."""
        async with self._tx() as conn:
            await conn.execute("SELECT pg_advisory_xact_lock(hashtext('queue-server-admin-key'))")
            if await tenants.count_admin_keys(conn) > 0:
                return None
            key = auth.new_key()
            await tenants.create_key(
                conn, key_id=key.key_id, tenant=None, role=Role.ADMIN, secret_hash=key.secret_hash
            )
            return key.secret

    # -- tenants and keys --------------------------------------------------

    async def put_tenant(
        self,
        principal: auth.Principal,
        tenant: str,
        *,
        backlog_cap: int,
        default_max_acquisitions: int,
        default_lease_ttl: float,
    ) -> Answer:
        principal.require_admin(tenant)
        async with self._tx() as conn:
            row = await tenants.put_tenant(
                conn,
                tenant=tenant,
                backlog_cap=backlog_cap,
                default_max_acquisitions=default_max_acquisitions,
                default_lease_ttl=_seconds(default_lease_ttl),
            )
        return _ok(200, views.tenant(row))

    async def get_tenant(self, principal: auth.Principal, tenant: str) -> Answer:
        principal.require(tenant, Role.OPERATOR)
        async with self._conn() as conn:
            row = await tenants.get_tenant(conn, tenant)
            if row is None:
                raise errors.TenantNotFoundError(tenant=tenant)
            counts = await reads.state_counts(conn, tenant=tenant)
        return _ok(200, views.tenant(row, counts))

    async def create_key(self, principal: auth.Principal, tenant: str, role: Role) -> Answer:
        principal.require_admin(tenant)
        key = auth.new_key()
        async with self._tx() as conn:
            if await tenants.get_tenant(conn, tenant) is None:
                raise errors.TenantNotFoundError(tenant=tenant)
            await tenants.create_key(
                conn, key_id=key.key_id, tenant=tenant, role=role, secret_hash=key.secret_hash
            )
        return _ok(
            201, {"key_id": key.key_id, "tenant": tenant, "role": role, "secret": key.secret}
        )

    async def revoke_key(self, principal: auth.Principal, tenant: str, key_id: str) -> None:
        principal.require_admin(tenant)
        async with self._tx() as conn:
            if not await tenants.revoke_key(conn, tenant=tenant, key_id=key_id):
                raise errors.KeyNotFoundError(key_id=key_id)
        # This process stops accepting the key now; the others when the notification arrives.
        self.keys.clear()

    # -- work items --------------------------------------------------------

    async def enqueue(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        items: list[NewItem],
        idem: Idempotency,
        *,
        instance: str,
        batch: bool,
    ) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        await self._refuse_early_at_cap(tenant, idem, len(items))

        async def operation(conn: Conn) -> Answer:
            row, backlog = await tenants.admit(conn, tenant)
            if row is None:
                raise errors.TenantNotFoundError(tenant=tenant)
            cap = row["backlog_cap"]
            if backlog + len(items) > cap:
                raise errors.BacklogCapReachedError(
                    f"Backlog {backlog} + {len(items)} new would exceed the cap of {cap}.",
                    backlog=backlog,
                    backlog_cap=cap,
                    requested=len(items),
                )
            default_budget = row["default_max_acquisitions"]
            specs = [
                {
                    "item_id": uuid7(),
                    "payload": item.payload,
                    "priority": item.priority,
                    "delay": item.delay,
                    "max_acquisitions": item.max_acquisitions or default_budget,
                }
                for item in items
            ]
            rows = await transitions.enqueue(
                conn, tenant=tenant, queue=queue, items=specs, actor=principal.actor
            )
            if batch:
                return _ok(201, {"items": [views.item(r) for r in rows]})
            return _ok(201, views.item(rows[0]))

        return await self._effect(tenant, idem, instance, operation)

    async def _refuse_early_at_cap(self, tenant: str, idem: Idempotency, adding: int) -> None:
        """A tenant flooding a full backlog is refused with one read, no lock and no receipt,
        after a short pause (`cap_refusal_delay`) that holds no connection and no CPU.

        Only for a key with no receipt (a replay must still get its original answer);
        whatever this lets through, the admission under the tenant's lock decides exactly.
        """
        async with self._conn() as conn:
            row = await tenants.room(conn, tenant=tenant, key=idem.key)
        if (
            row is not None
            and not row["has_receipt"]
            and row["backlog"] + adding > row["backlog_cap"]
        ):
            await asyncio.sleep(self.settings.cap_refusal_delay)
            raise errors.BacklogCapReachedError(
                f"Backlog {row['backlog']} + {adding} new would exceed the cap of"
                f" {row['backlog_cap']}.",
                backlog=row["backlog"],
                backlog_cap=row["backlog_cap"],
                requested=adding,
            )

    async def get_item(self, principal: auth.Principal, tenant: str, item_id: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        row = await self._item_row(tenant, item_id)
        return _ok(200, views.item(row))

    async def _item_row(self, tenant: str, item_id: str) -> Row:
        if not is_uuid(item_id):
            raise errors.ItemNotFoundError(item_id=item_id)
        async with self._conn() as conn:
            row = await reads.get_item(conn, tenant=tenant, item_id=item_id)
        if row is None:
            raise errors.ItemNotFoundError(item_id=item_id)
        return row

    async def ledger(self, principal: auth.Principal, tenant: str, item_id: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        events = await self.ledger_rows(tenant, item_id)
        return _ok(200, {"item_id": item_id, "events": [views.event(e) for e in events]})

    async def ledger_rows(self, tenant: str, item_id: str) -> list[Row]:
        await self._item_row(tenant, item_id)
        async with self._conn() as conn:
            return await reads.ledger(conn, tenant=tenant, item_id=item_id)

    # -- leases ------------------------------------------------------------

    async def acquire(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        *,
        worker: str,
        lease_ttl: float | None,
        max_items: int,
        wait: float,
        client_gone: Callable[[], Awaitable[bool]],
    ) -> Answer:
        """Lease up to `max_items` due items, long-polling up to `wait` seconds for one.

        A lease is committed only while the client is still connected, so a
        long-poll whose client went away hands nothing out.
        """
        principal.require(tenant, Role.WORKER)
        ttl = await self._lease_ttl(tenant, lease_ttl)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        while True:
            wakeup = self.notifier.subscribe(tenant, queue)
            try:
                leased = await self._acquire_once(
                    tenant, queue, worker, ttl, max_items, client_gone
                )
                remaining = deadline - loop.time()
                if leased or remaining <= 0:
                    return _ok(200, {"leases": [views.lease(r) for r in leased]})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        wakeup.wait(), min(remaining, self.settings.poll_interval)
                    )
                if await client_gone():
                    raise errors.ClientDisconnectedError()
            finally:
                self.notifier.unsubscribe(tenant, queue, wakeup)

    async def _lease_ttl(self, tenant: str, lease_ttl: float | None) -> timedelta:
        if lease_ttl is not None:
            return _seconds(lease_ttl)
        async with self._conn() as conn:
            row = await tenants.get_tenant(conn, tenant)
        if row is None:
            raise errors.TenantNotFoundError(tenant=tenant)
        ttl: timedelta = row["default_lease_ttl"]
        return ttl

    async def _acquire_once(
        self,
        tenant: str,
        queue: str,
        worker: str,
        ttl: timedelta,
        max_items: int,
        client_gone: Callable[[], Awaitable[bool]],
    ) -> list[Row]:
        """Acquire transactions until something is leased or nothing more was quarantined.

        A client that has left gets nothing: it is checked before the acquire, and
        leases committed while it left are released at once, uncharged.
        """
        while True:
            if await client_gone():
                raise errors.ClientDisconnectedError()
            with self.metrics.acquire_seconds.time():
                async with self._conn() as conn:
                    acquired = await transitions.acquire(
                        conn,
                        tenant=tenant,
                        queue=queue,
                        worker=worker,
                        ttl=ttl,
                        max_items=max_items,
                        slack=await self._slack_for(conn, tenant, queue),
                    )
                    leased, quarantined = acquired.leased, acquired.quarantined
                    if acquired.contended:
                        self._near_limit[(tenant, queue)] = time.monotonic()
                    if leased and await client_gone():
                        async with conn.transaction():
                            await transitions.release_unsent(
                                conn, tenant=tenant, worker=worker, leases=leased
                            )
                        raise errors.ClientDisconnectedError()
            if leased or not quarantined:
                return leased

    async def _slack_for(self, conn: Conn, tenant: str, queue: str) -> int | None:
        """The slack for a shared-lock acquire, or None where the queue was lately near its
        limit (a default queue, limit 1, always is): then acquire goes exclusive at once."""
        since = self._near_limit.get((tenant, queue))
        if since is not None and time.monotonic() - since < NEAR_LIMIT_MEMORY:
            return None
        if self._slack is None:
            # Every acquire in flight holds a database connection and leases at most 100.
            cur = await conn.execute("SELECT current_setting('max_connections')::int AS n")
            row = await cur.fetchone()
            assert row is not None
            self._slack = int(row["n"]) * transitions.MAX_ITEMS_PER_ACQUIRE
        return self._slack

    async def heartbeat(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        *,
        worker: str,
        fence: int,
        lease_ttl: float | None,
    ) -> Answer:
        principal.require(tenant, Role.WORKER)
        ttl = await self._lease_ttl(tenant, lease_ttl)
        self._check_item_id(item_id)
        async with self._tx() as conn:
            row = await transitions.heartbeat(
                conn, tenant=tenant, item_id=item_id, worker=worker, fence=fence, ttl=ttl
            )
            if row is None:
                raise await transitions.explain_rejection(
                    conn, tenant=tenant, item_id=item_id, worker=worker, fence=fence
                )
        return _ok(
            200, {"item_id": item_id, "fence": fence, "lease_expires_at": row["lease_expires_at"]}
        )

    @staticmethod
    def _check_item_id(item_id: str) -> None:
        if not is_uuid(item_id):
            raise errors.ItemNotFoundError(item_id=item_id)

    async def _holder_effect(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        idem: Idempotency,
        instance: str,
        *,
        worker: str,
        fence: int,
        change: Callable[[Conn], Awaitable[Row | None]],
        on_refusal: Callable[[Conn, errors.QueueServerError], Awaitable[None]] | None = None,
    ) -> Answer:
        principal.require(tenant, Role.WORKER)
        self._check_item_id(item_id)

        async def operation(conn: Conn) -> Answer:
            row = await change(conn)
            if row is None:
                refusal = await transitions.explain_rejection(
                    conn, tenant=tenant, item_id=item_id, worker=worker, fence=fence
                )
                if on_refusal is not None and not isinstance(refusal, errors.NotFoundError):
                    await on_refusal(conn, refusal)
                raise refusal
            return _ok(200, views.item(row))

        return await self._effect(tenant, idem, instance, operation)

    async def complete(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        idem: Idempotency,
        *,
        instance: str,
        worker: str,
        fence: int,
        result: Any,
    ) -> Answer:
        async def change(conn: Conn) -> Row | None:
            return await transitions.complete(
                conn, tenant=tenant, item_id=item_id, worker=worker, fence=fence, result=result
            )

        return await self._holder_effect(
            principal, tenant, item_id, idem, instance, worker=worker, fence=fence, change=change
        )

    async def complete_many(
        self,
        principal: auth.Principal,
        tenant: str,
        idem: Idempotency,
        *,
        instance: str,
        worker: str,
        completions: list[dict[str, Any]],
    ) -> Answer:
        """Complete many items in one transaction, each guarded by its own fence.

        One receipt covers the batch; each entry gets its own answer (the item, or
        the refusal that a single complete would have given).
        """
        principal.require(tenant, Role.WORKER)
        ids = [entry["item_id"] for entry in completions]
        if len(set(ids)) != len(ids):
            raise errors.InvalidRequestError("Each item may appear once in a batch of completions.")

        async def operation(conn: Conn) -> Answer:
            valid = [entry for entry in completions if is_uuid(entry["item_id"])]
            done = await transitions.complete_many(
                conn, tenant=tenant, worker=worker, completions=valid
            )
            # Ids that are not ours cannot be explained by the database: they are simply not found.
            refused = {
                entry["item_id"]: entry["fence"] for entry in valid if entry["item_id"] not in done
            }
            refusals = (
                await transitions.explain_rejections(
                    conn, tenant=tenant, worker=worker, fences=refused
                )
                if refused
                else {}
            )
            results = []
            for item_id in ids:
                if item_id in done:
                    results.append(
                        {"item_id": item_id, "status": 200, "item": views.item(done[item_id])}
                    )
                    continue
                refusal = refusals.get(item_id) or errors.ItemNotFoundError(item_id=item_id)
                problem = errors.problem(
                    refusal, base_uri=self.settings.problem_base_uri, instance=instance
                )
                results.append({"item_id": item_id, "status": refusal.status, "problem": problem})
            return _ok(200, {"completed": len(done), "results": results})

        return await self._effect(tenant, idem, instance, operation)

    async def requeue(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        idem: Idempotency,
        *,
        instance: str,
        worker: str,
        fence: int,
        reason: str,
    ) -> Answer:
        async def change(conn: Conn) -> Row | None:
            return await transitions.requeue(
                conn, tenant=tenant, item_id=item_id, worker=worker, fence=fence, reason=reason
            )

        return await self._holder_effect(
            principal, tenant, item_id, idem, instance, worker=worker, fence=fence, change=change
        )

    async def triage(
        self,
        principal: auth.Principal,
        tenant: str,
        item_id: str,
        idem: Idempotency,
        *,
        instance: str,
        worker: str,
        fence: int,
        failure: dict[str, Any],
        quarantine: bool,
    ) -> Answer:
        async def change(conn: Conn) -> Row | None:
            return await transitions.triage(
                conn,
                tenant=tenant,
                item_id=item_id,
                worker=worker,
                fence=fence,
                failure=failure,
                quarantine=quarantine,
            )

        async def record(conn: Conn, refusal: errors.QueueServerError) -> None:
            # A refused triage is still an observable failure fact.
            await transitions.record_triage_rejected(
                conn,
                tenant=tenant,
                item_id=item_id,
                worker=worker,
                fence=fence,
                failure=failure,
                reason=refusal.code,
            )

        return await self._holder_effect(
            principal,
            tenant,
            item_id,
            idem,
            instance,
            worker=worker,
            fence=fence,
            change=change,
            on_refusal=record,
        )

    # -- spend approvals ---------------------------------------------------

    async def approve_spend(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        idem: Idempotency,
        *,
        instance: str,
        approved_by: str,
        max_concurrency: int,
        expires_at: datetime,
        reason: str,
    ) -> Answer:
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            if await tenants.get_tenant(conn, tenant) is None:
                raise errors.TenantNotFoundError(tenant=tenant)
            row = await tenants.add_spend_approval(
                conn,
                tenant=tenant,
                queue=queue,
                approved_by=approved_by,
                max_concurrency=max_concurrency,
                expires_at=expires_at,
                reason=reason,
            )
            return _ok(201, views.spend_approval(row))

        return await self._effect(tenant, idem, instance, operation)

    async def concurrency(self, principal: auth.Principal, tenant: str, queue: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self._conn() as conn:
            info = await tenants.concurrency(conn, tenant=tenant, queue=queue)
        return _ok(200, {"tenant": tenant, "queue": queue, **info})

    # -- service -----------------------------------------------------------

    async def state_counts(self) -> list[Row]:
        async with self._conn() as conn:
            return await reads.all_state_counts(conn)
