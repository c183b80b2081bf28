"""Named weakenings of the runtime, applied by a pytest plugin inside the test process only.

    pytest -p tests.weakenings --weaken lift-attempt-cap tests/api/test_lease_envelope.py

The contract verifier (`python -m tests.contract`) runs each binding's test under its
weakening and requires that it fails: a test that still passes when the value it
guards is lifted, or the mechanism removed, does not prove the cell is enforced.

Nothing here is reachable from the installed package: the production runtime has no
switch, setting or environment variable that weakens it. A weakening patches the
runtime in this test process (the live server of a test runs in it, in a thread):

- `lift(...)` lifts a cell's value where every enforcement point reads it
  (`ReliabilityPolicy.for_class`, under the typed views and the policy helpers), so a
  lifted test proves the runtime reads that value from the loaded policy;
- `replace_sql(...)` edits one named statement of a store module's `.sql` file, as a
  wrong edit of the store would;
- `after_migrate(...)` changes the test databases' schema (e.g. drops an index);
- plain `monkeypatch.setattr` swaps a mechanism (e.g. the negative control's
  cancel-after-dispatch mutation path into the REST-backed bridge).

Add one with `@weakening("name", "what it breaks")` on a function taking the
`pytest.MonkeyPatch`; bind it to a cell in `tests/policy_proof/bindings.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from queue_server.policy.model import ClassPolicy, OperationClass
from queue_server.policy.values import ReliabilityPolicy

Apply = Callable[[pytest.MonkeyPatch], None]


@dataclass(frozen=True)
class Weakening:
    name: str
    description: str
    apply: Apply
    # It changes the schema (`after_migrate`): its tests need a template of their own.
    own_schema: bool = False


WEAKENINGS: dict[str, Weakening] = {}


def weakening(name: str, description: str, *, own_schema: bool = False) -> Callable[[Apply], Apply]:
    def register(apply: Apply) -> Apply:
        if name in WEAKENINGS:
            raise ValueError(f"weakening {name!r} is registered twice")
        WEAKENINGS[name] = Weakening(name, description, apply, own_schema)
        return apply

    return register


# -- the tools ------------------------------------------------------------------------------


def lift(mp: pytest.MonkeyPatch, operation_class: str, dimension: str, **changes: Any) -> None:
    """Every reader of the class's cell sees it with `changes` (the loader is bypassed)."""
    target = OperationClass(operation_class)
    attribute = dimension.replace("-", "_")
    original = ReliabilityPolicy.for_class

    def for_class(self: ReliabilityPolicy, cls: OperationClass | str) -> ClassPolicy:
        policy = original(self, cls)
        if OperationClass(cls) is not target:
            return policy
        cell = getattr(policy, attribute)
        return policy.model_copy(update={attribute: cell.model_copy(update=changes)})

    mp.setattr(ReliabilityPolicy, "for_class", for_class)


def replace_sql(mp: pytest.MonkeyPatch, module: Any, name: str, old: str, new: str) -> None:
    """Edit the statement `name` that the store module `module` runs (its `_SQL[name]`);
    `old` must occur in it."""
    from queue_server.store.sql import Statements

    statements: Statements = module._SQL
    sql = statements[name]
    if old not in sql:
        raise AssertionError(f"{statements.module}.sql: {name} does not contain {old!r}")
    edited = Statements(statements.module, {**statements, name: sql.replace(old, new)})
    mp.setattr(module, "_SQL", edited)


_AFTER_MIGRATE: list[str] = []


def after_migrate(mp: pytest.MonkeyPatch, *statements: str) -> None:
    """Run `statements` on every database the tests migrate (the template each test clones);
    register the weakening with `own_schema=True`."""
    from queue_server.infra import migrate

    _AFTER_MIGRATE.extend(statements)
    original = migrate.upgrade

    def upgrade(url: str, revision: str = "heads") -> None:
        original(url, revision)
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            for statement in _AFTER_MIGRATE:
                conn.execute(statement.encode())

    mp.setattr(migrate, "upgrade", upgrade)


# -- durable-leased-work -----------------------------------------------------------------------

LW = "durable-leased-work"


@weakening("lift-attempt-cap", "durable-leased-work/retry max-acquisitions 5 -> 100")
def _lift_attempt_cap(mp: pytest.MonkeyPatch) -> None:
    lift(mp, LW, "retry", max_acquisitions=100)


