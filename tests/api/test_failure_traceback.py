"""A triage's failure may carry its traceback: at most 16 KiB of UTF-8, kept in the item,
its ledger and its dead letter, and shown on the console's item page."""

from __future__ import annotations

from typing import Any

import pytest
from markupsafe import escape

from tests.helpers.api import Api
from tests.helpers.console import sign_in

TRACE = 'Traceback (most recent call last):\n  File "job.py", line 3, in handler\nValueError: bad <input>\n'


def _triage(
    api: Api, queue: str, traceback: object, decision: str = "quarantine"
) -> tuple[str, int, dict[str, Any]]:
    item = api.enqueue(queue, "x")
    (lease,) = api.acquire(queue)
    failure: dict[str, object] = {"class": "ValueError", "message": "bad input"}
    if traceback is not None:
        failure["traceback"] = traceback
    response = api.holder(
        "triage", item["item_id"], worker="w1", fence=lease["fence"], failure=failure,
        decision=decision,
    )  # fmt: skip
    return str(item["item_id"]), response.status_code, response.json()


def test_a_traceback_is_kept_in_the_item_its_ledger_and_its_dead_letter(api: Api) -> None:
    item_id, status, body = _triage(api, "q", TRACE)
    assert status == 200, body
    assert body["last_failure"]["traceback"] == TRACE
    ledger = api.operator.get(f"/v1/tenants/acme/items/{item_id}/ledger").json()["events"]
    (triaged,) = [e for e in ledger if e["kind"] == "triaged"]
    assert triaged["data"]["failure"]["traceback"] == TRACE
    (dead,) = api.operator.get("/v1/tenants/acme/dead-letters").json()["dead_letters"]
    assert dead["last_failure"]["traceback"] == TRACE

    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{item_id}").text
    assert f'<pre class="traceback" aria-label="Traceback">{escape(TRACE)}</pre>' in page


def test_without_one_the_failure_is_as_before(api: Api) -> None:
    item_id, status, body = _triage(api, "q", None, decision="requeue")
    assert status == 200, body
    failure = {"class": "ValueError", "message": "bad input", "transient": False}
    assert body["last_failure"] == failure
    # Given back later without a failure, the item keeps the last one it was told.
    (lease,) = api.acquire("q")
    requeued = api.holder("requeue", item_id, worker="w1", fence=lease["fence"], delay=0)
    assert requeued.status_code == 200, requeued.text
    assert requeued.json()["last_failure"] == failure


@pytest.mark.parametrize(
    ("traceback", "accepted"),
    [
        ("é" * 8192, True),  # 16,384 bytes: the bound
        ("é" * 8192 + "x", False),  # one byte over, in fewer characters than bytes
        ("x" * 16385, False),
        ("line\x00", False),
        (["not", "text"], False),
    ],
    ids=["16-kib", "16-kib-plus-1-byte", "16-kib-plus-1-char", "nul", "not-a-string"],
)
def test_a_traceback_is_at_most_16_kib_of_text(api: Api, traceback: object, accepted: bool) -> None:
    item_id, status, body = _triage(api, "q", traceback)
    if accepted:
        assert status == 200, body
        assert body["last_failure"]["traceback"] == traceback
        return
    assert status == 422, body
    assert body["errors"][0]["loc"] == ["body", "failure", "traceback"]
    item = api.operator.get(f"/v1/tenants/acme/items/{item_id}").json()
    assert item["state"] == "leased"  # refused: nothing changed
