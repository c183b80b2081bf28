"""A body that never fully arrived is not acted on: the client announced more bytes than it
sent (or never sent the last chunk), then closed its side of the connection."""

from __future__ import annotations

import socket
import time
from typing import Any

import psycopg
import pytest

from tests.helpers.api import Api
from tests.helpers.server import LiveServer

Db = psycopg.Connection[dict[str, Any]]
BODY = b'{"payload": {"order": 42}}'


def _send_and_close(live: LiveServer, key: str, head: bytes, body: bytes) -> bytes:
    """Send `head` and `body`, close our sending side, and read what comes back."""
    with socket.create_connection(("127.0.0.1", live.port), timeout=10) as sock:
        sock.sendall(head + body)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while part := sock.recv(65536):
            answer += part
    return answer


def _head(api: Api, key: str, framing: str) -> bytes:
    return (
        f"POST /v1/tenants/acme/queues/q/items HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {api.keys['worker']}\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\n{framing}\r\n\r\n"
    ).encode()


def _written(db: Db) -> int:
    row = db.execute(
        "SELECT (SELECT count(*) FROM work_items) + (SELECT count(*) FROM idempotency_receipts) AS n"
    ).fetchone()
    assert row is not None
    return int(row["n"])


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_body_cut_short_writes_nothing_and_a_retry_is_a_first_request(
    api: Api, live: LiveServer, db: Db, framing: str
) -> None:
    if framing == "content-length":
        head = _head(api, "cut-1", f"Content-Length: {len(BODY) + 500}")
        body = BODY
    else:  # every byte of valid JSON, but never the last (empty) chunk
        head = _head(api, "cut-1", "Transfer-Encoding: chunked")
        body = f"{len(BODY):x}\r\n".encode() + BODY + b"\r\n"
    answer = _send_and_close(live, "cut-1", head, body)
    if answer:  # no answer at all is fine too: the client has gone
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert b"application/problem+json" in answer
    # A server acting on the prefix does so within milliseconds; give it a second.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert _written(db) == 0, "a body that never fully arrived was acted on"
        time.sleep(0.05)
    retry = api.worker.post(
        "/v1/tenants/acme/queues/q/items",
        content=BODY,
        headers={"Idempotency-Key": "cut-1", "Content-Type": "application/json"},
    )
    assert retry.status_code == 201, retry.text
    assert "Idempotent-Replayed" not in retry.headers
    assert retry.json()["payload"] == {"order": 42}
