"""A per-process cache of API keys, dropped whenever any process revokes a key.

A revocation elsewhere reaches this process as a notification on the listener's
session, so the cache is only as good as that session. It is used only while the
listener is connected *and* has shown itself alive within `trust_window` seconds (a
notification, or an answered probe, which the notifier sends more often than that).
A session gone half-open (the server or the network lost without a FIN) delivers
nothing and answers no probe: after `trust_window` the cache stops being used, and
every request reads its key from the database again, until the listener proves
itself (or reconnects). So a revocation anywhere takes effect here within
`trust_window` at worst, and at once while the listener is healthy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# A bound on staleness even if a notification were somehow missed.
MAX_AGE = 30.0
# How long the listener's last sign of life vouches for the cache.
TRUST_WINDOW = 5.0


@dataclass(frozen=True, slots=True)
class CachedKey:
    row: dict[str, Any]
    at: float


class KeyCache:
    def __init__(self, trust_window: float = TRUST_WINDOW) -> None:
        self._entries: dict[str, CachedKey] = {}
        self.generation = 0
        self.enabled = False
        self.trust_window = trust_window
        self._alive_at = float("-inf")

    def alive(self) -> None:
        """The listener just showed it is alive (a notification, or an answered probe)."""
        self._alive_at = time.monotonic()

    @property
    def trusted(self) -> bool:
        """Connected, and heard from within the trust window."""
        return self.enabled and time.monotonic() - self._alive_at <= self.trust_window

    def get(self, key_id: str) -> dict[str, Any] | None:
        if not self.trusted:
            return None
        entry = self._entries.get(key_id)
        if entry is None or time.monotonic() - entry.at > MAX_AGE:
            return None
        return entry.row

    def put(self, key_id: str, row: dict[str, Any], generation: int) -> None:
        """Keep `row` unless the cache was cleared since it was read (`generation` moved)."""
        if self.enabled and generation == self.generation:
            self._entries[key_id] = CachedKey(row=row, at=time.monotonic())

    def clear(self) -> None:
        self.generation += 1
        self._entries.clear()
