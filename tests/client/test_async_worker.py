"""The asyncio SDK: the same API as the thread SDK; what only its face has, against the real server."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import Any

import psycopg

from queue_server.client import (
    AsyncJob,
    AsyncQueueClient,
    AsyncWorker,
    Outcome,
    QueueClient,
    Result,
    Worker,
)
from queue_server.client.core import ClientCore
from tests.helpers.api import Api
from tests.helpers.items import expire

DB = psycopg.Connection[dict[str, object]]


def _public(cls: type) -> dict[str, inspect.Signature]:
    """The public methods of a face, its own and those of the core it shares."""
    members = {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}
    return {name: inspect.signature(m) for name, m in members.items() if callable(m)}


def _parameters(sig: inspect.Signature) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_the_async_client_and_worker_have_the_same_api_as_the_thread_ones() -> None:
    sync, asyncio_ = _public(QueueClient), _public(AsyncQueueClient)
    assert set(sync) - {"close"} == set(asyncio_) - {"aclose"}
    for name, sig in sync.items():
        if name != "close":
            assert _parameters(sig) == _parameters(asyncio_[name]), name
            assert inspect.iscoroutinefunction(getattr(AsyncQueueClient, name)) or name in (
                "iter_dead_letters",
                "iter_items",
            )
    # Neither face writes a method of its own: each is the core's one flow, sent.
    assert set(_public(ClientCore)) == set(sync) - {"close"}
    for name in _public(ClientCore):
        for face in (QueueClient, AsyncQueueClient):
            assert getattr(face, name).__wrapped__ is getattr(ClientCore, name), (face, name)
    workers = _public(Worker), _public(AsyncWorker)
    assert set(workers[0]) == set(workers[1])
    for name, sig in workers[0].items():
        assert _parameters(sig)[1:] == _parameters(workers[1][name])[1:], name


def test_an_async_handler_awaits_job_stop_and_a_plain_function_is_a_handler_too(
    api: Api, db: DB
) -> None:
    """What only the asyncio face has; its behaviour is the thread worker's (tests/client/
    test_worker*.py run every behaviour test on both faces)."""

    async def scenario() -> tuple[Result, bool, list[Result]]:
        async with AsyncQueueClient(api.url, api.keys["worker"]) as qs:
            await qs.enqueue("slow", "slow")
            plain = await qs.enqueue("plain", 21)
            told_to_stop = asyncio.Event()

            async def handler(job: AsyncJob) -> str:
                expire(db, job.item_id)
                await qs.acquire("slow", worker="w2", lease_ttl=30)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(job.stop.wait(), 10)
                    told_to_stop.set()
                return "late result"

            worker = AsyncWorker(
                qs, "slow", handler, name="w1", lease_ttl=2, heartbeat_fraction=0.25
            )
            (lease,) = await qs.acquire("slow", worker="w1", lease_ttl=2)
            result = await worker.process(lease)
            results: list[Result] = []
            doubler = AsyncWorker(
                qs, "plain", lambda job: job.payload * 2, wait=0, on_result=results.append
            )
            assert await doubler.run(drain=True) == 1
            assert (await qs.get_item(plain.item_id)).result == 42
            return result, told_to_stop.is_set(), results

    result, stopped, results = asyncio.run(scenario())
    assert stopped
    assert result.outcome is Outcome.LOST
    assert [r.outcome for r in results] == [Outcome.COMPLETED]
    row = db.execute(
        "SELECT state, lease_holder, result FROM work_items WHERE queue = 'slow'"
    ).fetchone()
    assert row == {"state": "leased", "lease_holder": "w2", "result": None}


def test_async_client_finds_cancels_and_pauses_as_an_operator(api: Api) -> None:
    async def scenario() -> tuple[list[Any], Any, Any, Any, Any]:
        async with AsyncQueueClient(api.url, api.keys["operator"]) as qs:
            for n in range(3):
                await qs.enqueue("mail", {"customer": n % 2})
            found = [i async for i in qs.iter_items(page_size=1, payload={"customer": 1})]
            one = await qs.cancel_item(found[0].item_id, reason="asked")
            rest = await qs.cancel_items(queue="mail", reason="all", limit=10)
            paused = await qs.pause_queue("mail", reason="maintenance")
            resumed = await qs.resume_queue("mail")
            return found, one, rest, paused, resumed

    found, one, rest, paused, resumed = asyncio.run(scenario())
    assert [i.payload for i in found] == [{"customer": 1}]
    assert one.state == "cancelled"
    assert rest.cancelled == 2
    assert rest.next_cursor is None
    assert (paused.paused, paused.pause_reason) == (True, "maintenance")
    assert resumed.paused is False
