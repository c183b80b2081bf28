"""Signed webhook deliveries as broker requests (Standard Webhooks headers, JSON body)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from queue_server.transport.broker import DispatchRequest
from queue_server.transport.signing import webhook_headers


def webhook_request(
    url: str,
    *,
    secrets: Sequence[str],
    delivery_key: str,
    body: bytes,
    timestamp: int | datetime,
    timeout: float | None = None,
) -> DispatchRequest:
    """A signed POST whose `webhook-id` is the delivery key, identical on every attempt."""
    headers = {
        "Content-Type": "application/json",
        **webhook_headers(secrets, delivery_key, timestamp, body),
    }
    return DispatchRequest(
        "POST", url, headers=headers, content=body, label="webhook", timeout=timeout
    )
