"""A per-process cache of API keys, dropped whenever any process revokes a key.

Only used while the notification listener is connected: without it a revocation
elsewhere could go unseen, so every request then reads the key from the database.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

# A bound on staleness even if a notification were somehow missed.
MAX_AGE = 30.0


@dataclass(frozen=True, slots=True)
class CachedKey:
    row: dict[str, Any]
    at: float


class KeyCache:
    def __init__(self) -> None:
        self._entries: dict[str, CachedKey] = {}
        self.generation = 0
        self.enabled = False

    def get(self, key_id: str) -> dict[str, Any] | None:
        if not self.enabled:
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
