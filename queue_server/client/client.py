"""The httpx SDK: one typed method per route of the queue server's API.

Every effecting call carries an Idempotency-Key: generated once per logical
operation (or passed in) and reused on each retry of that same operation, so a
retry never makes a second effect. Only transient failures are retried:
connection errors, 429 with Retry-After, 503 and a key still in flight.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar
from urllib.parse import quote

import orjson
from pydantic import BaseModel
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_before_delay

from queue_server import __version__
from queue_server.client import errors
from queue_server.client.classes import AV, CM, LW, RO, call_classes
from queue_server.client.durable import Checkpoint, ReceiptRecord, VerificationRun
from queue_server.client.models import (
    AdminKey,
    ApiKey,
    ApiKeyInfo,
    BatchEntry,
    BulkReplay,
    CancelledItems,
    Completion,
    Concurrency,
    DeadLetter,
    DeadLetterDetail,
    DeadLetterPage,
    Heartbeat,
    Item,
    ItemPage,
    Lease,
    LedgerEvent,
    NewItem,
    QueueStatus,
    SpendApproval,
    Status,
    Tenant,
    Verification,
    WhoAmI,
)
from queue_server.client.transport import HttpClient, Response, TransportFailure, connect
from queue_server.policy import OperationClass, ReliabilityPolicy, admit_operation, runtime_policy

M = TypeVar("M", bound=BaseModel)

DEFAULT_URL = "http://127.0.0.1:8080"
URL_ENV = "QUEUE_SERVER_URL"
KEY_ENV = "QUEUE_SERVER_KEY"
TENANT_ENV = "QUEUE_SERVER_TENANT"


def from_environment(
    url: str | None, key: str | None, tenant: str | None
) -> tuple[str, str | None, str | None]:
    """Arguments win; else QUEUE_SERVER_URL, QUEUE_SERVER_KEY and QUEUE_SERVER_TENANT."""
    return (
        (url or os.environ.get(URL_ENV) or DEFAULT_URL).rstrip("/"),
        key or os.environ.get(KEY_ENV) or None,
        tenant or os.environ.get(TENANT_ENV) or None,
    )


def new_idempotency_key() -> str:
    return f"qs-{uuid.uuid4().hex}"


def is_transient(exc: BaseException) -> bool:
    """Failures worth retrying with the same request and key."""
    if isinstance(exc, TransportFailure):
        return True
    if isinstance(exc, errors.ProblemError):
        if exc.status == 503 or isinstance(exc, errors.IdempotencyKeyInFlightError):
            return True
        return exc.status == 429 and exc.retry_after is not None
    return False


def item_filter(
    queue: str | None,
    state: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    payload: Any,
) -> dict[str, Any]:
    """The items filter as `POST .../items:cancel` takes it (only the fields given)."""
    match: dict[str, Any] = {"queue": queue, "state": state}
    match["created_after"] = created_after.isoformat() if created_after else None
    match["created_before"] = created_before.isoformat() if created_before else None
    match = {k: v for k, v in match.items() if v is not None}
    if payload is not None:
        match["payload"] = payload
    return match


def item_query(
    queue: str | None,
    state: str | None,
    created_after: datetime | None,
    created_before: datetime | None,
    payload: Any,
) -> dict[str, Any]:
    """The items filter as `GET .../items` takes it: the payload as a JSON string."""
    query = item_filter(queue, state, created_after, created_before, None)
    if payload is not None:
        query["payload"] = orjson.dumps(payload).decode()
    return query


class QueueClient:
    """A client of one queue server, bound to the key's tenant unless told another.

    `url`, `key` and `tenant` default to QUEUE_SERVER_URL, QUEUE_SERVER_KEY and
    QUEUE_SERVER_TENANT; without a tenant, the first call that needs one asks the
    server whose key this is (an admin key must name a tenant).

    Example::

        with QueueClient("http://127.0.0.1:8080", key) as qs:
            item = qs.enqueue("emails", {"to": "a@example.com"})
    """

    def __init__(
        self,
        url: str | None = None,
        key: str | None = None,
        *,
        tenant: str | None = None,
        timeout: float | None = None,
        attempts: int | None = None,
        max_wait: float | None = None,
        policy: ReliabilityPolicy | None = None,
        http: HttpClient | None = None,
    ) -> None:
        self.url, key, self.tenant = from_environment(url, key, tenant)
        self._tenant_lock = threading.Lock()
        # Every call is classified; its class's cells (from the loaded policy) give its
        # timeout and retries; `timeout`, `attempts` and `max_wait` may only lower them.
        self.reliability_policy = policy or runtime_policy()
        self.calls = call_classes(
            self.reliability_policy, attempts=attempts, timeout=timeout, max_wait=max_wait
        )
        headers = {"User-Agent": f"queue-server-client/{__version__}"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._owns_http = http is None
        self._http = http or connect(self.url, timeout=30.0)
        self._http.headers.update(headers)

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    # -- plumbing ------------------------------------------------------------

    def _tenant(self, tenant: str | None) -> str:
        chosen = tenant or self.tenant
        if chosen:
            return chosen
        with self._tenant_lock:
            if not self.tenant:
                self.tenant = own_tenant(self.whoami())
            return self.tenant

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
        operation: OperationClass = RO,
        long_poll: float = 0.0,
    ) -> Response:
        """One logical request of class `operation` (reads by default): each attempt within the
        class's attempt timeout (plus `long_poll`), retried only as the class allows and
        always with the same key; errors raised."""
        call = self.calls[operation]
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        query = {k: v for k, v in (params or {}).items() if v is not None}
        retrying = Retrying(
            retry=retry_if_exception(call.retries),
            stop=stop_after_attempt(call.attempts) | stop_before_delay(call.deadline),
            wait=call.wait,
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    response = self._http.request(
                        method,
                        path,
                        json=json,
                        params=query or None,
                        headers=headers,
                        timeout=call.attempt_timeout + long_poll,
                    )
                    if response.status_code >= 400:
                        raise errors.from_response(response)
        except TransportFailure as exc:
            raise errors.ConnectionFailedError(self.url, exc) from exc
        return response

    def _get(self, model: type[M], path: str, **params: Any) -> M:
        return model.model_validate_json(self.request("GET", path, params=params).content)

    def _effect(
        self,
        model: type[M],
        method: str,
        path: str,
        body: Any,
        key: str | None,
        operation: OperationClass = CM,
    ) -> M:
        response = self.request(
            method,
            path,
            json=body,
            idempotency_key=key or new_idempotency_key(),
            operation=operation,
        )
        return model.model_validate_json(response.content)

    def _admit(self, item_id: str, fence: int, key: str) -> None:
        """Leased work is admitted before dispatch: its key, its item and its current fence."""
        admit_operation(
            LW,
            idempotency_key=key,
            outcome_ref=item_id,
            fence=fence,
            policy=self.reliability_policy,
        )

    # -- service -------------------------------------------------------------

    def whoami(self) -> WhoAmI:
        return self._get(WhoAmI, "/v1/whoami")

    # -- tenants and keys ----------------------------------------------------

    def put_tenant(
        self,
        tenant: str,
        *,
        backlog_cap: int,
        default_max_acquisitions: int = 5,
        default_lease_ttl: float = 30.0,
        retention: float | None = None,
    ) -> Tenant:
        """Create the tenant or replace its settings; `retention` in seconds (default 7 days)."""
        body: dict[str, Any] = {
            "backlog_cap": backlog_cap,
            "default_max_acquisitions": default_max_acquisitions,
            "default_lease_ttl": default_lease_ttl,
        }
        if retention is not None:
            body["retention"] = retention
        response = self.request("PUT", f"/v1/tenants/{tenant}", json=body, operation=CM)
        return Tenant.model_validate_json(response.content)

    def get_tenant(self, tenant: str | None = None) -> Tenant:
        return self._get(Tenant, f"/v1/tenants/{self._tenant(tenant)}")

    def create_key(self, role: Literal["worker", "operator"], tenant: str | None = None) -> ApiKey:
        response = self.request(
            "POST", f"/v1/tenants/{self._tenant(tenant)}/keys", json={"role": role}, operation=CM
        )
        return ApiKey.model_validate_json(response.content)

    def list_tenants(self) -> list[Tenant]:
        """Every tenant, by name (admin)."""
        found: list[Tenant] = []
        cursor: str | None = None
        while True:
            params = {"limit": 500, **({"cursor": cursor} if cursor else {})}
            page = self.request("GET", "/v1/tenants", params=params).json()
            found += [Tenant.model_validate(t) for t in page["tenants"]]
            cursor = page["next_cursor"]
            if not cursor:
                return found

    def list_keys(self, tenant: str | None = None, *, revoked: bool = False) -> list[ApiKeyInfo]:
        """The tenant's keys, oldest first (admin); revoked ones too with `revoked=True`."""
        response = self.request(
            "GET",
            f"/v1/tenants/{self._tenant(tenant)}/keys",
            params={"revoked": "true"} if revoked else None,
        )
        return [ApiKeyInfo.model_validate(k) for k in response.json()["keys"]]

    def revoke_key(self, key_id: str, tenant: str | None = None) -> None:
        self.request("DELETE", f"/v1/tenants/{self._tenant(tenant)}/keys/{key_id}", operation=CM)

    def create_admin_key(self) -> AdminKey:
        """Another admin key (admin); the secret is shown once."""
        return AdminKey.model_validate_json(self.request("POST", "/v1/admin-keys").content)

    def revoke_admin_key(self, key_id: str) -> None:
        """Revoke an admin key at once (admin); the last active one cannot be."""
        self.request("DELETE", f"/v1/admin-keys/{key_id}")

    # -- work items ----------------------------------------------------------

    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int = 0,
        delay: float = 0,
        max_acquisitions: int | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Item:
        body = NewItem(
            payload=payload, priority=priority, delay=delay, max_acquisitions=max_acquisitions
        ).model_dump(exclude_none=True)
        body.setdefault("payload", None)
        path = f"/v1/tenants/{self._tenant(tenant)}/queues/{queue}/items"
        return self._effect(Item, "POST", path, body, idempotency_key)

    def enqueue_batch(
        self,
        queue: str,
        items: Sequence[NewItem],
        *,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> list[Item]:
        """Enqueue 1 to 500 items at once, all or nothing against the backlog cap."""
        body = {"items": [_item_body(item) for item in items]}
        path = f"/v1/tenants/{self._tenant(tenant)}/queues/{queue}/items:batch"
        return self._effect(_Batch, "POST", path, body, idempotency_key).items

    def get_item(self, item_id: str, tenant: str | None = None) -> Item:
        return self._get(Item, f"/v1/tenants/{self._tenant(tenant)}/items/{item_id}")

    def ledger(self, item_id: str, tenant: str | None = None) -> list[LedgerEvent]:
        path = f"/v1/tenants/{self._tenant(tenant)}/items/{item_id}/ledger"
        return self._get(_Ledger, path).events

    # -- leases --------------------------------------------------------------

    def acquire(
        self,
        queue: str,
        *,
        worker: str,
        lease_ttl: float | None = None,
        max_items: int = 1,
        wait: float = 0,
        tenant: str | None = None,
    ) -> list[Lease]:
        """Lease up to `max_items` due items, long-polling up to `wait` seconds."""
        body: dict[str, Any] = {"worker": worker, "max_items": max_items, "wait": wait}
        if lease_ttl is not None:
            body["lease_ttl"] = lease_ttl
        response = self.request(
            "POST",
            f"/v1/tenants/{self._tenant(tenant)}/queues/{queue}/leases",
            json=body,
            operation=LW,
            long_poll=wait,
        )
        return _Leases.model_validate_json(response.content).leases

    def heartbeat(
        self,
        item_id: str,
        *,
        worker: str,
        fence: int,
        lease_ttl: float | None = None,
        tenant: str | None = None,
    ) -> Heartbeat:
        body: dict[str, Any] = {"worker": worker, "fence": fence}
        if lease_ttl is not None:
            body["lease_ttl"] = lease_ttl
        self._admit(item_id, fence, f"heartbeat:{item_id}:{fence}")
        path = f"/v1/tenants/{self._tenant(tenant)}/items/{item_id}/heartbeat"
        response = self.request("POST", path, json=body, operation=LW)
        return Heartbeat.model_validate_json(response.content)

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
        body = {"worker": worker, "fence": fence, "result": result}
        key = idempotency_key or new_idempotency_key()
        self._admit(item_id, fence, key)
        path = f"/v1/tenants/{self._tenant(tenant)}/items/{item_id}/complete"
        return self._effect(Item, "POST", path, body, key, LW)

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
        body: dict[str, Any] = {"worker": worker, "fence": fence, "reason": reason}
        if delay:
            body["delay"] = delay
        key = idempotency_key or new_idempotency_key()
        self._admit(item_id, fence, key)
        path = f"/v1/tenants/{self._tenant(tenant)}/items/{item_id}/requeue"
        return self._effect(Item, "POST", path, body, key, LW)

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
        body = {
            "worker": worker,
            "fence": fence,
            "failure": {"class": failure_class, "message": message, "transient": transient},
            "decision": decision,
        }
        if delay:
            body["delay"] = delay
        key = idempotency_key or new_idempotency_key()
        self._admit(item_id, fence, key)
        path = f"/v1/tenants/{self._tenant(tenant)}/items/{item_id}/triage"
        return self._effect(Item, "POST", path, body, key, LW)

    def heartbeat_many(
        self,
        leases: Sequence[tuple[str, int]],
        *,
        worker: str,
        lease_ttl: float | None = None,
        tenant: str | None = None,
    ) -> list[BatchEntry]:
        """Extend up to 500 leases of one worker in one request; one answer per (item, fence)."""
        body: dict[str, Any] = {
            "worker": worker,
            "leases": [{"item_id": item_id, "fence": fence} for item_id, fence in leases],
        }
        if lease_ttl is not None:
            body["lease_ttl"] = lease_ttl
        path = f"/v1/tenants/{self._tenant(tenant)}/leases:heartbeat"
        response = self.request("POST", path, json=body)
        return _Entries.model_validate_json(response.content).results

    def complete_many(
        self,
        completions: Sequence[Completion],
        *,
        worker: str,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> list[BatchEntry]:
        """Complete up to 500 items of one worker in one request, each under its own fence.

        One answer per entry, in order: the item, or the problem a single complete
        would have answered. Without `idempotency_key`, the batch's key is derived
        from its entries' own keys, so the same entries always make the same request.
        """
        body = {
            "worker": worker,
            "completions": [
                {"item_id": c.item_id, "fence": c.fence, "result": c.result} for c in completions
            ],
        }
        # Every entry is admitted on its own: its key, its item and its current fence.
        for c in completions:
            self._admit(c.item_id, c.fence, c.idempotency_key)
        key = idempotency_key or batch_key([c.idempotency_key for c in completions])
        path = f"/v1/tenants/{self._tenant(tenant)}/completions"
        return (self._effect(_Entries, "POST", path, body, key, LW)).results

    # -- spend approvals -----------------------------------------------------

    def approve_spend(
        self,
        queue: str,
        *,
        approved_by: str,
        max_concurrency: int,
        expires_at: datetime,
        reason: str,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> SpendApproval:
        body = {
            "approved_by": approved_by,
            "max_concurrency": max_concurrency,
            "expires_at": expires_at.isoformat(),
            "reason": reason,
        }
        path = f"/v1/tenants/{self._tenant(tenant)}/queues/{queue}/spend-approvals"
        return self._effect(SpendApproval, "POST", path, body, idempotency_key)

    def concurrency(self, queue: str, tenant: str | None = None) -> Concurrency:
        return self._get(
            Concurrency, f"/v1/tenants/{self._tenant(tenant)}/queues/{queue}/concurrency"
        )

    # -- operators -----------------------------------------------------------

    def status(self, tenant: str | None = None) -> Status:
        return self._get(Status, f"/v1/tenants/{self._tenant(tenant)}/queues")

    def list_items(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        payload: Any = None,
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> ItemPage:
        """One page of items, oldest first; `payload` is a document the payload must contain."""
        query = item_query(queue, state, created_after, created_before, payload)
        return self._get(
            ItemPage,
            f"/v1/tenants/{self._tenant(tenant)}/items",
            **query,
            limit=limit,
            cursor=cursor,
        )

    def iter_items(
        self, *, page_size: int = 200, tenant: str | None = None, **filters: Any
    ) -> Iterator[Item]:
        """Every matching item, oldest first, page by page (filters as `list_items`)."""
        cursor: str | None = None
        while True:
            page = self.list_items(limit=page_size, cursor=cursor, tenant=tenant, **filters)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def cancel_item(
        self,
        item_id: str,
        *,
        reason: str = "",
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Item:
        """Cancel a ready, leased or quarantined item (its holder is refused from then on)."""
        path = f"/v1/tenants/{self._tenant(tenant)}/items/{item_id}/cancel"
        return self._effect(Item, "POST", path, {"reason": reason}, idempotency_key)

    def cancel_items(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        payload: Any = None,
        reason: str = "",
        limit: int = 100,
        cursor: str | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> CancelledItems:
        """Cancel the cancellable items of one page of the filter; resume with `next_cursor`."""
        match = item_filter(queue, state, created_after, created_before, payload)
        body: dict[str, Any] = {"filter": match, "reason": reason, "limit": limit}
        if cursor is not None:
            body["cursor"] = cursor
        path = f"/v1/tenants/{self._tenant(tenant)}/items:cancel"
        return self._effect(CancelledItems, "POST", path, body, idempotency_key)

    def pause_queue(
        self,
        queue: str,
        *,
        reason: str = "",
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> QueueStatus:
        """Stop handing out leases of the queue; enqueues are still admitted."""
        path = f"/v1/tenants/{self._tenant(tenant)}/queues/{queue}/pause"
        return self._effect(QueueStatus, "POST", path, {"reason": reason}, idempotency_key)

    def resume_queue(
        self,
        queue: str,
        *,
        reason: str = "",
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> QueueStatus:
        """Hand out leases of the queue again."""
        path = f"/v1/tenants/{self._tenant(tenant)}/queues/{queue}/resume"
        return self._effect(QueueStatus, "POST", path, {"reason": reason}, idempotency_key)

    def list_dead_letters(
        self,
        *,
        queue: str | None = None,
        kind: Literal["item", "delivery"] | None = None,
        status: Literal["open", "closed", "all"] = "open",
        limit: int = 50,
        cursor: str | None = None,
        tenant: str | None = None,
    ) -> DeadLetterPage:
        return self._get(
            DeadLetterPage,
            f"/v1/tenants/{self._tenant(tenant)}/dead-letters",
            queue=queue,
            kind=kind,
            status=status,
            limit=limit,
            cursor=cursor,
        )

    def iter_dead_letters(
        self,
        *,
        queue: str | None = None,
        kind: Literal["item", "delivery"] | None = None,
        status: Literal["open", "closed", "all"] = "open",
        page_size: int = 200,
        tenant: str | None = None,
    ) -> Iterator[DeadLetter]:
        """Every matching dead letter, oldest first, page by page."""
        cursor: str | None = None
        while True:
            page = self.list_dead_letters(
                queue=queue, kind=kind, status=status, limit=page_size, cursor=cursor, tenant=tenant
            )
            yield from page.dead_letters
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def show_dead_letter(self, dead_letter_id: str, tenant: str | None = None) -> DeadLetterDetail:
        path = f"/v1/tenants/{self._tenant(tenant)}/dead-letters/{dead_letter_id}"
        return self._get(DeadLetterDetail, path)

    def replay(
        self,
        dead_letter_id: str,
        *,
        max_acquisitions: int | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Item:
        body = {"max_acquisitions": max_acquisitions} if max_acquisitions is not None else {}
        path = f"/v1/tenants/{self._tenant(tenant)}/dead-letters/{dead_letter_id}/replay"
        return self._effect(Item, "POST", path, body, idempotency_key)

    def discard(
        self,
        dead_letter_id: str,
        *,
        reason: str = "",
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> Item:
        path = f"/v1/tenants/{self._tenant(tenant)}/dead-letters/{dead_letter_id}/discard"
        return self._effect(Item, "POST", path, {"reason": reason}, idempotency_key)

    def replay_queue(
        self,
        queue: str,
        *,
        limit: int = 100,
        max_acquisitions: int | None = None,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> BulkReplay:
        """Replay up to `limit` (at most 100) of the queue's oldest open item dead letters."""
        body: dict[str, Any] = {"limit": limit}
        if max_acquisitions is not None:
            body["max_acquisitions"] = max_acquisitions
        path = f"/v1/tenants/{self._tenant(tenant)}/queues/{queue}/dead-letters:replay"
        return self._effect(BulkReplay, "POST", path, body, idempotency_key)

    def verify_ledgers(
        self,
        *,
        tenant: str | None = None,
        all_tenants: bool = False,
        limit: int = 500,
        cursor: str | None = None,
    ) -> Verification:
        """One page of ledger verification: of a tenant, or of every tenant (admin)."""
        path = (
            "/v1/ledger-verification"
            if all_tenants
            else f"/v1/tenants/{self._tenant(tenant)}/ledger-verification"
        )
        return self._get(Verification, path, limit=limit, cursor=cursor)

    # -- reliability: policy, confirmation receipts, verification runs -----------

    def policy(self) -> dict[str, Any]:
        """The server's `operation-reliability.v2` document (GET /v1/policy)."""
        document: dict[str, Any] = self.request("GET", "/v1/policy").json()
        return document

    def claim_receipt(
        self,
        idempotency_key: str,
        outcome_ref: str,
        *,
        claim_token: str | None = None,
        tenant: str | None = None,
    ) -> tuple[ReceiptRecord, bool]:
        """Claim a confirmed mutation's one-shot receipt; True when this call holds the grant.

        A transient failure is retried with the same `claim_token`, so a claim whose
        answer was lost is granted again rather than mistaken for someone else's.
        """
        body = {
            "idempotency_key": idempotency_key,
            "outcome_ref": outcome_ref,
            "claim_token": claim_token or new_idempotency_key(),
        }
        response = self.request(
            "POST", f"/v1/tenants/{self._tenant(tenant)}/receipts", json=body, operation=CM
        )
        return ReceiptRecord.model_validate_json(response.content), response.status_code == 201

    def settle_receipt(
        self,
        outcome_ref: str,
        status: Literal["succeeded", "failed"],
        outcome: Any,
        *,
        tenant: str | None = None,
    ) -> ReceiptRecord:
        """Settle a pending receipt once; the same settlement again is a no-op."""
        path = f"/v1/tenants/{self._tenant(tenant)}/receipts/{outcome_ref}"
        body = {"status": status, "outcome": outcome}
        return ReceiptRecord.model_validate_json(
            self.request("PUT", path, json=body, operation=CM).content
        )

    def get_receipt(self, outcome_ref: str, *, tenant: str | None = None) -> ReceiptRecord:
        return self._get(
            ReceiptRecord, f"/v1/tenants/{self._tenant(tenant)}/receipts/{outcome_ref}"
        )

    def pending_receipts(
        self, *, older_than: float | None = None, limit: int = 100, tenant: str | None = None
    ) -> list[ReceiptRecord]:
        """Pending receipts claimed at least `older_than` seconds ago (default: the
        confirmed-mutation deadline: the stale ones), oldest first (operator)."""
        params: dict[str, Any] = {"state": "pending", "limit": limit}
        if older_than is not None:
            params["older_than"] = older_than
        path = f"/v1/tenants/{self._tenant(tenant)}/receipts"
        page = self.request("GET", path, params=params).json()
        return [ReceiptRecord.model_validate(r) for r in page["receipts"]]

    def resolve_receipt(
        self,
        outcome_ref: str,
        status: Literal["succeeded", "failed"],
        outcome: Any,
        *,
        reason: str,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> ReceiptRecord:
        """Settle a stale pending receipt as an operator, with what happened and why."""
        path = f"/v1/tenants/{self._tenant(tenant)}/receipts/{outcome_ref}:resolve"
        body = {"status": status, "outcome": outcome, "reason": reason}
        return self._effect(ReceiptRecord, "POST", path, body, idempotency_key)

    def start_verification_run(
        self,
        artifact_version: str,
        verifier_version: str,
        items: Sequence[str],
        *,
        tenant: str | None = None,
    ) -> VerificationRun:
        """Start (or, for the same pair, find again) the run of an artifact and verifier version."""
        body = {
            "artifact_version": artifact_version,
            "verifier_version": verifier_version,
            "items": list(items),
        }
        path = f"/v1/tenants/{self._tenant(tenant)}/verification-runs"
        return VerificationRun.model_validate_json(
            self.request("POST", path, json=body, operation=AV).content
        )

    def get_verification_run(self, run_id: str, *, tenant: str | None = None) -> VerificationRun:
        path = f"/v1/tenants/{self._tenant(tenant)}/verification-runs/{run_id}"
        return self._get(VerificationRun, path)

    def abandon_verification_run(
        self,
        run_id: str,
        *,
        reason: str,
        idempotency_key: str | None = None,
        tenant: str | None = None,
    ) -> VerificationRun:
        """End a running run as abandoned (operator); who and why are recorded."""
        path = f"/v1/tenants/{self._tenant(tenant)}/verification-runs/{run_id}:abandon"
        return self._effect(VerificationRun, "POST", path, {"reason": reason}, idempotency_key)

    def checkpoint(
        self, run_id: str, item: str, result: Any, *, tenant: str | None = None
    ) -> Checkpoint:
        """Record one item's result; the same result again is a no-op, another is refused."""
        path = (
            f"/v1/tenants/{self._tenant(tenant)}/verification-runs/{run_id}"
            f"/checkpoints/{quote(item, safe='/')}"
        )
        return Checkpoint.model_validate_json(
            self.request("PUT", path, json={"result": result}, operation=AV).content
        )

    def complete_verification_run(
        self, run_id: str, *, tenant: str | None = None
    ) -> VerificationRun:
        """Write the terminal run-complete marker; refused until every item is checkpointed."""
        path = f"/v1/tenants/{self._tenant(tenant)}/verification-runs/{run_id}/complete"
        return VerificationRun.model_validate_json(self.request("PUT", path, operation=AV).content)


def own_tenant(me: WhoAmI) -> str:
    """The tenant of the key that asked; an admin key has none."""
    if not me.tenant:
        raise errors.NoTenantError()
    return me.tenant


def batch_key(keys: Sequence[str]) -> str:
    """One key for a batch, from its entries' own keys: the same entries, the same key."""
    digest = hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()
    return f"qs-batch-{digest[:48]}"


def _item_body(item: NewItem) -> dict[str, Any]:
    body = item.model_dump(exclude_none=True)
    body.setdefault("payload", None)
    return body


class _Batch(BaseModel):
    items: list[Item]


class _Ledger(BaseModel):
    events: list[LedgerEvent]


class _Leases(BaseModel):
    leases: list[Lease]


class _Entries(BaseModel):
    results: list[BatchEntry]
