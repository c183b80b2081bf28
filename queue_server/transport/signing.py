"""Standard Webhooks signatures: `v1,<base64 HMAC-SHA256>` over `id.timestamp.body`.

Secrets look like `whsec_<base64 key>`. During a rotation a delivery is signed with
every live secret, space-separated, so receivers holding either one can verify it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets as _secrets
from collections.abc import Iterable
from datetime import datetime

SECRET_PREFIX = "whsec_"
SIGNATURE_VERSION = "v1"


def generate_secret(nbytes: int = 32) -> str:
    """A fresh random signing secret in the `whsec_` form."""
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(nbytes)).decode("ascii")


def sign(secret: str, msg_id: str, timestamp: int | datetime, body: bytes | str) -> str:
    """One `v1,<base64>` signature of the message under one secret."""
    mac = hmac.new(_key(secret), _signed_content(msg_id, timestamp, body), hashlib.sha256)
    return f"{SIGNATURE_VERSION},{base64.b64encode(mac.digest()).decode('ascii')}"


def sign_all(
    secrets: Iterable[str], msg_id: str, timestamp: int | datetime, body: bytes | str
) -> str:
    """The `webhook-signature` value: one signature per secret, space-separated."""
    signatures = [sign(s, msg_id, timestamp, body) for s in secrets]
    if not signatures:
        raise ValueError("at least one secret is required")
    return " ".join(signatures)


def webhook_headers(
    secrets: Iterable[str], msg_id: str, timestamp: int | datetime, body: bytes | str
) -> dict[str, str]:
    """The three Standard Webhooks headers for one delivery attempt."""
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(_seconds(timestamp)),
        "webhook-signature": sign_all(secrets, msg_id, timestamp, body),
    }


def verify(
    secret: str, msg_id: str, timestamp: int | datetime, body: bytes | str, header: str
) -> bool:
    """Whether any signature in a `webhook-signature` header matches under this secret."""
    expected = sign(secret, msg_id, timestamp, body).encode("ascii")
    # Compare every candidate in constant time; unknown versions simply never match.
    return any(hmac.compare_digest(expected, c.encode("ascii")) for c in header.split())


def _key(secret: str) -> bytes:
    """Decode the key bytes of a `whsec_` secret."""
    raw = secret.removeprefix(SECRET_PREFIX)
    try:
        key = base64.b64decode(raw, validate=True)
    except ValueError as exc:
        raise ValueError("a signing secret must be whsec_ followed by base64") from exc
    if not key:
        raise ValueError("a signing secret must not be empty")
    return key


def _signed_content(msg_id: str, timestamp: int | datetime, body: bytes | str) -> bytes:
    """`{id}.{timestamp}.{body}` exactly as the Standard Webhooks spec signs it."""
    payload = body.encode("utf-8") if isinstance(body, str) else body
    return f"{msg_id}.{_seconds(timestamp)}.".encode() + payload


def _seconds(timestamp: int | datetime) -> int:
    """Unix seconds; a naive datetime is refused because its instant is ambiguous."""
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise ValueError("timestamp must be timezone-aware")
        return int(timestamp.timestamp())
    return int(timestamp)
