"""GET /v1/policy, and receipts that survive a restart of the server."""

from __future__ import annotations

import pytest

from queue_server.client import QueueClient
from queue_server.policy import default_policy, load_policy
from queue_server.settings import Settings
from tests.helpers.api import Api
from tests.helpers.server import LiveServer

pytestmark = pytest.mark.live  # the SDK opens its own connections


def test_get_policy_serves_the_policy_document_without_a_key(api: Api) -> None:
    response = api.client(None).get("/v1/policy")
    assert response.status_code == 200
    served = response.json()
    assert served.pop("loaded") == {
        "version": "operation-reliability.v2",
        "digest": load_policy().digest,
        "source": "built-in",
    }
    assert served == default_policy().as_document()
    assert load_policy(served).rows() == load_policy().rows()


def test_receipts_survive_an_app_restart(
    api: Api, live: LiveServer, settings: Settings, database_url: str
) -> None:
    with QueueClient(api.url, api.keys["worker"], tenant="acme") as before:
        before.claim_receipt("k-pending", "r-pending")
        before.claim_receipt("k-done", "r-done")
        before.settle_receipt("r-done", "succeeded", {"charged": 12})
    live.stop()

    restarted = LiveServer(settings, database_url)
    restarted.start()
    try:
        with QueueClient(restarted.url, api.keys["worker"], tenant="acme") as after:
            done = after.get_receipt("r-done")
            assert (done.status, done.outcome) == ("succeeded", {"charged": 12})
            replay, granted = after.claim_receipt("k-done", "r-done")
            assert not granted
            assert replay.outcome == {"charged": 12}
            pending, granted = after.claim_receipt("k-pending", "r-pending")
            assert (pending.status, granted) == ("pending", False)
            settled = after.settle_receipt("r-pending", "failed", {"error": "declined"})
            assert settled.status == "failed"
    finally:
        restarted.stop()
