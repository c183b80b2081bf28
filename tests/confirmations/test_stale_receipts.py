"""Confirmation receipts left pending past the confirmed-mutation deadline (their claimant
gone) are listed for operators and settled by one, with what happened and why, recorded;
nothing dispatched is ever shown as cancelled."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_server.client import QueueClient
from queue_server.client.errors import ProblemError
from queue_server.settings import Settings
from tests.helpers.api import Api, live_api, policy_file

DEADLINE = 1.0


@pytest.fixture
def short(tmp_path: Path, database_url: str) -> Iterator[Api]:
    """A server whose policy makes a pending receipt stale DEADLINE seconds after its claim."""
    path = policy_file(
        tmp_path / "short-mutations.json",
        {
            "confirmed-mutation": {
                "deadline": {"seconds": DEADLINE},
                "attempt-timeout": {"seconds": 0.5, "on-timeout": "return-pending-receipt"},
            }
        },
    )
    with live_api(Settings(data_dir=tmp_path, policy=str(path)), database_url) as api:
        yield api


def test_an_operator_settles_a_stale_pending_receipt_with_a_recorded_reason(short: Api) -> None:
    api = short
    with (
        QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as claimant,
        QueueClient(api.url, api.keys["operator"], tenant=api.tenant) as operator,
    ):
        claimant.claim_receipt("k-crashed", "charge-1")  # its claimant crashes: never settled
        claimant.claim_receipt("k-done", "charge-2")
        claimant.settle_receipt("charge-2", "succeeded", {"charged": 5})
        assert operator.pending_receipts() == []  # not stale yet
        (young,) = operator.pending_receipts(older_than=0)
        assert (young.outcome_ref, young.stale) == ("charge-1", False)
        with pytest.raises(ProblemError) as early:
            operator.resolve_receipt("charge-1", "failed", {}, reason="too soon")
        assert early.value.code == "receipt-not-stale"

        time.sleep(DEADLINE + 0.1)
        (stale,) = operator.pending_receipts()
        assert (stale.outcome_ref, stale.status, stale.stale) == ("charge-1", "pending", True)
        with pytest.raises(ProblemError) as forbidden:
            claimant.resolve_receipt("charge-1", "failed", {}, reason="workers may not")
        assert forbidden.value.status == 403
        settled = operator.resolve_receipt(
            "charge-1",
            "succeeded",
            {"charged": 12, "found_in": "the payment provider's dashboard"},
            reason="the provider shows the charge; the client crashed before settling",
        )
        assert settled.status == "succeeded"
        assert settled.settled_by is not None
        assert settled.settled_by.startswith("key:")
        assert settled.settle_reason is not None
        assert "provider shows" in settled.settle_reason
        again = claimant.get_receipt("charge-1")
        assert (again.status, again.outcome, again.settled_by) == (
            "succeeded",
            settled.outcome,
            settled.settled_by,
        )
        assert operator.pending_receipts(older_than=0) == []
        # The claimant, back, finds the retained outcome; it cannot settle it differently.
        replay, granted = claimant.claim_receipt("k-crashed", "charge-1")
        assert (replay.status, granted) == ("succeeded", False)
        with pytest.raises(ProblemError) as late:
            claimant.settle_receipt("charge-1", "failed", {"error": "timeout"})
        assert late.value.code == "receipt-conflict"
        with pytest.raises(ProblemError) as settled_once:
            operator.resolve_receipt("charge-2", "failed", {}, reason="settled already")
        assert settled_once.value.code == "receipt-conflict"


def test_a_dispatched_mutation_is_never_settled_as_cancelled(short: Api) -> None:
    api = short
    with QueueClient(api.url, api.keys["worker"], tenant=api.tenant) as claimant:
        claimant.claim_receipt("k", "ref")
    time.sleep(DEADLINE + 0.1)
    refused = api.operator.post(
        f"/v1/tenants/{api.tenant}/receipts/ref:resolve",
        json={"status": "cancelled", "outcome": None, "reason": "abort"},
        headers={"Idempotency-Key": "cancel-1"},
    )
    assert (refused.status_code, refused.json()["code"]) == (422, "invalid-request")
    listed = api.operator.get(f"/v1/tenants/{api.tenant}/receipts", params={"state": "pending"})
    assert [r["status"] for r in listed.json()["receipts"]] == ["pending"]
