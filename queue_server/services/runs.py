"""Artifact verification runs: one run per (artifact version, verifier version), idempotent
per-item checkpoints, and a terminal run-complete marker after every declared item.

Decisions 5 and 7 of docs/decisions/operation-class-policy.md: the run key (artifact version
plus verifier version) is the run's exclusive grant, so the same pair always names the same
run; a tenant runs at most one verification at a time (concurrency one, rejected at
capacity); a checkpoint is recorded once and replays; the marker is refused while any
declared item lacks a checkpoint. A restarted verifier reads the run back and resumes from
its checkpoints.

The policy's artifact-verification deadline bounds a run from its start: past
it, the run ends `failed` (deadline-exceeded) at its next checkpoint or complete,
when the tenant starts another run, or by the server's sweeper. An operator may
abandon a running run (who and why are recorded). A failed or abandoned run
holds nothing: the tenant's next run starts, and the same key starts anew,
carrying the ended run's checkpoints over.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.models import Role, is_uuid, uuid7
from queue_server.policy import (
    AdmissionRefused,
    OperationClass,
    ReliabilityPolicy,
    admit_operation,
    run_key,
)
from queue_server.services.common import WORKER_OR_OPERATOR, require_tenant
from queue_server.store import verification_runs
from queue_server.store.types import Conn, Row


class VerificationRuns:
    """Start, read, checkpoint, complete and abandon artifact verification runs."""

    def __init__(self, db: Database, effects: Effects, policy: ReliabilityPolicy) -> None:
        self.db = db
        self.effects = effects
        self.deadline = timedelta(seconds=policy.verification.deadline)

    @staticmethod
    async def _run(conn: Conn, tenant: str, run_id: str, *, lock: bool = False) -> Row:
        row = None
        if is_uuid(run_id):
            row = await verification_runs.get(conn, tenant=tenant, run_id=run_id, lock=lock)
        if row is None:
            raise errors.VerificationRunNotFoundError(run_id=run_id)
        return row

    async def _answer(self, conn: Conn, status: int, row: Row, *, replayed: bool = False) -> Answer:
        done = await verification_runs.checkpoints(
            conn, tenant=row["tenant_id"], run_id=str(row["run_id"])
        )
        return Answer.of(status, views.verification_run(row, done), replayed=replayed)

    async def start(
        self,
        principal: auth.Principal,
        tenant: str,
        *,
        artifact_version: str,
        verifier_version: str,
        items: list[str],
    ) -> Answer:
        """(none) -> running, 201; the same run key again: that run, 200; another running: 409."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        key = run_key(artifact_version, verifier_version)
        try:
            admit_operation(
                OperationClass.ARTIFACT_VERIFICATION, idempotency_key=key, outcome_ref=key
            )
        except AdmissionRefused as refused:
            raise errors.AdmissionRefusedError(refused.detail, **refused.extensions) from None
        declared = list(dict.fromkeys(items))
        async with self.db.tx() as conn:
            await require_tenant(conn, tenant)
            # A running run past its deadline fails here rather than blocking this one.
            await verification_runs.fail_overdue(conn, tenant=tenant)
            row = await verification_runs.start(
                conn,
                tenant=tenant,
                run_id=uuid7(),
                artifact=artifact_version,
                verifier=verifier_version,
                items=declared,
                deadline=self.deadline,
            )
            if row is not None:
                return await self._answer(conn, 201, row)
            existing = await verification_runs.by_key(
                conn, tenant=tenant, artifact=artifact_version, verifier=verifier_version
            )
            if existing is not None:
                if existing["items"] != declared:
                    raise errors.RunKeyConflictError(run_id=str(existing["run_id"]), run_key=key)
                return await self._answer(conn, 200, existing, replayed=True)
            busy = await verification_runs.running(conn, tenant=tenant)
        raise errors.VerificationRunBusyError(running_run_id=str(busy["run_id"]) if busy else None)

    async def list_runs(
        self, principal: auth.Principal, tenant: str, *, limit: int, cursor: str | None
    ) -> Answer:
        """Runs newest first, without their item lists: counts of declared and checkpointed items."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        if cursor is not None and not is_uuid(cursor):
            raise errors.InvalidRequestError("The cursor is not one this server issued.")
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await verification_runs.list_page(
                conn, tenant=tenant, before=cursor, limit=limit + 1
            )
        next_cursor = None
        if len(rows) > limit:
            rows = rows[:limit]
            next_cursor = str(rows[-1]["run_id"])
        runs = [views.verification_run_summary(r) for r in rows]
        return Answer.of(200, {"runs": runs, "next_cursor": next_cursor})

    async def get(self, principal: auth.Principal, tenant: str, run_id: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            row = await self._run(conn, tenant, run_id)
            return await self._answer(conn, 200, row)

    async def checkpoint(
        self, principal: auth.Principal, tenant: str, run_id: str, item: str, *, result: Any
    ) -> Answer:
        """Record the item's result once, 201; the same result again, 200; another result, 409."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        await self._end_if_overdue(tenant, run_id)
        async with self.db.tx() as conn:
            await require_tenant(conn, tenant)
            run = await self._run(conn, tenant, run_id, lock=True)
            _refuse_ended(run)
            if item not in run["items"]:
                raise errors.ItemNotDeclaredError(run_id=run_id, item=item)
            row = await verification_runs.record(
                conn, tenant=tenant, run_id=run_id, item=item, result=result
            )
            replayed = row is None
            if row is None:
                row = await verification_runs.checkpoint(
                    conn, tenant=tenant, run_id=run_id, item=item
                )
                assert row is not None, "a refused checkpoint insert means one exists"
                if row["result"] != result:
                    raise errors.CheckpointConflictError(run_id=run_id, item=item)
        return Answer.of(200 if replayed else 201, views.checkpoint(row), replayed=replayed)

    async def complete(self, principal: auth.Principal, tenant: str, run_id: str) -> Answer:
        """running -> complete once every declared item is checkpointed; complete again: 200."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        await self._end_if_overdue(tenant, run_id)
        async with self.db.tx() as conn:
            await require_tenant(conn, tenant)
            run = await self._run(conn, tenant, run_id)
            _refuse_ended(run)
            row = await verification_runs.complete(conn, tenant=tenant, run_id=run_id)
            if row is not None:
                return await self._answer(conn, 200, row)
            if run["state"] == "complete":
                return await self._answer(conn, 200, run, replayed=True)
            done = {
                c["item"]
                for c in await verification_runs.checkpoints(conn, tenant=tenant, run_id=run_id)
            }
        missing = [i for i in run["items"] if i not in done]
        raise errors.VerificationIncompleteError(
            f"{len(missing)} declared item(s) have no checkpoint yet.",
            run_id=run_id,
            missing=missing[:100],
        )

    async def _end_if_overdue(self, tenant: str, run_id: str) -> None:
        """The deadline at a checkpoint boundary: a running run past it fails, committed."""
        if not is_uuid(run_id):
            return
        async with self.db.tx() as conn:
            await verification_runs.fail_overdue(conn, tenant=tenant, run_id=run_id)

    async def abandon(
        self,
        principal: auth.Principal,
        tenant: str,
        run_id: str,
        idem: Idempotency,
        *,
        instance: str,
        reason: str,
    ) -> Answer:
        """running -> abandoned by an operator, who and why recorded; 409 if it has ended."""
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            await self._run(conn, tenant, run_id)
            row = await verification_runs.abandon(
                conn, tenant=tenant, run_id=run_id, actor=principal.actor, reason=reason
            )
            if row is None:
                _refuse_ended(await self._run(conn, tenant, run_id))
                raise errors.VerificationRunEndedError(
                    "The run is complete; only a running run is abandoned.",
                    run_id=run_id,
                    state="complete",
                )
            return await self._answer(conn, 200, row)

        return await self.effects.run(tenant, idem, instance, operation)


def _refuse_ended(run: Row) -> None:
    """A failed or abandoned run takes no more checkpoints and no terminal marker."""
    if run["state"] in ("failed", "abandoned"):
        raise errors.VerificationRunEndedError(
            f"The run has ended: {run['state']} ({run['end_reason']}).",
            run_id=str(run["run_id"]),
            state=run["state"],
            reason=run["end_reason"],
        )
