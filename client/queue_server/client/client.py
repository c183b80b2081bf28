"""The httpx SDK: one typed method per route of the queue server's API, blocking.

Each method is a flow of `queue_server.client.core` (where its request is built
and its answer parsed) driven by this face's send: every attempt within the
call's class timeout, retried only as its class allows, always with the same
Idempotency-Key. `AsyncQueueClient` drives the same flows, awaited.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_before_delay

from queue_server.client.connection import (
    HttpClient,
    LeanPool,
    Response,
    TransportFailure,
    connect,
    sdk_request,
)
from queue_server.client.core import (
    DEFAULT_URL,
    KEY_ENV,
    TENANT_ENV,
    URL_ENV,
    Call,
    ClientCore,
    ClientFace,
    Flow,
    Pages,
    answer,
    batch_key,
    face_method,
    from_environment,
    is_transient,
    item_filter,
    item_query,
    new_idempotency_key,
    own_tenant,
    unreachable,
)
from queue_server.policy import ReliabilityPolicy

__all__ = [
    "DEFAULT_URL",
    "KEY_ENV",
    "TENANT_ENV",
    "URL_ENV",
    "QueueClient",
    "batch_key",
    "from_environment",
    "is_transient",
    "item_filter",
    "item_query",
    "new_idempotency_key",
    "own_tenant",
]

P = ParamSpec("P")
T = TypeVar("T")


def blocking(
    flow: Callable[Concatenate[ClientCore, P], Flow[T]],
) -> Callable[Concatenate[QueueClient, P], T]:
    """The flow as a method of `QueueClient`: its calls sent, its result returned."""

    def method(self: QueueClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(flow(self._core, *args, **kwargs))

    face_method(flow, method)
    return method


def blocking_pages(
    flow: Callable[Concatenate[ClientCore, P], Pages[T]],
) -> Callable[Concatenate[QueueClient, P], Iterator[T]]:
    """The listing as a method of `QueueClient`: an iterator that sends each page's call."""

    def method(self: QueueClient, /, *args: P.args, **kwargs: P.kwargs) -> Iterator[T]:
        return self._iterate(flow(self._core, *args, **kwargs))

    face_method(flow, method)
    return method


