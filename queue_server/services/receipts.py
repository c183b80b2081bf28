"""Durable receipts of confirmed mutations: claim once, settle once, replay by identity.

Decisions 5-7 of docs/decisions/operation-class-policy.md: a confirmed mutation owns an
independently durable idempotency receipt. Its one-shot claim of (idempotency key, outcome
reference) is the exclusive grant to dispatch; the same identity claimed again returns the
retained receipt (pending, or the settled outcome) instead of a second grant. Receipts live
in PostgreSQL, so they survive a restart of the server and of the client that claimed them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.errors import ReceiptConflictError
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.models import Role
from queue_server.policy import AdmissionRefused, OperationClass, ReliabilityPolicy, admit_operation
from queue_server.services import common
from queue_server.services.common import WORKER_OR_OPERATOR, require_tenant
from queue_server.store import confirmation_receipts
from queue_server.store.types import Conn, Row

Settlement = Literal["succeeded", "failed"]


def _answer(status: int, row: Row, *, replayed: bool = False) -> Answer:
    return Answer.of(status, views.confirmation_receipt(row), replayed=replayed)


class ConfirmationReceipts:
    """Claim, settle and read the receipts of confirmed mutations; list the stale ones and let
    an operator settle them."""

    def __init__(self, db: Database, effects: Effects, policy: ReliabilityPolicy) -> None:
        self.db = db
        self.effects = effects
        # A receipt still pending this long after its claim is stale: its claimant is gone.
        self.stale_after = timedelta(seconds=policy.mutation.deadline)

    async def claim(
        self,
        principal: auth.Principal,
        tenant: str,
        *,
        idempotency_key: str,
        outcome_ref: str,
        claim_token: str | None = None,
    ) -> Answer:
        """(none) -> pending, 201; the same identity again: the retained receipt, 200.

        A repeat carrying the original `claim_token` of a still-pending receipt is the
        same claim retried after its answer was lost: it is granted again (201).
        """
        principal.require(tenant, *WORKER_OR_OPERATOR)
        # The server fails closed on the same rule as every client: no identity, no grant.
        try:
            admit_operation(
                OperationClass.CONFIRMED_MUTATION,
                idempotency_key=idempotency_key,
                outcome_ref=outcome_ref,
            )
        except AdmissionRefused as refused:
            raise errors.AdmissionRefusedError(refused.detail, **refused.extensions) from None
        async with self.db.tx() as conn:
            await require_tenant(conn, tenant)
            row = await confirmation_receipts.claim(
                conn, tenant=tenant, key=idempotency_key, ref=outcome_ref, token=claim_token
            )
            if row is not None:
                return _answer(201, row)
            existing = await confirmation_receipts.get(conn, tenant=tenant, ref=outcome_ref)
            if existing is None:
                existing = await confirmation_receipts.get_by_key(
                    conn, tenant=tenant, key=idempotency_key
                )
                assert existing is not None, "a refused claim conflicts with an existing receipt"
                raise ReceiptConflictError(
                    "This idempotency key already claimed another outcome reference.",
                    outcome_ref=existing["outcome_ref"],
                )
            if existing["idempotency_key"] != idempotency_key:
                raise ReceiptConflictError(
                    "This outcome reference belongs to another idempotency key.",
                    outcome_ref=outcome_ref,
                )
            if (
                claim_token is not None
                and existing["claim_token"] == claim_token
                and existing["status"] == "pending"
            ):
                return _answer(201, existing, replayed=True)
            return _answer(200, existing, replayed=True)

    async def settle(
        self,
        principal: auth.Principal,
        tenant: str,
        outcome_ref: str,
        *,
        status: Settlement,
        outcome: Any,
    ) -> Answer:
        """pending -> succeeded | failed, once; the same settlement again replays; another is 409."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.tx() as conn:
            await require_tenant(conn, tenant)
            row = await confirmation_receipts.settle(
                conn, tenant=tenant, ref=outcome_ref, status=status, outcome=outcome
            )
            if row is not None:
                return _answer(200, row)
            existing = await confirmation_receipts.get(conn, tenant=tenant, ref=outcome_ref)
        if existing is None:
            raise errors.ReceiptNotFoundError(outcome_ref=outcome_ref)
        if (existing["status"], existing["outcome"]) == (status, outcome):
            return _answer(200, existing, replayed=True)
        raise ReceiptConflictError(
            f"The receipt is already settled as {existing['status']}; a receipt settles once.",
            outcome_ref=outcome_ref,
            status=existing["status"],
        )

    async def get(self, principal: auth.Principal, tenant: str, outcome_ref: str) -> Answer:
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            row = await confirmation_receipts.get(conn, tenant=tenant, ref=outcome_ref)
        if row is None:
            raise errors.ReceiptNotFoundError(outcome_ref=outcome_ref)
        return _answer(200, row)

    async def list_pending(
        self,
        principal: auth.Principal,
        tenant: str,
        *,
        older_than: float | None,
        limit: int,
        cursor: str | None,
    ) -> Answer:
        """Pending receipts claimed at least `older_than` seconds ago (default: the class
        deadline), oldest first; each says whether it is past the deadline (`stale`)."""
        principal.require(tenant, Role.OPERATOR)
        after: tuple[datetime, str] | None = None
        if cursor:
            at, ref = common.decode_cursor(cursor, 2)
            try:
                after = (datetime.fromisoformat(at), ref)
            except ValueError:
                raise errors.InvalidRequestError(
                    "The cursor is not one this server issued."
                ) from None
        age = self.stale_after if older_than is None else timedelta(seconds=older_than)
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await confirmation_receipts.list_pending(
                conn,
                tenant=tenant,
                older_than=age,
                stale_after=self.stale_after,
                after=after,
                limit=limit,
            )
        next_cursor = (
            common.encode_cursor([rows[-1]["created_at"].isoformat(), rows[-1]["outcome_ref"]])
            if len(rows) == limit
            else None
        )
        receipts = [{**views.confirmation_receipt(r), "stale": r["stale"]} for r in rows]
        return Answer.of(
            200,
            {
                "receipts": receipts,
                "stale_after": self.stale_after.total_seconds(),
                "next_cursor": next_cursor,
            },
        )

    async def resolve(
        self,
        principal: auth.Principal,
        tenant: str,
        outcome_ref: str,
        idem: Idempotency,
        *,
        instance: str,
        status: Settlement,
        outcome: Any,
        reason: str,
    ) -> Answer:
        """An operator settles a receipt left pending past the class deadline: with what
        happened (succeeded or failed, never cancelled), and why; recorded on the receipt."""
        principal.require(tenant, Role.OPERATOR)

        async def operation(conn: Conn) -> Answer:
            await require_tenant(conn, tenant)
            row = await confirmation_receipts.resolve(
                conn,
                tenant=tenant,
                ref=outcome_ref,
                status=status,
                outcome=outcome,
                actor=principal.actor,
                reason=reason,
                stale_after=self.stale_after,
            )
            if row is not None:
                return _answer(200, row)
            existing = await confirmation_receipts.get(conn, tenant=tenant, ref=outcome_ref)
            if existing is None:
                raise errors.ReceiptNotFoundError(outcome_ref=outcome_ref)
            if existing["status"] != "pending":
                raise ReceiptConflictError(
                    f"The receipt is already settled as {existing['status']};"
                    " a receipt settles once.",
                    outcome_ref=outcome_ref,
                    status=existing["status"],
                )
            raise errors.ReceiptNotStaleError(
                outcome_ref=outcome_ref,
                stale_after=self.stale_after.total_seconds(),
                created_at=existing["created_at"].isoformat(),
            )

        return await self.effects.run(tenant, idem, instance, operation)
