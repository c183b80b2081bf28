"""Plain typed values shared by every layer."""

from __future__ import annotations

import hashlib
import os
import re
import time
from datetime import UTC, datetime, timedelta
from enum import StrEnum

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAME_RE = re.compile(NAME_PATTERN)


class ItemState(StrEnum):
    WAITING = "waiting"
    READY = "ready"
    LEASED = "leased"
    COMPLETED = "completed"
    QUARANTINED = "quarantined"
    CANCELLED = "cancelled"


class Role(StrEnum):
    WORKER = "worker"
    OPERATOR = "operator"
    ADMIN = "admin"


#: A canonical UUID string (lowercase, hyphenated), as a regular expression.
UUID_PATTERN = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_CANONICAL_UUID = re.compile(UUID_PATTERN)


def is_uuid(value: str) -> bool:
    """Ids are canonical UUID strings (lowercase, hyphenated); anything else names no row."""
    return _CANONICAL_UUID.fullmatch(value) is not None


# The variant field's first hex digit (its two top bits 10) from a random hex digit.
_VARIANT = {f"{d:x}": "89ab"[d & 3] for d in range(16)}


def uuid7() -> str:
    """A time-ordered UUID (version 7): new rows land at the right edge of their indexes."""
    return uuid7s(1)[0]


def uuid7s(n: int) -> list[str]:
    """`n` time-ordered UUIDs of this millisecond (a batch enqueue's ids: one clock read and
    one call for the random bits)."""
    stamp = f"{(time.time_ns() // 1_000_000) & 0xFFFF_FFFF_FFFF:012x}"
    head = f"{stamp[:8]}-{stamp[8:]}-7"
    rand = os.urandom(10 * n).hex()
    return [
        f"{head}{rand[i : i + 3]}-{_VARIANT[rand[i + 3]]}{rand[i + 4 : i + 7]}-{rand[i + 7 : i + 19]}"
        for i in range(0, 20 * n, 20)
    ]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

# PostgreSQL reads a time-zone offset of at most 15:59:59 either way; ISO 8601, Python and
# pydantic go to 23:59. An instant sent on with a wider offset is refused by the database.
MAX_UTC_OFFSET = timedelta(hours=16) - timedelta(seconds=1)


def check_utc_offset(at: datetime) -> datetime:
    """`at` itself when PostgreSQL can read its offset (at most 15:59 from UTC either way)."""
    offset = at.utcoffset()
    if offset is not None and abs(offset) > MAX_UTC_OFFSET:
        raise ValueError("must have a time-zone offset between -15:59 and +15:59")
    return at


def uuid7_at(at: datetime, name: str) -> str:
    """The version-7 UUID of `name` at the instant `at`: its time is `at`, its other bits a
    hash of both, so the same (name, instant) always gives the same id (a schedule's tick
    names its item this way)."""
    millis = (at - _EPOCH) // timedelta(milliseconds=1)
    stamp = f"{millis & 0xFFFF_FFFF_FFFF:012x}"
    digest = hashlib.sha256(f"{name}@{at.astimezone(UTC).isoformat()}".encode()).hexdigest()
    variant = "89ab"[int(digest[3], 16) & 3]
    return f"{stamp[:8]}-{stamp[8:]}-7{digest[:3]}-{variant}{digest[4:7]}-{digest[7:19]}"