class QueueClient(ClientFace):
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
        self._core = ClientCore(
            url,
            key,
            tenant=tenant,
            timeout=timeout,
            attempts=attempts,
            max_wait=max_wait,
            policy=policy,
        )
        self._owns_http = http is None
        self._http = http or connect(self._core.url, timeout=30.0)
        self._http.headers.update(self._core.headers)
        # The worker's hot calls skip httpx when this client owns its connections.
        self._lean = LeanPool.open(self._core.url, self._core.headers) if http is None else None

    def __enter__(self) -> QueueClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_http:
            self._http.close()
        if self._lean is not None:
            self._lean.close()

    # -- the send: the only part that differs from AsyncQueueClient -------------

    def _attempt(self, call: Call) -> Response:
        if call.lean and self._lean is not None and call.params is None:
            lean = self._lean.request(call.method, call.path, call.json, call.headers, call.timeout)
            if lean is not None:
                return answer(lean)
        with sdk_request():
            return answer(
                self._http.request(
                    call.method,
                    call.path,
                    json=call.json,
                    params=call.params,
                    headers=call.headers,
                    timeout=call.timeout,
                )
            )

    def _send(self, call: Call) -> Response:
        """One call: each attempt within its timeout, retried only as its class allows."""
        cls = call.call_class
        try:
            if cls.attempts == 1:  # nothing to retry: no retry loop to build
                return self._attempt(call)
            for attempt in Retrying(
                retry=retry_if_exception(cls.retries),
                stop=stop_after_attempt(cls.attempts) | stop_before_delay(cls.deadline),
                wait=cls.wait,
                reraise=True,
            ):
                with attempt:
                    response = self._attempt(call)
        except TransportFailure as exc:
            raise unreachable(self._core.url, exc) from exc
        return response

    def _run(self, flow: Flow[T]) -> T:
        send = self._send
        try:
            call = next(flow)
            while True:
                call = flow.send(send(call))
        except StopIteration as done:
            result: T = done.value
            return result

    def _iterate(self, pages: Pages[T]) -> Iterator[T]:
        answered: Any = None
        while True:
            try:
                step = pages.send(answered)
            except StopIteration:
                return
            if isinstance(step, Call):
                answered = self._send(step)
            else:
                answered = None
                yield step

    # -- the API: each method is the core's flow, sent ------------------------------

    _tenant = blocking(ClientCore._tenant)
    _get = blocking(ClientCore._get)
    _effect = blocking(ClientCore._effect)

    request = blocking(ClientCore.request)
    whoami = blocking(ClientCore.whoami)
    put_tenant = blocking(ClientCore.put_tenant)
    get_tenant = blocking(ClientCore.get_tenant)
    create_key = blocking(ClientCore.create_key)
    list_tenants = blocking(ClientCore.list_tenants)
    list_keys = blocking(ClientCore.list_keys)
    revoke_key = blocking(ClientCore.revoke_key)
    create_admin_key = blocking(ClientCore.create_admin_key)
    revoke_admin_key = blocking(ClientCore.revoke_admin_key)
    enqueue = blocking(ClientCore.enqueue)
    enqueue_batch = blocking(ClientCore.enqueue_batch)
    get_item = blocking(ClientCore.get_item)
    ledger = blocking(ClientCore.ledger)
    acquire = blocking(ClientCore.acquire)
    heartbeat = blocking(ClientCore.heartbeat)
    complete = blocking(ClientCore.complete)
    requeue = blocking(ClientCore.requeue)
    triage = blocking(ClientCore.triage)
    heartbeat_many = blocking(ClientCore.heartbeat_many)
    complete_many = blocking(ClientCore.complete_many)
    approve_spend = blocking(ClientCore.approve_spend)
    spend_approvals = blocking(ClientCore.spend_approvals)
    revoke_spend_approval = blocking(ClientCore.revoke_spend_approval)
    concurrency = blocking(ClientCore.concurrency)
    set_concurrency = blocking(ClientCore.set_concurrency)
    status = blocking(ClientCore.status)
    list_items = blocking(ClientCore.list_items)
    cancel_item = blocking(ClientCore.cancel_item)
    cancel_items = blocking(ClientCore.cancel_items)
    retry_items = blocking(ClientCore.retry_items)
    delete_items = blocking(ClientCore.delete_items)
    pause_queue = blocking(ClientCore.pause_queue)
    resume_queue = blocking(ClientCore.resume_queue)
    queue_settings = blocking(ClientCore.queue_settings)
    put_queue_settings = blocking(ClientCore.put_queue_settings)
    list_dead_letters = blocking(ClientCore.list_dead_letters)
    fan_in = blocking(ClientCore.fan_in)
    list_dependencies = blocking(ClientCore.list_dependencies)
    get_workflow = blocking(ClientCore.get_workflow)
    show_dead_letter = blocking(ClientCore.show_dead_letter)
    replay = blocking(ClientCore.replay)
    discard = blocking(ClientCore.discard)
    replay_queue = blocking(ClientCore.replay_queue)
    verify_ledgers = blocking(ClientCore.verify_ledgers)
    policy = blocking(ClientCore.policy)
    policy_history = blocking(ClientCore.policy_history)
    publish_policy = blocking(ClientCore.publish_policy)
    claim_receipt = blocking(ClientCore.claim_receipt)
    settle_receipt = blocking(ClientCore.settle_receipt)
    get_receipt = blocking(ClientCore.get_receipt)
    pending_receipts = blocking(ClientCore.pending_receipts)
    resolve_receipt = blocking(ClientCore.resolve_receipt)
    start_verification_run = blocking(ClientCore.start_verification_run)
    get_verification_run = blocking(ClientCore.get_verification_run)
    abandon_verification_run = blocking(ClientCore.abandon_verification_run)
    checkpoint = blocking(ClientCore.checkpoint)
    complete_verification_run = blocking(ClientCore.complete_verification_run)
    iter_items = blocking_pages(ClientCore.iter_items)
    iter_dead_letters = blocking_pages(ClientCore.iter_dead_letters)
