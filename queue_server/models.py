"""Plain typed values shared by every layer."""

from __future__ import annotations

import os
import re
import time
import uuid
from enum import StrEnum

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAME_RE = re.compile(NAME_PATTERN)


class ItemState(StrEnum):
    READY = "ready"
    LEASED = "leased"
    COMPLETED = "completed"
    QUARANTINED = "quarantined"
    CANCELLED = "cancelled"


class Role(StrEnum):
    WORKER = "worker"
    OPERATOR = "operator"
    ADMIN = "admin"


def is_uuid(value: str) -> bool:
    """Ids are canonical UUID strings; anything else names no row."""
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def uuid7() -> str:
    """A time-ordered UUID (version 7): new rows land at the right edge of their indexes."""
    stamp = f"{(time.time_ns() // 1_000_000) & 0xFFFF_FFFF_FFFF:012x}"
    rand = os.urandom(10).hex()
    variant = "89ab"[int(rand[3], 16) & 3]  # the two top bits of the variant field: 10
    return f"{stamp[:8]}-{stamp[8:]}-7{rand[:3]}-{variant}{rand[4:7]}-{rand[7:19]}"
