"""The SDK's enqueue with a unique key, on both faces of the client against a live server:
the item holding the key is answered, and a batch entry may carry its own key."""

from __future__ import annotations

import asyncio

from queue_server.client import AsyncQueueClient, NewItem, QueueClient
from tests.helpers.api import Api


def test_the_client_answers_the_item_holding_a_unique_key(api: Api) -> None:
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as qs:
        first = qs.enqueue("q", {"n": 1}, unique_key="sync-users")
        again = qs.enqueue("q", {"n": 2}, unique_key="sync-users")
        assert (again.item_id, again.payload, again.unique_key) == (
            first.item_id,
            {"n": 1},
            "sync-users",
        )
        batch = qs.enqueue_batch(
            "q", [NewItem(payload=3, unique_key="sync-users"), NewItem(payload=4)]
        )
        assert batch[0].item_id == first.item_id != batch[1].item_id

    async def on_loop() -> str:
        async with AsyncQueueClient(api.url, api.keys["worker"], tenant=api.tenant) as aqs:
            return (await aqs.enqueue("q", {"n": 5}, unique_key="sync-users")).item_id

    assert asyncio.run(on_loop()) == first.item_id
