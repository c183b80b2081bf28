"""The per-process memory of queues near their concurrency limit is bounded."""

from __future__ import annotations

from queue_server.services.leases import Leases
from tests.helpers.api import Api
from tests.helpers.server import LiveServer


def test_queues_near_their_limit_are_remembered_but_only_so_many(
    api: Api, live: LiveServer
) -> None:
    leases: Leases = live.app.state.services.leases
    leases.near_limit.max_entries = 8
    for n in range(20):
        # A queue without a spend approval (limit 1) is near its limit for an acquire of 2.
        api.enqueue(f"q{n}")
        assert len(api.acquire(f"q{n}", max_items=2)) == 1
    assert len(leases.near_limit) == 8
    assert leases.near_limit.recent("acme", "q19")
    assert not leases.near_limit.recent("acme", "q0")
    # Forgotten or remembered, the limit holds: the queue's one lease is taken.
    api.enqueue("q0")
    assert api.acquire("q0") == []
