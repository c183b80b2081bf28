"""Artifact verification runs: one run per (artifact version, verifier version), idempotent
per-item checkpoints, and a terminal run-complete marker after every declared item.

Policy ADR Decisions 5 and 7: the run key (artifact version + verifier version)
is the run's exclusive grant, so the same pair always names the same run; a
tenant runs at most one verification at a time (concurrency one, rejected at
capacity); a checkpoint is recorded once and replays; the marker is refused
while any declared item lacks a checkpoint. A restarted verifier reads the run
back and resumes from its checkpoints.
"""

from __future__ import annotations

from typing import Any

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.idempotency import Answer
from queue_server.models import is_uuid, uuid7
from queue_server.policy import OperationClass, admit_operation, run_key
from queue_server.services.common import WORKER_OR_OPERATOR, require_tenant
from queue_server.store import verification_runs
from queue_server.store.types import Conn, Row


class VerificationRuns:
    """Start, read, checkpoint and complete artifact verification runs."""

    def __init__(self, db: Database) -> None:
        self.db = db

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
        admit_operation(OperationClass.ARTIFACT_VERIFICATION, idempotency_key=key, outcome_ref=key)
        declared = list(dict.fromkeys(items))
        async with self.db.tx() as conn:
            await require_tenant(conn, tenant)
            row = await verification_runs.start(
                conn,
                tenant=tenant,
                run_id=uuid7(),
                artifact=artifact_version,
                verifier=verifier_version,
                items=declared,
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
        async with self.db.tx() as conn:
            await require_tenant(conn, tenant)
            run = await self._run(conn, tenant, run_id, lock=True)
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
        async with self.db.tx() as conn:
            await require_tenant(conn, tenant)
            run = await self._run(conn, tenant, run_id)
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
