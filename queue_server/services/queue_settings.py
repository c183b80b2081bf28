"""A queue's own settings, below the loaded policy's envelope, and what they resolve to.

    lease_ttl         a lease's TTL when the acquire or heartbeat asks for none
                      queue -> tenant default_lease_ttl -> policy attempt-timeout
    deadline          the longest life of one lease from its acquisition
                      queue -> policy deadline
    max_acquisitions  an item's acquisition budget when its enqueue gives none
                      queue -> tenant default_max_acquisitions -> policy retry
    retry             the delay of `"delay": "backoff"` on requeue and triage:
                      min(cap, base * 2 ** (acquisitions - 1)), times a uniform draw
                      in [0, 1) with full jitter; base 1 s, cap the policy's
                      backoff cap, no jitter unless the queue sets them
    rate_limit        at most `limit` leases in any `per` seconds, over the queue or per
                      partition key (`partitioned`); none unless the queue sets one
    fairness          how a priority's due items are handed out: by when each became due
                      (`arrival`, the default), or round-robin between their partition
                      keys (`partition_key`), so that a key that floods the queue does
                      not hold back the others
    ordering_dead_letters  whether an item of an ordering key that goes to dead letters
                      lets the next of its key go (`release`, the default) or holds
                      the key until it is replayed or discarded (`hold`)

Every value is at most the loaded policy's (a PUT above it is 422 naming the field and
the cell); a value stored under a looser policy is held to the loaded one when read.
The statements that use the settings (enqueue, acquire, heartbeat, requeue, triage) read
them in SQL, in the same statement (store/sql/transitions.sql); this module validates,
stores and explains them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from queue_server import auth, errors
from queue_server.db import Database
from queue_server.idempotency import Answer, Effects, Idempotency
from queue_server.models import Role
from queue_server.policy import LeasedWork, ReliabilityPolicy
from queue_server.services.common import WORKER_OR_OPERATOR
from queue_server.services.envelope import Above, LeaseEnvelope, refuse_above
from queue_server.store import cursors
from queue_server.store import queues as queue_store
from queue_server.store.types import Conn, Row

# What a dead letter does to the next item of its ordering key unless the queue says.
DEFAULT_ORDERING_DEAD_LETTERS = "release"
# How a queue hands out a priority's due items unless it says.
DEFAULT_FAIRNESS = "arrival"

# The server's own defaults of the retry settings, below every policy's backoff cap.
DEFAULT_RETRY_BASE = 1.0
DEFAULT_RETRY_FACTOR = 2.0
DEFAULT_RETRY_JITTER = False


@dataclass(frozen=True, slots=True)
class RetrySettings:
    base: float | None = None
    cap: float | None = None
    jitter: bool | None = None


@dataclass(frozen=True, slots=True)
class RateLimit:
    limit: int
    per: float  # seconds
    partitioned: bool = False


@dataclass(frozen=True, slots=True)
class QueueSettingsIn:
    """The queue's own values; None: inherit (the tenant's default, else the policy's)."""

    lease_ttl: float | None = None
    deadline: float | None = None
    max_acquisitions: int | None = None
    retry: RetrySettings = RetrySettings()
    ordering_dead_letters: str | None = None
    rate_limit: RateLimit | None = None
    fairness: str | None = None


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


def _value(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "source": source}


def _first(ceiling: float | None, *given: tuple[Any, str], otherwise: tuple[Any, str]) -> Any:
    """The first value given (at most `ceiling`) with its source, else `otherwise`."""
    for value, source in given:
        if value is not None:
            return _value(value if ceiling is None else min(value, ceiling), source)
    return _value(*otherwise)


def effective(row: Row, leased: LeasedWork) -> dict[str, Any]:
    """Each setting's effective value and where it comes from: `queue`, `tenant`, `policy`
    or `default` (the server's retry defaults: base 1 s, no jitter)."""
    ttl, deadline_cap = leased.attempt_timeout, leased.deadline
    lease_ttl = _first(
        ttl,
        (_seconds(row["lease_ttl"]), "queue"),
        (_seconds(row["default_lease_ttl"]), "tenant"),
        otherwise=(ttl, "policy"),
    )
    deadline = _first(
        deadline_cap, (_seconds(row["deadline"]), "queue"), otherwise=(deadline_cap, "policy")
    )
    budget = _first(
        leased.attempt_cap,
        (row["max_acquisitions"], "queue"),
        (row["default_max_acquisitions"], "tenant"),
        otherwise=(leased.attempt_cap, "policy"),
    )
    cap = _first(
        leased.backoff_cap, (row["retry_cap"], "queue"), otherwise=(leased.backoff_cap, "policy")
    )
    base = _first(
        cap["value"],
        (row["retry_base"], "queue"),
        otherwise=(min(DEFAULT_RETRY_BASE, cap["value"]), "default"),
    )
    jitter = _first(
        None, (row["retry_jitter"], "queue"), otherwise=(DEFAULT_RETRY_JITTER, "default")
    )
    return {
        "lease_ttl": lease_ttl,
        "deadline": deadline,
        "max_acquisitions": budget,
        "retry": {
            "base": base,
            "factor": _value(DEFAULT_RETRY_FACTOR, "default"),
            "cap": cap,
            "jitter": jitter,
        },
        "rate_limit": (
            _value(
                {
                    "limit": row["rate_limit"],
                    "per": _seconds(row["rate_interval"]),
                    "partitioned": row["rate_partitioned"],
                },
                "queue",
            )
            if row["rate_limit"] is not None
            else _value(None, "default")
        ),
        "ordering_dead_letters": _first(
            None,
            (row["ordering_dead_letters"], "queue"),
            otherwise=(DEFAULT_ORDERING_DEAD_LETTERS, "default"),
        ),
        "fairness": _first(
            None,
            (row["fairness"] if row["fairness"] != DEFAULT_FAIRNESS else None, "queue"),
            otherwise=(DEFAULT_FAIRNESS, "default"),
        ),
        "updated_at": row["settings_updated_at"],
        "updated_by": row["settings_updated_by"],
    }


