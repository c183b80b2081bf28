"""Standard Webhooks signatures, checked by the reference `standardwebhooks` library."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from queue_server.transport import TransportBroker, webhook_request
from queue_server.transport.signing import (
    generate_secret,
    sign,
    sign_all,
    verify,
    webhook_headers,
)
from tests.helpers.receiver import Receiver

BODY = json.dumps({"event": "item.completed", "item": {"item_id": 7}})


def now() -> datetime:
    """The current instant, within the library's five-minute tolerance."""
    return datetime.now(UTC)


def test_signature_verifies_with_standardwebhooks() -> None:
    secret = generate_secret()
    headers = webhook_headers([secret], "dlv_1", now(), BODY)
    assert headers["webhook-signature"].startswith("v1,")
    payload = Webhook(secret).verify(BODY, headers)
    assert payload["event"] == "item.completed"


def test_signature_equals_the_reference_implementation() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    ts = datetime(2026, 8, 2, 12, 0, tzinfo=UTC)
    assert sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", ts, BODY) == Webhook(secret).sign(
        "msg_p5jXN8AQM9LWM0D4loKWxJek", ts, BODY
    )
    assert sign(secret, "m", ts, BODY) == sign(secret, "m", int(ts.timestamp()), BODY.encode())


def test_rotation_signs_with_every_secret_and_each_verifies() -> None:
    old, new = generate_secret(), generate_secret()
    headers = webhook_headers([old, new], "dlv_2", now(), BODY)
    assert len(headers["webhook-signature"].split(" ")) == 2
    for secret in (old, new):
        Webhook(secret).verify(BODY, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(generate_secret()).verify(BODY, headers)


def test_tampered_body_or_id_does_not_verify() -> None:
    secret = generate_secret()
    headers = webhook_headers([secret], "dlv_3", now(), BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY.replace("7", "8"), headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(BODY, {**headers, "webhook-id": "dlv_4"})


def test_local_verify_accepts_any_listed_signature() -> None:
    a, b = generate_secret(), generate_secret()
    ts = now()
    header = sign_all([a, b], "dlv_5", ts, BODY)
    assert verify(b, "dlv_5", ts, BODY, header)
    assert not verify(generate_secret(), "dlv_5", ts, BODY, header)


@pytest.mark.parametrize("secret", ["whsec_", "whsec_not base64!", ""])
def test_malformed_secret_is_refused(secret: str) -> None:
    with pytest.raises(ValueError, match="secret"):
        sign(secret, "m", 0, BODY)


def test_naive_timestamp_and_empty_secret_list_are_refused() -> None:
    with pytest.raises(ValueError, match="timezone"):
        sign(generate_secret(), "m", datetime(2026, 1, 1), BODY)  # noqa: DTZ001
    with pytest.raises(ValueError, match="secret"):
        sign_all([], "m", 0, BODY)


def test_signed_delivery_through_the_broker_verifies_at_the_receiver(
    receiver: Receiver,
) -> None:
    old, new = generate_secret(), generate_secret()
    broker = TransportBroker(allow=["127.0.0.1"], request_timeout=2.0)
    for _ in range(2):
        request = webhook_request(
            receiver.url("/ok"),
            secrets=[old, new],
            delivery_key="dlv_6",
            body=BODY.encode(),
            timestamp=now(),
        )
        assert asyncio.run(broker.dispatch(request)).ok
    # Every attempt carries the same delivery key and verifies under either secret.
    for seen in receiver.requests:
        assert seen.headers["webhook-id"] == "dlv_6"
        assert seen.headers["content-type"] == "application/json"
        for secret in (old, new):
            Webhook(secret).verify(seen.body, seen.headers)
    assert [r.label for r in broker.snapshot().receipts] == ["webhook", "webhook"]
