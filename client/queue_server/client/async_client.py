"""The asyncio face of the SDK (httpx.AsyncClient): the same methods as `QueueClient`, awaited.

Each method is the same flow of `queue_server.client.core` that `QueueClient`
drives; only the send differs (awaited here).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, stop_before_delay

from queue_server.client.connection import (
    AsyncHttpClient,
    AsyncLeanPool,
    Response,
    TransportFailure,
    connect_async,
    sdk_request,
)
from queue_server.client.core import (
    Call,
    ClientCore,
    ClientFace,
    Flow,
    Pages,
    answer,
    face_method,
    unreachable,
)
from queue_server.policy import ReliabilityPolicy

P = ParamSpec("P")
T = TypeVar("T")


def awaited(
    flow: Callable[Concatenate[ClientCore, P], Flow[T]],
) -> Callable[Concatenate[AsyncQueueClient, P], Coroutine[Any, Any, T]]:
    """The flow as a coroutine method of `AsyncQueueClient`: its calls sent, awaited."""

    async def method(self: AsyncQueueClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(flow(self._core, *args, **kwargs))

    face_method(flow, method)
    return method


def awaited_pages(
    flow: Callable[Concatenate[ClientCore, P], Pages[T]],
) -> Callable[Concatenate[AsyncQueueClient, P], AsyncIterator[T]]:
    """The listing as a method of `AsyncQueueClient`: an async iterator, a page per call."""

    def method(self: AsyncQueueClient, /, *args: P.args, **kwargs: P.kwargs) -> AsyncIterator[T]:
        return self._iterate(flow(self._core, *args, **kwargs))

    face_method(flow, method, AsyncIterator)
    return method


class AsyncQueueClient(ClientFace):
    """A client of one queue server for asyncio code; the same methods as `QueueClient`.

    Example::

        async with AsyncQueueClient("http://127.0.0.1:8080", key) as qs:
            item = await qs.enqueue("emails", {"to": "a@example.com"})
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
        http: AsyncHttpClient | None = None,
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
        self._http = http or connect_async(self._core.url, timeout=30.0)
        self._http.headers.update(self._core.headers)
        # The worker's hot calls skip httpx when this client owns its connections.
        self._lean = (
            AsyncLeanPool.open(self._core.url, self._core.headers) if http is None else None
        )

    async def __aenter__(self) -> AsyncQueueClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()
        if self._lean is not None:
            self._lean.close()

    # -- the send: the only part that differs from QueueClient ----------------------

    async def _attempt(self, call: Call) -> Response:
        if call.lean and self._lean is not None and call.params is None:
            lean = await self._lean.request(
                call.method, call.path, call.json, call.headers, call.timeout
            )
            if lean is not None:
                return answer(lean)
        with sdk_request():
            return answer(
                await self._http.request(
                    call.method,
                    call.path,
                    json=call.json,
                    params=call.params,
                    headers=call.headers,
                    timeout=call.timeout,
                )
            )

    async def _send(self, call: Call) -> Response:
        """One call: each attempt within its timeout, retried only as its class allows."""
        cls = call.call_class
        try:
            if cls.attempts == 1:  # nothing to retry: no retry loop to build
                return await self._attempt(call)
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(cls.retries),
                stop=stop_after_attempt(cls.attempts) | stop_before_delay(cls.deadline),
                wait=cls.wait,
                reraise=True,
            ):
                with attempt:
                    response = await self._attempt(call)
        except TransportFailure as exc:
            raise unreachable(self._core.url, exc) from exc
        return response

    async def _run(self, flow: Flow[T]) -> T:
        send = self._send
        try:
            call = next(flow)
            while True:
                call = flow.send(await send(call))
        except StopIteration as done:
            result: T = done.value
            return result

    async def _iterate(self, pages: Pages[T]) -> AsyncIterator[T]:
        answered: Any = None
        while True:
            try:
                step = pages.send(answered)
            except StopIteration:
                return
            if isinstance(step, Call):
                answered = await self._send(step)
            else:
                answered = None
                yield step

    # -- the API: each method is the core's flow, sent and awaited --------------------

    _tenant = awaited(ClientCore._tenant)
    _get = awaited(ClientCore._get)
    _effect = awaited(ClientCore._effect)

    request = awaited(ClientCore.request)
    whoami = awaited(ClientCore.whoami)
    put_tenant = awaited(ClientCore.put_tenant)
    get_tenant = awaited(ClientCore.get_tenant)
    create_key = awaited(ClientCore.create_key)
    list_tenants = awaited(ClientCore.list_tenants)
    list_keys = awaited(ClientCore.list_keys)
    revoke_key = awaited(ClientCore.revoke_key)
    create_admin_key = awaited(ClientCore.create_admin_key)
    revoke_admin_key = awaited(ClientCore.revoke_admin_key)
    enqueue = awaited(ClientCore.enqueue)
    enqueue_batch = awaited(ClientCore.enqueue_batch)
    get_item = awaited(ClientCore.get_item)
    ledger = awaited(ClientCore.ledger)
    acquire = awaited(ClientCore.acquire)
    heartbeat = awaited(ClientCore.heartbeat)
    complete = awaited(ClientCore.complete)
    requeue = awaited(ClientCore.requeue)
    triage = awaited(ClientCore.triage)
    heartbeat_many = awaited(ClientCore.heartbeat_many)
    complete_many = awaited(ClientCore.complete_many)
    approve_spend = awaited(ClientCore.approve_spend)
    spend_approvals = awaited(ClientCore.spend_approvals)
    revoke_spend_approval = awaited(ClientCore.revoke_spend_approval)
    concurrency = awaited(ClientCore.concurrency)
    set_concurrency = awaited(ClientCore.set_concurrency)
    status = awaited(ClientCore.status)
    list_items = awaited(ClientCore.list_items)
    cancel_item = awaited(ClientCore.cancel_item)
    cancel_items = awaited(ClientCore.cancel_items)
    retry_items = awaited(ClientCore.retry_items)
    delete_items = awaited(ClientCore.delete_items)
    pause_queue = awaited(ClientCore.pause_queue)
    resume_queue = awaited(ClientCore.resume_queue)
    queue_settings = awaited(ClientCore.queue_settings)
    put_queue_settings = awaited(ClientCore.put_queue_settings)
    list_dead_letters = awaited(ClientCore.list_dead_letters)
    fan_in = awaited(ClientCore.fan_in)
    list_dependencies = awaited(ClientCore.list_dependencies)
    get_workflow = awaited(ClientCore.get_workflow)
    show_dead_letter = awaited(ClientCore.show_dead_letter)
    replay = awaited(ClientCore.replay)
    discard = awaited(ClientCore.discard)
    replay_queue = awaited(ClientCore.replay_queue)
    verify_ledgers = awaited(ClientCore.verify_ledgers)
    policy = awaited(ClientCore.policy)
    policy_history = awaited(ClientCore.policy_history)
    publish_policy = awaited(ClientCore.publish_policy)
    claim_receipt = awaited(ClientCore.claim_receipt)
    settle_receipt = awaited(ClientCore.settle_receipt)
    get_receipt = awaited(ClientCore.get_receipt)
    pending_receipts = awaited(ClientCore.pending_receipts)
    resolve_receipt = awaited(ClientCore.resolve_receipt)
    start_verification_run = awaited(ClientCore.start_verification_run)
    get_verification_run = awaited(ClientCore.get_verification_run)
    abandon_verification_run = awaited(ClientCore.abandon_verification_run)
    checkpoint = awaited(ClientCore.checkpoint)
    complete_verification_run = awaited(ClientCore.complete_verification_run)
    iter_items = awaited_pages(ClientCore.iter_items)
    iter_dead_letters = awaited_pages(ClientCore.iter_dead_letters)
