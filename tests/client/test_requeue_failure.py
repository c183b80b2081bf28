"""The SDK's requeue call may tell the server why it gives an item back: a failure class
and its traceback, kept as the item's last failure and in its ledger."""

from __future__ import annotations

from queue_server.client import QueueClient
from tests.helpers.api import Api

TRACE = 'Traceback (most recent call last):\n  File "job.py", line 2\nOSError: disk full\n'


def test_a_requeue_sends_its_failure_and_traceback(api: Api) -> None:
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as worker:
        item = worker.enqueue("q", {"n": 1})
        (lease,) = worker.acquire("q", worker="w1", lease_ttl=5)
        back = worker.requeue(
            item.item_id,
            worker="w1",
            fence=lease.fence,
            reason="disk full",
            failure_class="OSError",
            traceback=TRACE,
        )
        assert back.state == "ready"
        assert back.last_failure == {
            "class": "OSError",
            "message": "disk full",
            "transient": False,
            "traceback": TRACE,
        }
        (event,) = [e for e in worker.ledger(item.item_id) if e.kind == "requeued"]
        assert event.data["failure"]["traceback"] == TRACE
        # Without either, a requeue reports no failure.
        (lease,) = worker.acquire("q", worker="w1", lease_ttl=5)
        worker.requeue(item.item_id, worker="w1", fence=lease.fence, reason="later")
        events = [e for e in worker.ledger(item.item_id) if e.kind == "requeued"]
        assert "failure" not in events[-1].data
