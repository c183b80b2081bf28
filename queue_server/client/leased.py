"""The leased-work worker, admitted as `durable-leased-work` before every holder operation.

Policy ADR Decisions 3, 5 and 7: leased work presents its current fence with an
idempotency key and outcome reference (the item) before dispatch, and has no
automatic retry loop: a failed item goes back through the queue, whose next
acquire advances the fence and the acquisition count. `LeasedWorkClient` calls
`admit_operation` before each heartbeat, complete, requeue and triage and sends
each request once (the class allows one attempt); `AdmittedWorker` is the SDK's
`Worker` on that client, at the class's local concurrency of one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from queue_server.client.client import QueueClient, new_idempotency_key
from queue_server.client.models import BatchEntry, Completion, Heartbeat, Item
from queue_server.client.worker import Handler, Worker
from queue_server.policy import Admission, OperationClass, ReliabilityPolicy, admit_operation

LW = OperationClass.DURABLE_LEASED_WORK


class LeasedWorkClient(QueueClient):
    """A `QueueClient` whose holder operations are admitted as leased work and never retried."""

    def __init__(
        self,
        url: str,
        key: str | None = None,
        *,
        tenant: str | None = None,
        timeout: float = 30.0,
        policy: ReliabilityPolicy | None = None,
    ) -> None:
        self.reliability_policy = policy
        # The class's retry cell is queue re-acquisition: one attempt per request here.
        attempts = admit_operation(
            LW, idempotency_key="-", outcome_ref="-", fence=1, policy=policy
        ).max_attempts
        super().__init__(url, key, tenant=tenant, timeout=timeout, attempts=attempts)

    def admit(self, item_id: str, fence: int | None, idempotency_key: str) -> Admission:
        """Refuse before dispatch unless the operation carries its key, item and current fence."""
        return admit_operation(
            LW,
            idempotency_key=idempotency_key,
            outcome_ref=item_id,
            fence=fence,
            policy=self.reliability_policy,
        )

    def heartbeat(
        self,
        item_id: str,
        *,
        worker: str,
        fence: int,
        lease_ttl: float | None = None,
        tenant: str | None = None,
    ) -> Heartbeat:
        self.admit(item_id, fence, f"heartbeat:{item_id}:{fence}")
        return super().heartbeat(
            item_id, worker=worker, fence=fence, lease_ttl=lease_ttl, tenant=tenant
        )

    def complete(
        self,
        item_id: str,
        *,
        worker: str,
        fence: int,
        result: Any = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Item:
        key = idempotency_key or new_idempotency_key()
        self.admit(item_id, fence, key)
        return super().complete(
            item_id, worker=worker, fence=fence, result=result, idempotency_key=key, tenant=tenant
        )

    def requeue(
        self,
        item_id: str,
        *,
        worker: str,
        fence: int,
        reason: str = "",
        delay: float = 0.0,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Item:
        key = idempotency_key or new_idempotency_key()
        self.admit(item_id, fence, key)
        return super().requeue(
            item_id,
            worker=worker,
            fence=fence,
            reason=reason,
            delay=delay,
            idempotency_key=key,
            tenant=tenant,
        )

    def triage(
        self,
        item_id: str,
        *,
        worker: str,
        fence: int,
        failure_class: str,
        message: str = "",
        transient: bool = False,
        decision: Literal["requeue", "quarantine"] = "requeue",
        delay: float = 0.0,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Item:
        key = idempotency_key or new_idempotency_key()
        self.admit(item_id, fence, key)
        return super().triage(
            item_id,
            worker=worker,
            fence=fence,
            failure_class=failure_class,
            message=message,
            transient=transient,
            decision=decision,
            delay=delay,
            idempotency_key=key,
            tenant=tenant,
        )

    def heartbeat_many(
        self,
        leases: Sequence[tuple[str, int]],
        *,
        worker: str,
        lease_ttl: float | None = None,
        tenant: str | None = None,
    ) -> list[BatchEntry]:
        for item_id, fence in leases:
            self.admit(item_id, fence, f"heartbeat:{item_id}:{fence}")
        return super().heartbeat_many(leases, worker=worker, lease_ttl=lease_ttl, tenant=tenant)

    def complete_many(
        self,
        completions: Sequence[Completion],
        *,
        worker: str,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> list[BatchEntry]:
        # Every entry is admitted on its own: its key, its item and its current fence.
        for entry in completions:
            self.admit(entry.item_id, entry.fence, entry.idempotency_key)
        return super().complete_many(
            completions, worker=worker, idempotency_key=idempotency_key, tenant=tenant
        )


class AdmittedWorker(Worker):
    """The SDK worker admitted as `durable-leased-work`: concurrency one, fenced, no retry loop."""

    def __init__(
        self,
        client: LeasedWorkClient,
        queue: str,
        handler: Handler,
        *,
        concurrency: int = 1,
        **options: Any,
    ) -> None:
        # Local leased work runs at the class's concurrency (one); more is refused here.
        admit_operation(
            LW,
            idempotency_key="-",
            outcome_ref="-",
            fence=1,
            concurrency=concurrency,
            policy=client.reliability_policy,
        )
        super().__init__(client, queue, handler, concurrency=concurrency, **options)
