"""The durable-leased-work envelope on requests: values above the loaded policy are refused.

`max_acquisitions` (item, tenant default, replay) at most the attempt cap, a lease
TTL (acquire, heartbeat, tenant default) at most the attempt timeout, a requeue or
triage delay at most the backoff cap, a tenant's backlog cap at most max-queued. A refusal is 422 `invalid-request` whose
`errors` name each field and the policy cell that bounds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from queue_server import errors
from queue_server.policy import LeasedWork, ReliabilityPolicy

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Above:
    """One request value above its ceiling."""

    loc: Loc
    value: float
    ceiling: float
    cell: str
    what: str

    @property
    def message(self) -> str:
        return (
            f"{'.'.join(str(p) for p in self.loc[1:])} {self.value:g} exceeds the policy's"
            f" {self.what} of {self.ceiling:g} ({self.cell})"
        )


class LeaseEnvelope:
    """The ceilings of durable-leased-work, read from the loaded policy."""

    def __init__(self, policy: ReliabilityPolicy) -> None:
        self.leased: LeasedWork = policy.leased_work

    def _above(
        self, value: float | None, field: str, what: str, loc: Loc, ceiling: float
    ) -> Above | None:
        if value is None or value <= ceiling:
            return None
        return Above(loc, value, ceiling, self.leased.cell(field), what)

    def budget(self, value: int | None, *loc: str | int) -> Above | None:
        """`max_acquisitions` above the attempt cap."""
        return self._above(value, "attempt_cap", "attempt cap", loc, self.leased.attempt_cap)

    def lease_ttl(self, value: float | None, *loc: str | int) -> Above | None:
        """A lease TTL above the attempt timeout."""
        return self._above(
            value, "attempt_timeout", "attempt timeout", loc, self.leased.attempt_timeout
        )

    def deadline(self, value: float | None, *loc: str | int) -> Above | None:
        """A lease deadline above the policy's."""
        return self._above(value, "deadline", "deadline", loc, self.leased.deadline)

    def backlog(self, value: int | None, *loc: str | int) -> Above | None:
        """A tenant's backlog cap above the policy's max-queued."""
        return self._above(value, "backlog_cap", "max-queued", loc, self.leased.backlog_cap)

    def held_backlog_cap(self, stored: int) -> int:
        """A tenant's stored backlog cap as admission applies it: at most max-queued (a cap
        stored under a looser policy is held to the loaded one)."""
        return min(stored, self.leased.backlog_cap)

    def delay(self, value: float | None, *loc: str | int) -> Above | None:
        """A requeue or triage delay above the backoff cap."""
        return self._above(value, "backoff_cap", "backoff cap", loc, self.leased.backoff_cap)


def refuse_above(found: Sequence[Above | None]) -> None:
    """422 invalid-request naming every field above its ceiling, and the cell; else nothing."""
    above = [a for a in found if a is not None]
    if not above:
        return
    raise errors.InvalidRequestError(
        "; ".join(a.message for a in above) + ". The policy is a maximum envelope.",
        errors=[
            {
                "loc": list(a.loc),
                "msg": f"must be at most {a.ceiling:g}, the policy's {a.what}",
                "type": "policy_envelope",
                "cell": a.cell,
                "limit": a.ceiling,
            }
            for a in above
        ],
    )