class QueueSettings:
    """PUT and GET of a queue's settings (`/v1/tenants/{t}/queues/{q}/settings`)."""

    def __init__(self, db: Database, effects: Effects, policy: ReliabilityPolicy) -> None:
        self.db = db
        self.effects = effects
        self.envelope = LeaseEnvelope(policy)

    def _refuse_above_envelope(self, given: QueueSettingsIn) -> None:
        leased = self.envelope.leased
        found: list[Above | None] = [
            self.envelope.lease_ttl(given.lease_ttl, "body", "lease_ttl"),
            self.envelope.deadline(given.deadline, "body", "deadline"),
            self.envelope.budget(given.max_acquisitions, "body", "max_acquisitions"),
            self.envelope.delay(given.retry.cap, "body", "retry", "cap"),
            self.envelope.delay(given.retry.base, "body", "retry", "base"),
        ]
        refuse_above(found)
        deadline = given.deadline if given.deadline is not None else leased.deadline
        problems = []
        if given.lease_ttl is not None and given.lease_ttl > deadline:
            problems.append(
                {
                    "loc": ["body", "lease_ttl"],
                    "msg": f"must be at most the deadline, {deadline:g} s",
                    "type": "value_error",
                }
            )
        cap = given.retry.cap if given.retry.cap is not None else leased.backoff_cap
        if given.retry.base is not None and given.retry.base > cap:
            problems.append(
                {
                    "loc": ["body", "retry", "base"],
                    "msg": f"must be at most the retry cap, {cap:g} s",
                    "type": "value_error",
                }
            )
        if problems:
            raise errors.InvalidRequestError(
                "; ".join(f"{'.'.join(p['loc'][1:])} {p['msg']}" for p in problems) + ".",
                errors=problems,
            )

    async def put(
        self,
        principal: auth.Principal,
        tenant: str,
        queue: str,
        given: QueueSettingsIn,
        idem: Idempotency,
        *,
        instance: str,
    ) -> Answer:
        """Replace the queue's own settings (operator); every value at most the envelope's."""
        principal.require(tenant, Role.OPERATOR)
        self._refuse_above_envelope(given)

        def interval(seconds: float | None) -> timedelta | None:
            return None if seconds is None else timedelta(seconds=seconds)

        async def operation(conn: Conn) -> Answer:
            terms = await queue_store.terms(conn, tenant=tenant, queue=queue)
            if terms is None:
                raise errors.TenantNotFoundError(tenant=tenant)
            await queue_store.put_settings(
                conn,
                tenant=tenant,
                queue=queue,
                actor=principal.actor,
                lease_ttl=interval(given.lease_ttl),
                deadline=interval(given.deadline),
                max_acquisitions=given.max_acquisitions,
                retry_base=given.retry.base,
                retry_cap=given.retry.cap,
                retry_jitter=given.retry.jitter,
                ordering_dead_letters=given.ordering_dead_letters or DEFAULT_ORDERING_DEAD_LETTERS,
                rate_limit=None if given.rate_limit is None else given.rate_limit.limit,
                rate_interval=None if given.rate_limit is None else interval(given.rate_limit.per),
                rate_partitioned=given.rate_limit is not None and given.rate_limit.partitioned,
                fairness=given.fairness or DEFAULT_FAIRNESS,
            )
            return Answer.of(200, await self._settings(conn, tenant, queue))

        answer = await self.effects.run(tenant, idem, instance, operation)
        # Committed: this process's cursors on the queue may be of the other fairness now.
        cursors.forget(tenant, queue)
        return answer

    async def get(self, principal: auth.Principal, tenant: str, queue: str) -> Answer:
        """Each effective setting of the queue and where it comes from."""
        principal.require(tenant, *WORKER_OR_OPERATOR)
        async with self.db.conn() as conn:
            return Answer.of(200, await self._settings(conn, tenant, queue))

    async def _settings(self, conn: Conn, tenant: str, queue: str) -> dict[str, Any]:
        row = await queue_store.terms(conn, tenant=tenant, queue=queue)
        if row is None:
            raise errors.TenantNotFoundError(tenant=tenant)
        return {"tenant": tenant, "queue": queue, **effective(row, self.envelope.leased)}
