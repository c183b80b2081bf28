"""What a payload or a result may hold: each refusal and each edge that is still accepted.

The check settles most values with one orjson pass and walks only a suspicious one,
so each of its shortcuts has a value here that must still be refused (or accepted).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.helpers.api import Api


def _nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels - 1):
        value = [value]
    return value


REFUSED = {
    "nested 65 levels": '{"payload": %s}' % ("[" * 64 + "1" + "]" * 64),
    "nested 65 levels of objects": '{"payload": %s}' % ('{"a":' * 64 + "1" + "}" * 64),
    "NaN": '{"payload": {"x": NaN}}',
    "infinity": '{"payload": [1, -Infinity]}',
    "NUL in a string": '{"payload": {"x": "a\\u0000b"}}',
    "NUL in a key": '{"payload": {"a\\u0000": 1}}',
    "a lone surrogate": '{"payload": ["\\ud800"]}',
    "2**64": '{"payload": 18446744073709551616}',
    "-(2**63) - 1": '{"payload": -9223372036854775809}',
}

ACCEPTED = {
    "nested 64 levels": (_nested(64), "[" * 63 + "1" + "]" * 63),
    "2**64 - 1 and -(2**63)": ([2**64 - 1, -(2**63)], None),
    "the text \\u0000": ({"x": "\\u0000"}, None),
    "nulls": ({"x": None, "y": [None]}, None),
    "a wide character": ({"x": "\u00e9\U0001f600"}, None),
}


def _enqueue(api: Api, body: str) -> Any:
    return api.worker.post(
        f"/v1/tenants/{api.tenant}/queues/q/items",
        content=body.encode(),
        headers={"content-type": "application/json", "Idempotency-Key": uuid.uuid4().hex},
    )


@pytest.mark.parametrize("what", REFUSED)
def test_a_payload_outside_what_is_storable_is_refused(api: Api, what: str) -> None:
    response = _enqueue(api, REFUSED[what])
    assert response.status_code == 422, (what, response.text)
    assert response.json()["code"] == "invalid-request"


def test_payloads_at_the_edges_are_stored_as_sent(api: Api) -> None:
    for what, (payload, text) in ACCEPTED.items():
        body = json.dumps({"payload": payload}) if text is None else f'{{"payload": {text}}}'
        response = _enqueue(api, body)
        assert response.status_code == 201, (what, response.text)
        assert response.json()["payload"] == payload, what


def test_a_result_is_held_to_the_same_checks(api: Api) -> None:
    api.enqueue()
    lease = api.acquire()[0]
    refused = api.worker.post(
        f"/v1/tenants/{api.tenant}/items/{lease['item_id']}/complete",
        content=b'{"worker": "w1", "fence": %d, "result": {"x": NaN}}' % int(str(lease["fence"])),
        headers={"content-type": "application/json", "Idempotency-Key": uuid.uuid4().hex},
    )
    assert refused.status_code == 422, refused.text
    done = api.holder(
        "complete", lease["item_id"], worker="w1", fence=lease["fence"], result=[None]
    )
    assert done.status_code == 200, done.text
    assert done.json()["result"] == [None]