@weakening("lift-lease-ttl-bound", "durable-leased-work/attempt-timeout 30 s -> 3600 s")
def _lift_lease_ttl_bound(mp: pytest.MonkeyPatch) -> None:
    lift(mp, LW, "attempt-timeout", seconds=3600)


@weakening("drop-lease-deadline", "durable-leased-work/deadline -> a million seconds")
def _drop_lease_deadline(mp: pytest.MonkeyPatch) -> None:
    lift(mp, LW, "deadline", seconds=1_000_000)


@weakening("lift-requeue-delay-cap", "durable-leased-work/backoff-and-jitter max 300 s -> a day")
def _lift_requeue_delay_cap(mp: pytest.MonkeyPatch) -> None:
    lift(mp, LW, "backoff-and-jitter", max_seconds=86_400)


@weakening("lift-leased-concurrency", "durable-leased-work/concurrency 1 -> 8 without approval")
def _lift_leased_concurrency(mp: pytest.MonkeyPatch) -> None:
    lift(mp, LW, "concurrency", limit=8)


@weakening("no-quarantine-at-budget", "acquire hands out an item past its acquisition budget")
def _no_quarantine_at_budget(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import transitions

    replace_sql(
        mp,
        transitions,
        "acquire",
        "AND w.acquisition_count < w.max_acquisitions",
        "AND w.acquisition_count <= w.max_acquisitions",
    )


@weakening("no-expired-takeover", "acquire never takes over an expired lease")
def _no_expired_takeover(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import transitions

    # Both ways an acquire finds an expired lease (the text occurs in each): from its
    # cursor, and among the leases placed since the cursor's snapshot.
    replace_sql(
        mp,
        transitions,
        "acquire",
        "AND lease_expires_at <= statement_timestamp()\n        ORDER BY lease_expires_at",
        "AND false\n        ORDER BY lease_expires_at",
    )


@weakening("drop-fence-guard", "holder operations stop checking the fence presented")
def _drop_fence_guard(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import transitions

    for name in ("heartbeat", "complete", "requeue", "triage_requeue", "triage_quarantine"):
        replace_sql(mp, transitions, name, "fence = %(fence)s AND ", "")


@weakening("drop-backlog-cap", "enqueue admits past the tenant's backlog cap")
def _drop_backlog_cap(mp: pytest.MonkeyPatch) -> None:
    from queue_server.services.items import Items
    from queue_server.store import tenants, transitions

    original_room, original_take = tenants.room, tenants.take_admission

    async def room(conn: Any, **kw: Any) -> Any:
        row = await original_room(conn, **kw)
        return None if row is None else {**row, "backlog": 0}

    async def take_admission(conn: Any, **kw: Any) -> Any:
        return await original_take(conn, **{**kw, "cap": 2**62})

    async def no_early_refusal(*_: Any) -> None:
        return None

    # The enqueue's admission holds the cap in SQL (queue_server.admit): lift the tenant's
    # cap and the policy's ceiling around it, inside the admission's own transaction.
    def lifted(run: Any) -> Any:
        async def admission(conn: Any, **kw: Any) -> Any:
            cur = await conn.execute(
                "SELECT backlog_cap FROM tenants WHERE tenant_id = %s", (kw["tenant"],)
            )
            row = await cur.fetchone()
            if row is None:
                return await run(conn, **kw)
            cap = row["backlog_cap"] if isinstance(row, dict) else row[0]
            await conn.execute(
                "UPDATE tenants SET backlog_cap = 2147483647 WHERE tenant_id = %s",
                (kw["tenant"],),
            )
            try:
                return await run(conn, **{**kw, "backlog_ceiling": 2**62})
            finally:
                await conn.execute(
                    "UPDATE tenants SET backlog_cap = %s WHERE tenant_id = %s",
                    (cap, kw["tenant"]),
                )

        return admission

    mp.setattr(tenants, "room", room)
    mp.setattr(tenants, "take_admission", take_admission)
    mp.setattr(transitions, "enqueue", lifted(transitions.enqueue))
    mp.setattr(transitions, "enqueue_rows", lifted(transitions.enqueue_rows))
    mp.setattr(Items, "_refuse_early_at_cap", no_early_refusal)


@weakening(
    "fold-past-running-transactions",
    "the counters' fold takes its base as of its snapshot's xmax, past transactions running",
)
def _fold_past_running_transactions(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import counters

    replace_sql(
        mp,
        counters,
        "fold",
        "SELECT pg_snapshot_xmin(pg_current_snapshot()) AS x",
        "SELECT pg_snapshot_xmax(pg_current_snapshot()) AS x",
    )


@weakening(
    "counters-read-above-the-base",
    "the counters' readers add only the deltas above the base's as_of_xid, not at it",
    own_schema=True,
)
def _counters_read_above_the_base(mp: pytest.MonkeyPatch) -> None:
    import importlib

    view: str = importlib.import_module(
        "queue_server.migrations.versions.0023_counter_deltas"
    ).COUNTER_TOTALS
    bound = "d.xid >= (SELECT as_of_xid FROM base)"
    if bound not in view:
        raise AssertionError(f"counter_totals does not contain {bound!r}")
    shards: str = importlib.import_module(
        "queue_server.migrations.versions.0028_admission_shards"
    ).ADMISSION_BACKLOGS
    above = "d.xid > (SELECT as_of_xid FROM base)"
    weakened = []
    for text in (view, shards):
        if bound not in text:
            raise AssertionError(f"{text[:40]!r} does not contain {bound!r}")
        # The test databases' tables live in `public`.
        weakened.append(
            text.replace("CREATE VIEW", "CREATE OR REPLACE VIEW")
            .replace("{home}", "public")
            .replace(bound, above)
        )
    after_migrate(mp, *weakened)


@weakening(
    "admission-updates-the-tenant",
    "every admission updates the tenant's row again (a version per admission)",
    own_schema=True,
)
def _admission_updates_the_tenant(mp: pytest.MonkeyPatch) -> None:
    import importlib

    migration = importlib.import_module("queue_server.migrations.versions.0028_admission_shards")
    admit: str = migration.ADMIT_ROWS
    take = "    shards := queue_server.admission_shards("
    if take not in admit:
        raise AssertionError(f"admit_rows does not contain {take!r}")
    update = "    UPDATE tenants SET updated_at = updated_at WHERE tenant_id = p_tenant;\n"
    weakened = admit.replace(take, update + take).replace(
        "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
    )
    # The test databases' tables live in `public`.
    after_migrate(mp, migration._ddl(weakened, "public"))


@weakening(
    "admission-shard-unlocked",
    "an admission reads its shard's room without locking the shard",
    own_schema=True,
)
def _admission_shard_unlocked(mp: pytest.MonkeyPatch) -> None:
    import importlib

    migration = importlib.import_module("queue_server.migrations.versions.0028_admission_shards")
    shards: str = migration.ADMISSION_SHARDS
    lock = "        FOR NO KEY UPDATE SKIP LOCKED;"
    if lock not in shards:
        raise AssertionError(f"admission_shards does not contain {lock!r}")
    weakened = shards.replace(lock, "        ;").replace(
        "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"
    )
    # The test databases' tables live in `public`.
    after_migrate(mp, migration._ddl(weakened, "public"))


@weakening("release-to-shard-zero", "a completion gives its room back to shard 0, not its own")
def _release_to_shard_zero(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import transitions

    for name in ("complete", "complete_many"):
        replace_sql(
            mp,
            transitions,
            name,
            "SELECT tenant_id, queue, admission_shard, count(*), count(*), count(leased_at),",
            "SELECT tenant_id, queue, 0, count(*), count(*), count(leased_at),",
        )


@weakening("complete-uncounted", "a single complete inserts no counter delta")
def _complete_uncounted(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import transitions

    replace_sql(
        mp,
        transitions,
        "complete",
        "0)::bigint\n    FROM upd GROUP BY tenant_id, queue",
        "0)::bigint\n    FROM upd WHERE false GROUP BY tenant_id, queue",
    )


@weakening("lease-to-a-gone-client", "a long poll whose client left still hands out a lease")
def _lease_to_a_gone_client(mp: pytest.MonkeyPatch) -> None:
    from queue_server.services.leases import Leases

    original = Leases.acquire

    async def never() -> bool:
        return False

    async def acquire(self: Leases, *args: Any, **kwargs: Any) -> Any:
        return await original(self, *args, **{**kwargs, "client_gone": never})

    mp.setattr(Leases, "acquire", acquire)


# -- batch routes and triage --
# One guard of one statement each: a wrong edit of the store removes one line, not all of them.

_HOLDER = "AND lease_holder = %(worker)s"
_EXPIRY = "AND lease_expires_at > statement_timestamp()"
_FENCE = "fence = %(fence)s AND "
_HOLDER_MANY = "AND w.lease_holder = %(worker)s"
_EXPIRY_MANY = "AND w.lease_expires_at > statement_timestamp()"
_FENCE_MANY = "w.fence = i.fence AND "


def _drop(mp: pytest.MonkeyPatch, guard: str, *names: str) -> None:
    from queue_server.store import transitions

    for name in names:
        replace_sql(mp, transitions, name, guard, "")


_KEY = "AND coalesce(lease_key_id, %(key_id)s) = %(key_id)s"
_KEY_MANY = "AND coalesce(w.lease_key_id, %(key_id)s) = %(key_id)s"


@weakening("any-key-holds-the-lease", "holder operations stop checking the key that took it")
def _any_key_holds_the_lease(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _KEY, "heartbeat", "complete", "requeue", "triage_requeue", "triage_quarantine")
    _drop(mp, _KEY_MANY, "heartbeat_many", "complete_many")


@weakening("batch-complete-any-holder", "batch complete stops checking the holder's name")
def _batch_complete_any_holder(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _HOLDER_MANY, "complete_many")


@weakening("batch-complete-any-fence", "batch complete stops checking each entry's fence")
def _batch_complete_any_fence(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _FENCE_MANY, "complete_many")


@weakening("batch-complete-after-expiry", "batch complete accepts an expired lease")
def _batch_complete_after_expiry(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _EXPIRY_MANY, "complete_many")


@weakening("batch-complete-any-tenant", "batch complete finds the items of every tenant")
def _batch_complete_any_tenant(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, "w.tenant_id = %(tenant)s AND ", "complete_many")


@weakening("batch-heartbeat-any-holder", "batch heartbeat stops checking the holder's name")
def _batch_heartbeat_any_holder(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _HOLDER_MANY, "heartbeat_many")


@weakening("batch-heartbeat-any-fence", "batch heartbeat stops checking each entry's fence")
def _batch_heartbeat_any_fence(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _FENCE_MANY, "heartbeat_many")


@weakening("batch-heartbeat-after-expiry", "batch heartbeat revives an expired lease")
def _batch_heartbeat_after_expiry(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _EXPIRY_MANY, "heartbeat_many")


@weakening("batch-heartbeat-past-deadline", "batch heartbeat extends a lease past its deadline")
def _batch_heartbeat_past_deadline(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import transitions

    replace_sql(
        mp,
        transitions,
        "heartbeat_many",
        "%(max_ttl)s::interval),\n            w.lease_deadline_at)",
        "%(max_ttl)s::interval))",
    )


@weakening("triage-requeue-any-holder", "triage (decision requeue) stops checking the holder")
def _triage_requeue_any_holder(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _HOLDER, "triage_requeue")


@weakening("triage-quarantine-any-holder", "triage (decision quarantine) stops checking the holder")
def _triage_quarantine_any_holder(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _HOLDER, "triage_quarantine")


@weakening("triage-requeue-any-fence", "triage (decision requeue) stops checking the fence")
def _triage_requeue_any_fence(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _FENCE, "triage_requeue")


@weakening("triage-quarantine-any-fence", "triage (decision quarantine) stops checking the fence")
def _triage_quarantine_any_fence(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _FENCE, "triage_quarantine")


@weakening("triage-requeue-after-expiry", "triage (decision requeue) accepts an expired lease")
def _triage_requeue_after_expiry(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _EXPIRY, "triage_requeue")


@weakening(
    "triage-quarantine-after-expiry", "triage (decision quarantine) accepts an expired lease"
)
def _triage_quarantine_after_expiry(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _EXPIRY, "triage_quarantine")


@weakening("triage-rejection-unrecorded", "a refused triage leaves no triage_rejected event")
def _triage_rejection_unrecorded(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import transitions

    replace_sql(
        mp, transitions, "record_triage_rejected", "    FROM upd;", "    FROM upd WHERE false;"
    )


@weakening(
    "triage-replay-rechecks-authority",
    "a triage under an accepted key checks the lease before its receipt is replayed",
)
def _triage_replay_rechecks_authority(mp: pytest.MonkeyPatch) -> None:
    from queue_server.services.leases import Leases
    from queue_server.store import transitions

    original = Leases.triage

    async def triage(
        self: Leases, principal: Any, tenant: str, item_id: str, *a: Any, **kw: Any
    ) -> Any:
        async with self.db.conn() as conn:
            cur = await conn.execute(
                "SELECT 1 FROM work_items WHERE tenant_id = %s AND item_id = %s"
                " AND state = 'leased' AND fence = %s AND lease_holder = %s"
                " AND lease_expires_at > now()",
                (tenant, item_id, kw["fence"], kw["worker"]),
            )
            if await cur.fetchone() is None:
                raise await transitions.explain_rejection(
                    conn,
                    tenant=tenant,
                    item_id=item_id,
                    worker=kw["worker"],
                    key_id=principal.key_id,
                    fence=kw["fence"],
                )
        return await original(self, principal, tenant, item_id, *a, **kw)

    mp.setattr(Leases, "triage", triage)


@weakening("drop-holder-guard", "heartbeat, complete and requeue stop checking the holder's name")
def _drop_holder_guard(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _HOLDER, "heartbeat", "complete", "requeue")


@weakening("drop-expiry-guard", "heartbeat, complete and requeue accept an expired lease")
def _drop_expiry_guard(mp: pytest.MonkeyPatch) -> None:
    _drop(mp, _EXPIRY, "heartbeat", "complete", "requeue")


# -- artifact-verification -------------------------------------------------------------------

AV = "artifact-verification"


@weakening("drop-run-deadline", "artifact-verification/deadline -> a million seconds")
def _drop_run_deadline(mp: pytest.MonkeyPatch) -> None:
    lift(mp, AV, "deadline", seconds=1_000_000)


@weakening(
    "let-a-second-run-in",
    "the index that keeps one running run per tenant is dropped",
    own_schema=True,
)
def _let_a_second_run_in(mp: pytest.MonkeyPatch) -> None:
    after_migrate(mp, "DROP INDEX uq_verification_runs_running")


@weakening(
    "drop-run-key",
    "the index that makes (artifact, verifier version) one run is dropped",
    own_schema=True,
)
def _drop_run_key(mp: pytest.MonkeyPatch) -> None:
    after_migrate(mp, "DROP INDEX uq_verification_runs_run_key")


@weakening("lift-verification-concurrency", "artifact-verification/concurrency 1 -> 2")
def _lift_verification_concurrency(mp: pytest.MonkeyPatch) -> None:
    lift(mp, AV, "concurrency", limit=2)


@weakening("single-attempt-verification", "artifact-verification/retry 3 attempts -> 1")
def _single_attempt_verification(mp: pytest.MonkeyPatch) -> None:
    lift(mp, AV, "retry", max_attempts=1)


@weakening("lift-verification-attempt-timeout", "artifact-verification/attempt-timeout -> 1000 s")
def _lift_verification_attempt_timeout(mp: pytest.MonkeyPatch) -> None:
    lift(mp, AV, "attempt-timeout", seconds=1000)


@weakening(
    "lift-verification-backoff", "artifact-verification/backoff-and-jitter initial 1 s -> 5 s"
)
def _lift_verification_backoff(mp: pytest.MonkeyPatch) -> None:
    lift(mp, AV, "backoff-and-jitter", initial_seconds=5)


@weakening("runner-ignores-stop", "a verifier runner asked to stop runs on to the last item")
def _runner_ignores_stop(mp: pytest.MonkeyPatch) -> None:
    import threading

    from tests.demonstrators.verifier import VerifierRunner

    class Unheeded(threading.Event):
        def is_set(self) -> bool:
            return False

    original = VerifierRunner.__init__

    def init(self: VerifierRunner, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.stop = Unheeded()

    mp.setattr(VerifierRunner, "__init__", init)


@weakening("run-read-back-without-checkpoints", "a run is answered without its checkpoints")
def _run_read_back_without_checkpoints(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import verification_runs

    replace_sql(
        mp,
        verification_runs,
        "checkpoints",
        "WHERE tenant_id = %s AND run_id = %s ORDER BY",
        "WHERE false AND tenant_id = %s AND run_id = %s ORDER BY",
    )


# -- confirmed-mutation ----------------------------------------------------------------------

CM = "confirmed-mutation"


def _cancel_after_dispatch(mp: pytest.MonkeyPatch, target: type[Any]) -> None:
    from tests.policy_proof.mutation import CancelAfterDispatchMutationPath

    for name in ("_leave_running", "_caller_cancelled", "_abandon"):
        mp.setattr(target, name, getattr(CancelAfterDispatchMutationPath, name), raising=False)


@weakening(
    "cancel-dispatched-mutation-in-rest-bridge",
    "the REST-backed bridge cancels a dispatched mutation (docs/decisions/operation-class-policy.md, Decision 8)",
)
def _cancel_in_rest_bridge(mp: pytest.MonkeyPatch) -> None:
    from tests.demonstrators import mutations
    from tests.policy_proof.mutation import CancelAfterDispatchMutationPath

    mp.setattr(mutations, "ConfirmedMutationPath", CancelAfterDispatchMutationPath)


@weakening(
    "cancel-dispatched-mutation-in-process",
    "the in-process mutation path cancels a dispatched mutation (docs/decisions/operation-class-policy.md, Decision 8)",
)
def _cancel_in_process(mp: pytest.MonkeyPatch) -> None:
    from tests.demonstrators.mutation import ConfirmedMutationPath

    _cancel_after_dispatch(mp, ConfirmedMutationPath)


@weakening(
    "drop-one-shot-claim",
    "the index that binds an idempotency key to one outcome reference is dropped",
    own_schema=True,
)
def _drop_one_shot_claim(mp: pytest.MonkeyPatch) -> None:
    after_migrate(mp, "DROP INDEX uq_confirmation_receipts_tenant_id_idempotency_key")


@weakening("drop-receipt-deadline", "confirmed-mutation/deadline -> a million seconds")
def _drop_receipt_deadline(mp: pytest.MonkeyPatch) -> None:
    lift(mp, CM, "deadline", seconds=1_000_000)


@weakening("lift-mutation-permits", "confirmed-mutation/concurrency 8 -> 16")
def _lift_mutation_permits(mp: pytest.MonkeyPatch) -> None:
    lift(mp, CM, "concurrency", limit=16)


@weakening("lift-mutation-circuit", "confirmed-mutation/circuit-breaking threshold 3 -> 1000")
def _lift_mutation_circuit(mp: pytest.MonkeyPatch) -> None:
    lift(mp, CM, "circuit-breaking", failure_threshold=1000)


@weakening("lift-mutation-attempt-timeout", "confirmed-mutation/attempt-timeout 10 s -> 25 s")
def _lift_mutation_attempt_timeout(mp: pytest.MonkeyPatch) -> None:
    lift(mp, CM, "attempt-timeout", seconds=25)


@weakening("retry-a-failed-mutation", "the mutation path dispatches a failed effect once more")
def _retry_a_failed_mutation(mp: pytest.MonkeyPatch) -> None:
    from tests.demonstrators.mutation import ConfirmedMutationPath

    original = ConfirmedMutationPath._run_effect

    async def run_effect(
        self: ConfirmedMutationPath, store: Any, ref: str, effect: Any, ticket: Any
    ) -> Any:
        async def retried() -> Any:
            try:
                return await effect()
            except Exception:
                return await effect()

        return await original(self, store, ref, retried, ticket)

    mp.setattr(ConfirmedMutationPath, "_run_effect", run_effect)


@weakening(
    "replay-behind-the-gates",
    "a same-identity replay is answered only after the permits and the circuit admit it",
)
def _replay_behind_the_gates(mp: pytest.MonkeyPatch) -> None:
    from tests.demonstrators.mutation import ConfirmedMutationPath

    async def not_before_the_gates(*_: Any) -> None:
        return None

    mp.setattr(ConfirmedMutationPath, "_retained", not_before_the_gates)


@weakening(
    "queue-the-ninth-mutation",
    "confirmed-mutation/backpressure max-queued 0 -> a mutation waits for a free permit",
)
def _queue_the_ninth_mutation(mp: pytest.MonkeyPatch) -> None:
    import asyncio

    from tests.demonstrators.mutation import ConfirmedMutationPath

    original = ConfirmedMutationPath.__call__

    async def call(self: ConfirmedMutationPath, store: Any, **kwargs: Any) -> Any:
        while self.gate.in_use >= self.gate.capacity:
            await asyncio.sleep(0.01)
        return await original(self, store, **kwargs)

    mp.setattr(ConfirmedMutationPath, "__call__", call)


# -- read-only-dependency ---------------------------------------------------------------------

RO = "read-only-dependency"


@weakening("lift-read-attempts", "read-only-dependency/retry 3 attempts -> 5")
def _lift_read_attempts(mp: pytest.MonkeyPatch) -> None:
    lift(mp, RO, "retry", max_attempts=5)


@weakening("lift-read-attempt-timeout", "read-only-dependency/attempt-timeout 2 s -> 9 s")
def _lift_read_attempt_timeout(mp: pytest.MonkeyPatch) -> None:
    lift(mp, RO, "attempt-timeout", seconds=9)


@weakening("lift-read-deadline", "read-only-dependency/deadline 10 s -> 1000 s")
def _lift_read_deadline(mp: pytest.MonkeyPatch) -> None:
    lift(mp, RO, "deadline", seconds=1000)


@weakening("lift-read-circuit", "read-only-dependency/circuit-breaking threshold 5 -> 1000")
def _lift_read_circuit(mp: pytest.MonkeyPatch) -> None:
    lift(mp, RO, "circuit-breaking", failure_threshold=1000)


@weakening("lift-read-concurrency", "read-only-dependency/concurrency 16 -> 64")
def _lift_read_concurrency(mp: pytest.MonkeyPatch) -> None:
    lift(mp, RO, "concurrency", limit=64)


@weakening("lift-read-backoff", "read-only-dependency/backoff-and-jitter initial 0.1 s -> 1 s")
def _lift_read_backoff(mp: pytest.MonkeyPatch) -> None:
    lift(mp, RO, "backoff-and-jitter", initial_seconds=1)


@weakening(
    "let-reads-have-effects",
    "read-only-dependency/idempotency-and-fencing effects never -> optional",
)
def _let_reads_have_effects(mp: pytest.MonkeyPatch) -> None:
    lift(mp, RO, "idempotency-and-fencing", effects="optional")


@weakening("reads-run-on-after-cancel", "a read its caller cancelled runs on to its answer")
def _reads_run_on_after_cancel(mp: pytest.MonkeyPatch) -> None:
    import asyncio

    from tests.demonstrators.dependency import ReadOnlyDependencyClient

    original = ReadOnlyDependencyClient.get

    async def get(self: ReadOnlyDependencyClient, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.shield(original(self, *args, **kwargs))

    mp.setattr(ReadOnlyDependencyClient, "get", get)


# -- interactive-turn ---------------------------------------------------------------------------

IT = "interactive-turn"


@weakening("lift-turn-concurrency", "interactive-turn/concurrency 4 -> 64")
def _lift_turn_concurrency(mp: pytest.MonkeyPatch) -> None:
    lift(mp, IT, "concurrency", limit=64)


@weakening("lift-turn-deadline", "interactive-turn/deadline 120 s -> 100000 s")
def _lift_turn_deadline(mp: pytest.MonkeyPatch) -> None:
    lift(mp, IT, "deadline", seconds=100_000)


@weakening("lift-turn-circuit", "interactive-turn/circuit-breaking threshold 5 -> 1000")
def _lift_turn_circuit(mp: pytest.MonkeyPatch) -> None:
    lift(mp, IT, "circuit-breaking", failure_threshold=1000)


@weakening("turn-without-an-id", "interactive-turn/idempotency-and-fencing: no turn id required")
def _turn_without_an_id(mp: pytest.MonkeyPatch) -> None:
    lift(
        mp,
        IT,
        "idempotency-and-fencing",
        requires_idempotency_key=False,
        requires_outcome_reference=False,
    )


@weakening("turn-write-after-disconnect", "a turn's write is dispatched after its caller left")
def _turn_write_after_disconnect(mp: pytest.MonkeyPatch) -> None:
    from tests.demonstrators.cancellation import DisconnectAuthority

    def dispatch(self: DisconnectAuthority) -> None:
        with self._lock:
            self._dispatched = True

    mp.setattr(DisconnectAuthority, "dispatch", dispatch)


# -- watcher delivery ---------------------------------------------------------------------------
# -- watcher outbox ------------------------------------------------------------------------------

WD = "watcher-delivery"


@weakening("lift-delivery-deadline", "watcher-delivery/deadline 86400 s -> a million seconds")
def _lift_delivery_deadline(mp: pytest.MonkeyPatch) -> None:
    lift(mp, WD, "deadline", seconds=1_000_000)


@weakening("lift-delivery-attempt-timeout", "watcher-delivery/attempt-timeout -> 3600 s")
def _lift_delivery_attempt_timeout(mp: pytest.MonkeyPatch) -> None:
    lift(mp, WD, "attempt-timeout", seconds=3600)


@weakening("lift-delivery-attempts", "watcher-delivery/retry 5 attempts -> 8")
def _lift_delivery_attempts(mp: pytest.MonkeyPatch) -> None:
    lift(mp, WD, "retry", max_attempts=8)


@weakening("lift-delivery-backoff", "watcher-delivery/backoff-and-jitter initial 30 s -> 1 s")
def _lift_delivery_backoff(mp: pytest.MonkeyPatch) -> None:
    lift(mp, WD, "backoff-and-jitter", initial_seconds=1)


@weakening(
    "no-delivery-dead-letter", "a delivery dead at the end of its budget gets no dead letter"
)
def _no_delivery_dead_letter(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import outbox

    replace_sql(mp, outbox, "record", "FROM upd WHERE state = 'dead'", "FROM upd WHERE false")


@weakening("lift-delivery-concurrency", "watcher-delivery/concurrency 4 -> 16")
def _lift_delivery_concurrency(mp: pytest.MonkeyPatch) -> None:
    lift(mp, WD, "concurrency", limit=16)


@weakening("fresh-delivery-key-on-retry", "a retried delivery is sent under a key of its own")
def _fresh_delivery_key_on_retry(mp: pytest.MonkeyPatch) -> None:
    from queue_server.background.deliverer import Deliverer

    original = Deliverer._request

    def request(self: Deliverer, row: Any) -> Any:
        if int(row["attempts"]) > 1:
            row = {**row, "delivery_key": f"{row['delivery_key']}-{row['attempts']}"}
        return original(self, row)

    mp.setattr(Deliverer, "_request", request)


@weakening("stopped-delivery-keeps-its-claim", "a delivery stopped mid-dispatch stays claimed")
def _stopped_delivery_keeps_its_claim(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import outbox

    replace_sql(
        mp,
        outbox,
        "return_to_outbox",
        "claim_token = NULL, claimed_until = NULL, due_at",
        "due_at",
    )


@weakening("no-lost-claim-takeover", "a delivery whose deliverer died holding it is never claimed")
def _no_lost_claim_takeover(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import outbox

    replace_sql(
        mp,
        outbox,
        "claim",
        "AND o.delivery_id <> ALL(%(exclude)s::uuid[])",
        "AND o.delivery_id <> ALL(%(exclude)s::uuid[]) AND o.claim_token IS NULL",
    )


# -- the verifier's own test (tests/policy_proof/examples.py) ----------------------------------


@weakening("example-stale-sql", "a weakening whose SQL text is no longer in the statement")
def _example_stale_sql(mp: pytest.MonkeyPatch) -> None:
    from queue_server.store import transitions

    replace_sql(mp, transitions, "acquire", "a condition no statement holds", "true")


@weakening("lift-outbox-cap", "watcher-delivery/backpressure max-queued 20 -> a million")
def _lift_outbox_cap(mp: pytest.MonkeyPatch) -> None:
    lift(mp, WD, "backpressure", max_queued=1_000_000)


# -- the plugin -------------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--weaken",
        action="append",
        default=[],
        metavar="NAME",
        help="Apply the named weakening of the runtime (tests.weakenings) for this session.",
    )


_ACTIVE: list[pytest.MonkeyPatch] = []
UNAPPLIABLE = "cannot be applied:"


def pytest_configure(config: pytest.Config) -> None:
    names: list[str] = config.getoption("--weaken")
    unknown = [n for n in names if n not in WEAKENINGS]
    if unknown:
        raise pytest.UsageError(f"unknown weakening(s): {', '.join(unknown)}")
    for name in names:
        mp = pytest.MonkeyPatch()
        try:
            WEAKENINGS[name].apply(mp)
        except Exception as exc:
            mp.undo()
            # The contract verifier reads this line: a weakening that no longer applies to
            # the runtime (its text or its target is gone) is an error, never a "pass".
            raise pytest.UsageError(
                f"weakening {name} {UNAPPLIABLE} {type(exc).__name__}: {exc}"
            ) from exc
        _ACTIVE.append(mp)


def pytest_report_header(config: pytest.Config) -> str | None:
    names: list[str] = config.getoption("--weaken")
    return f"WEAKENED runtime: {', '.join(names)}" if names else None


def pytest_unconfigure(config: pytest.Config) -> None:
    while _ACTIVE:
        _ACTIVE.pop().undo()
