"""A fence higher than the item's was never handed out: `fence-ahead`, distinct from
`stale-fence` (a lower fence: a newer lease superseded this one); docs/guarantees.md lists both."""

from __future__ import annotations

import pytest

from queue_server.client import QueueClient
from queue_server.client import errors as client_errors
from tests.helpers.api import Api


def test_a_fence_above_the_items_is_fence_ahead_and_below_is_stale_fence(api: Api) -> None:
    api.enqueue()
    (lease,) = api.acquire()
    fence = int(str(lease["fence"]))
    for action in ("complete", "requeue", "heartbeat"):
        ahead = api.holder(action, lease["item_id"], worker="w1", fence=fence + 1)
        assert ahead.status_code == 409, ahead.text
        assert (ahead.json()["code"], ahead.json()["current_fence"]) == ("fence-ahead", fence)
        behind = api.holder(action, lease["item_id"], worker="w1", fence=fence - 1)
        assert behind.json()["code"] == "stale-fence"
    batch = api.worker.post(
        "/v1/tenants/acme/completions",
        json={"worker": "w1", "completions": [{"item_id": lease["item_id"], "fence": fence + 7}]},
        headers={"Idempotency-Key": "b"},
    ).json()
    assert batch["results"][0]["problem"]["code"] == "fence-ahead"
    # The holder with the right fence still holds the lease.
    done = api.holder("complete", lease["item_id"], worker="w1", fence=fence)
    assert done.status_code == 200, done.text


@pytest.mark.live
def test_the_sdk_raises_fence_ahead_as_a_lost_lease(api: Api) -> None:
    api.enqueue()
    (lease,) = api.acquire()
    fence = int(str(lease["fence"]))
    with (
        QueueClient(api.url, api.keys["worker"]) as client,
        pytest.raises(client_errors.FenceAheadError) as raised,
    ):
        client.complete(str(lease["item_id"]), worker="w1", fence=fence + 1)
    assert isinstance(raised.value, client_errors.LeaseLostError)
    assert raised.value.code == "fence-ahead"
