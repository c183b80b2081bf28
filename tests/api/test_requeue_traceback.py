"""A requeue may carry the failure it gives the item back for, as a triage does: its
traceback at most 16 KiB of UTF-8, kept as the item's last failure and in the `requeued`
event of its ledger, and shown on the console's item page."""

from __future__ import annotations

from typing import Any

import pytest
from markupsafe import escape

from tests.helpers.api import Api
from tests.helpers.console import sign_in

TRACE = 'Traceback (most recent call last):\n  File "job.py", line 9, in handler\nTimeoutError: <slow>\n'


def _requeue(api: Api, failure: object) -> tuple[str, int, dict[str, Any]]:
    item = api.enqueue("q", "x")
    (lease,) = api.acquire("q")
    response = api.holder(
        "requeue", item["item_id"], worker="w1", fence=lease["fence"], reason="slow",
        failure=failure,
    )  # fmt: skip
    return str(item["item_id"]), response.status_code, response.json()


def _requeued_event(api: Api, item_id: str) -> dict[str, Any]:
    ledger = api.operator.get(f"/v1/tenants/acme/items/{item_id}/ledger").json()["events"]
    (event,) = [e for e in ledger if e["kind"] == "requeued"]
    return dict(event)


def test_a_requeue_keeps_its_traceback_in_the_item_and_the_ledger_and_shows_it(
    api: Api,
) -> None:
    failure = {"class": "TimeoutError", "message": "slow", "traceback": TRACE}
    item_id, status, body = _requeue(api, failure)
    assert status == 200, body
    assert body["state"] == "ready"
    assert body["last_failure"] == {**failure, "transient": False}
    event = _requeued_event(api, item_id)
    assert event["data"]["failure"]["traceback"] == TRACE
    assert event["data"]["reason"] == "slow"

    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{item_id}").text
    assert f'<pre class="traceback" aria-label="Traceback">{escape(TRACE)}</pre>' in page
    assert "gave it back after TimeoutError: slow" in page


def test_a_requeue_without_a_failure_keeps_the_last_one_and_ledgers_none(api: Api) -> None:
    item = api.enqueue("q", "x")
    (lease,) = api.acquire("q")
    failure = {"class": "ValueError", "message": "bad", "traceback": TRACE}
    triaged = api.holder(
        "triage", item["item_id"], worker="w1", fence=lease["fence"], failure=failure,
        decision="requeue",
    )  # fmt: skip
    assert triaged.status_code == 200, triaged.text
    (lease,) = api.acquire("q")
    response = api.holder("requeue", item["item_id"], worker="w1", fence=lease["fence"])
    assert response.status_code == 200, response.text
    assert response.json()["last_failure"]["traceback"] == TRACE
    assert "failure" not in _requeued_event(api, str(item["item_id"]))["data"]


def test_the_ledger_folds_to_the_failure_a_requeue_kept(api: Api) -> None:
    failure = {"class": "TimeoutError", "message": "slow", "traceback": TRACE}
    _requeue(api, failure)
    verified = api.operator.get("/v1/tenants/acme/ledger-verification").json()
    assert verified["mismatches"] == []
    assert verified["checked"] == 1


@pytest.mark.parametrize(
    ("traceback", "accepted"),
    [
        ("é" * 8192, True),  # 16,384 bytes: the bound
        ("é" * 8192 + "x", False),  # one byte over, in fewer characters than bytes
        ("x" * 16385, False),
        ("line\x00", False),
    ],
    ids=["16-kib", "16-kib-plus-1-byte", "16-kib-plus-1-char", "nul"],
)
def test_a_requeue_traceback_is_at_most_16_kib_of_text(
    api: Api, traceback: str, accepted: bool
) -> None:
    item_id, status, body = _requeue(api, {"class": "E", "traceback": traceback})
    if accepted:
        assert status == 200, body
        assert body["last_failure"]["traceback"] == traceback
        assert _requeued_event(api, item_id)["data"]["failure"]["traceback"] == traceback
        return
    assert status == 422, body
    assert body["code"] == "invalid-request"
    assert body["errors"][0]["loc"] == ["body", "failure", "traceback"]
    item = api.operator.get(f"/v1/tenants/acme/items/{item_id}").json()
    assert item["state"] == "leased"  # refused: nothing changed
    assert item["last_failure"] is None
