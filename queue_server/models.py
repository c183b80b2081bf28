"""Plain typed values shared by every layer."""

from __future__ import annotations

import re
from enum import StrEnum

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
NAME_RE = re.compile(NAME_PATTERN)


class ItemState(StrEnum):
    READY = "ready"
    LEASED = "leased"
    COMPLETED = "completed"
    QUARANTINED = "quarantined"
    CANCELLED = "cancelled"


ACTIVE_STATES = (ItemState.READY, ItemState.LEASED)


class Role(StrEnum):
    WORKER = "worker"
    OPERATOR = "operator"
    ADMIN = "admin"


class EventKind(StrEnum):
    """Kinds of rows in an item's ledger (`item_events`)."""

    ENQUEUED = "enqueued"
    ACQUIRED = "acquired"
    HEARTBEAT = "heartbeat"
    COMPLETED = "completed"
    REQUEUED = "requeued"
    TRIAGED = "triaged"
    TRIAGE_REJECTED = "triage_rejected"
    QUARANTINED = "quarantined"
    REPLAYED = "replayed"
    CANCELLED = "cancelled"
