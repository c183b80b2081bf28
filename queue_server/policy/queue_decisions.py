"""Queue-side decisions for durable leased work and artifact verification runs.

Leased work has no retry loop (ADR Decision 3): each re-acquisition is a queue
decision that advances the fence and the acquisition count, and an exhausted
acquisition budget quarantines the item. Artifact verification (ADR Decisions
5 and 7) keys a run by artifact version plus verifier version, checkpoints each
item idempotently and writes its terminal marker only after every item.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from queue_server.policy.errors import PolicyError, ReceiptConflictError
from queue_server.policy.loader import default_policy
from queue_server.policy.model import (
    Dimension,
    OperationClass,
    QueueReacquisition,
    ReliabilityPolicy,
    cell_name,
)


@dataclass(frozen=True)
class Reacquire:
    """Hand the item out again at once, under a higher fence and acquisition count."""

    fence: int
    acquisition_count: int
    delay_seconds: float = 0.0


@dataclass(frozen=True)
class Quarantine:
    """The acquisition budget is spent: quarantine the item for an operator."""

    acquisition_count: int


def decide_reacquisition(
    *,
    fence: int,
    acquisition_count: int,
    max_acquisitions: int | None = None,
    policy: ReliabilityPolicy | None = None,
) -> Reacquire | Quarantine:
    """The queue's decision for the next acquire of an item; the item's budget may only be lower."""
    cell = (policy or default_policy()).for_class(OperationClass.DURABLE_LEASED_WORK).retry
    if not isinstance(cell, QueueReacquisition):
        raise PolicyError.single(
            cell_name(OperationClass.DURABLE_LEASED_WORK, Dimension.RETRY),
            "leased work re-acquires through the queue",
        )
    budget = cell.max_acquisitions if max_acquisitions is None else max_acquisitions
    budget = min(budget, cell.max_acquisitions)
    if fence < 0 or acquisition_count < 0:
        raise ValueError("fence and acquisition count are never negative")
    if acquisition_count >= budget:
        return Quarantine(acquisition_count=acquisition_count)
    return Reacquire(
        fence=fence + 1, acquisition_count=acquisition_count + 1, delay_seconds=cell.delay_seconds
    )


def run_key(artifact_version: str, verifier_version: str) -> str:
    """The run key of artifact verification: the immutable artifact and verifier versions."""
    if not artifact_version.strip() or not verifier_version.strip():
        raise ValueError("a run key needs both an artifact version and a verifier version")
    return f"{artifact_version}+{verifier_version}"


class RunCheckpoints:
    """Idempotent per-item checkpoints, then a terminal run-complete marker after every item."""

    def __init__(
        self,
        *,
        artifact_version: str,
        verifier_version: str,
        items: Iterable[str],
        done: Mapping[str, str] | None = None,
    ) -> None:
        self.key = run_key(artifact_version, verifier_version)
        self.items: tuple[str, ...] = tuple(dict.fromkeys(items))
        if not self.items:
            raise ValueError("a verification run declares at least one item")
        self._lock = threading.Lock()
        self._done: dict[str, str] = dict(done or {})
        self._complete = False

    def checkpoint(self, item: str, result: str) -> bool:
        """Record an item's result; True if new, False if the same result was already recorded."""
        with self._lock:
            if item not in self.items:
                raise ValueError(f"{item!r} is not declared in run {self.key}")
            previous = self._done.get(item)
            if previous is not None:
                if previous != result:
                    raise ReceiptConflictError(
                        f"item {item!r} of run {self.key} is already checkpointed as {previous!r}"
                    )
                return False
            self._done[item] = result
            return True

    def remaining(self) -> tuple[str, ...]:
        """Items still to verify: where a restarted verifier resumes."""
        with self._lock:
            return tuple(i for i in self.items if i not in self._done)

    @property
    def complete(self) -> bool:
        with self._lock:
            return self._complete

    def mark_complete(self) -> None:
        """Write the terminal marker; refused while any declared item lacks a checkpoint."""
        with self._lock:
            missing = [i for i in self.items if i not in self._done]
            if missing:
                raise ValueError(f"run {self.key} is missing checkpoints for {missing}")
            self._complete = True
