"""What the thread worker and the asyncio worker share: a handler's instructions, the outcome
of an item, what to submit for it, and the pace that sizes prefetching.

Both workers are schedulers around these pieces. An item's life in a worker:

    acquired --> waiting (prefetched) --> running (handler) --> settling (outcome queued)
       |              |                       |                      '--> settled: Result
       '--------------+-----------------------+--> lost (heartbeat refused): nothing submitted
"""

from __future__ import annotations

import json
import os
import platform
import re
import traceback as tracebacks
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import TracebackType
from typing import Any, Literal, TypeVar

from queue_server.client import errors
from queue_server.client.client import new_idempotency_key
from queue_server.client.models import Lease

# One acquire leases at most this many items (`AcquireIn.max_items` of
# queue_server/api/schemas.py: 1..100).
MAX_ACQUIRE = 100
# A batch of outcomes stays well under the API's 1 MiB body limit.
MAX_BATCH_BYTES = 512 * 1024


class TransientError(Exception):
    """Raise from a handler: the failure is transient; the item is requeued, due again after
    `delay` seconds, or by default after the queue's backoff (1 s, 2 s, 4 s ... for its
    first, second, third acquisition, capped). A delay above the policy's backoff cap
    sends the item back at the cap, with a warning naming it."""

    def __init__(self, *args: object, delay: float | None = None) -> None:
        super().__init__(*args)
        self.delay = delay


class Quarantine(Exception):  # noqa: N818 - an instruction, not an error condition
    """Raise from a handler: the item can never succeed; quarantine it now."""


class Requeue(Exception):  # noqa: N818 - an instruction, not an error condition
    """Raise from a handler: give the item back untouched (no failure is recorded), due again
    after `delay` seconds (at most the policy's durable-leased-work backoff cap)."""

    def __init__(self, *args: object, delay: float = 0.0) -> None:
        super().__init__(*args)
        self.delay = delay


class Outcome(StrEnum):
    COMPLETED = "completed"
    REQUEUED = "requeued"
    TRIAGED = "triaged"
    QUARANTINED = "quarantined"
    LOST = "lost"
    UNSUBMITTED = "unsubmitted"


@dataclass(frozen=True)
class Result:
    item_id: str
    fence: int
    outcome: Outcome
    detail: str = ""


class Stage(StrEnum):
    WAITING = "waiting"
    RUNNING = "running"
    SETTLING = "settling"
    SETTLED = "settled"


@dataclass(eq=False)
class LeaseFacts:
    """The lease a handler works under, and the worker's bookkeeping of it."""

    lease: Lease
    worker: str
    stage: Stage = field(default=Stage.WAITING, repr=False)
    beat_at: float = field(default=0.0, repr=False)  # monotonic: acquired or last extended
    expires_at: float = field(default=0.0, repr=False)  # monotonic: when the lease runs out
    result: Result | None = field(default=None, repr=False)
    # Why the lease was lost (the server's refusal code), when it was.
    lost_reason: str = field(default="", repr=False)

    @property
    def item_id(self) -> str:
        return self.lease.item_id

    @property
    def fence(self) -> int:
        return self.lease.fence

    @property
    def payload(self) -> Any:
        return self.lease.payload

    @property
    def acquisition_count(self) -> int:
        return self.lease.acquisition_count


def default_worker_name() -> str:
    """hostname-pid, cut to the API's name pattern."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", platform.node()) or "host"
    return f"{host[:50]}-{os.getpid()}".lstrip("._-") or f"worker-{os.getpid()}"


@dataclass(slots=True)  # not frozen: its __init__ would set each of 13 fields the slow way
class Submission:
    """What the server is told about one item: complete, requeue or triage, under its own key."""

    kind: Literal["complete", "requeue", "triage"]
    outcome: Outcome
    detail: str = ""
    result: Any = None
    size: int = 0
    reason: str = ""
    failure_class: str = ""
    message: str = ""
    traceback: str | None = None
    transient: bool = False
    quarantine: bool = False
    # Seconds, or "backoff": the server's delay for the item's acquisition count.
    delay: float | Literal["backoff"] = 0.0
    key: str = field(default_factory=new_idempotency_key)


def verdict(value: Any, failure: BaseException | None) -> Submission:
    """The submission for a handler's return value, or for the exception it raised."""
    if failure is None:
        if value is None:  # what most handlers return: no encoding to try
            return Submission("complete", Outcome.COMPLETED, result=None, size=4)
        try:
            size = len(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError) as exc:
            failure = TypeError(f"the handler's result cannot be sent as JSON: {exc}")
        else:
            return Submission("complete", Outcome.COMPLETED, result=value, size=size)
    if isinstance(failure, Requeue):
        return Submission(
            "requeue", Outcome.REQUEUED, str(failure), reason=str(failure), delay=failure.delay
        )
    quarantine = isinstance(failure, Quarantine)
    # A failure the handler chose no delay for goes back after the queue's backoff.
    delay: float | Literal["backoff"] = "backoff"
    if quarantine:
        delay = 0.0
    elif isinstance(failure, TransientError) and failure.delay is not None:
        delay = failure.delay
    return Submission(
        "triage",
        Outcome.QUARANTINED if quarantine else Outcome.TRIAGED,
        str(failure),
        failure_class=type(failure).__name__,
        message=str(failure)[:4000],
        traceback=failure_traceback(failure),
        transient=isinstance(failure, TransientError),
        quarantine=quarantine,
        delay=delay,
    )


# What a triage may carry as failure.traceback (the server's bound).
TRACEBACK_MAX_BYTES = 16 * 1024


# The SDK's own source files: the frames of a handler's traceback that are the worker's.
_SDK_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _from_the_handler(failure: BaseException) -> TracebackType | None:
    """The exception's traceback from its first frame outside the SDK (the handler's); the
    whole of it when every frame is the SDK's (a failure of the worker itself)."""
    first = failure.__traceback__
    frame = first
    while frame is not None and frame.tb_frame.f_code.co_filename.startswith(_SDK_DIR):
        frame = frame.tb_next
    return frame if frame is not None else first


def failure_traceback(failure: BaseException) -> str:
    """What the worker saw fail, for the item page and the ledger: the exception's own
    account when it carries one (`queue-server work`: the command's stderr), else Python's
    traceback from the handler's frame on (the worker's frames that called it are left out);
    its last 16 KiB of UTF-8 (the end is where it failed)."""
    told = getattr(failure, "traceback_text", None)
    if isinstance(told, str):
        text = told
    else:
        lines = tracebacks.format_exception(type(failure), failure, _from_the_handler(failure))
        text = "".join(lines)
    data = text.encode("utf-8", errors="replace")
    if len(data) <= TRACEBACK_MAX_BYTES:
        return data.decode("utf-8")
    return data[-TRACEBACK_MAX_BYTES:].decode("utf-8", errors="ignore")


def give_back() -> Submission:
    """A prefetched lease returned unstarted when the worker stops."""
    return Submission("requeue", Outcome.REQUEUED, "worker stopping", reason="worker stopping")


def envelope_limit(error: errors.QueueClientError, field: str) -> tuple[float, str] | None:
    """The ceiling and its policy cell when the server refused `field` above the envelope
    (422 invalid-request, an `errors` entry of type policy_envelope); else None."""
    if not isinstance(error, errors.ProblemError) or error.status != 422:
        return None
    for entry in error.body.get("errors") or []:
        if (
            isinstance(entry, dict)
            and entry.get("type") == "policy_envelope"
            and list(entry.get("loc") or [])[-1:] == [field]
            and isinstance(entry.get("limit"), int | float)
        ):
            return float(entry["limit"]), str(entry.get("cell", ""))
    return None


def settled(facts: LeaseFacts, sub: Submission, error: errors.QueueClientError | None) -> Result:
    """The result of a submission: done, refused (the lease was lost), or not delivered."""
    if error is None:
        return Result(facts.item_id, facts.fence, sub.outcome, sub.detail)
    if isinstance(error, errors.LeaseLostError):
        return Result(
            facts.item_id, facts.fence, Outcome.LOST, f"the server refused the outcome: {error}"
        )
    # The lease will expire and the item will be handed out again.
    return Result(
        facts.item_id, facts.fence, Outcome.UNSUBMITTED, f"could not submit the outcome: {error}"
    )


def lost(facts: LeaseFacts) -> Result:
    why = f" ({facts.lost_reason})" if facts.lost_reason else ""
    return Result(
        facts.item_id, facts.fence, Outcome.LOST, f"the lease was lost{why}; nothing was submitted"
    )


F = TypeVar("F", bound=LeaseFacts)


def batches(subs: Sequence[tuple[F, Submission]], limit: int) -> list[list[tuple[F, Submission]]]:
    """Completions cut into requests of at most `limit` entries and MAX_BATCH_BYTES."""
    out: list[list[tuple[F, Submission]]] = []
    current: list[tuple[F, Submission]] = []
    size = 0
    for pair in subs:
        cost = pair[1].size + 120
        if current and (len(current) >= limit or size + cost > MAX_BATCH_BYTES):
            out.append(current)
            current, size = [], 0
        current.append(pair)
        size += cost
    if current:
        out.append(current)
    return out


def refuses_whole_batch(exc: errors.QueueClientError) -> bool:
    """A batch refused as a request (one entry invalid, too large): send its entries singly."""
    return isinstance(exc, errors.ProblemError) and exc.status in (400, 413, 422)


def is_lease_lost(error: errors.QueueClientError) -> bool:
    return isinstance(error, errors.LeaseLostError | errors.NotFoundError)


class Pace:
    """How many leases may wait for a free slot (prefetch).

    Fixed when given; otherwise enough to cover one acquire round trip at the
    current pace (slots x acquire time / handler time), at most `cap`. A slow
    handler therefore holds no extra lease, and a fast one never waits for an
    acquire; a waiting lease waits about one round trip.
    """

    def __init__(self, fixed: int | None, cap: int = MAX_ACQUIRE) -> None:
        self.fixed = fixed
        self.cap = cap
        self.handler_s: float | None = None
        self.acquire_s: float | None = None

    @staticmethod
    def _ewma(old: float | None, sample: float) -> float:
        return sample if old is None else old * 0.8 + sample * 0.2

    def handled(self, seconds: float) -> None:
        self.handler_s = self._ewma(self.handler_s, seconds)

    def acquired(self, seconds: float) -> None:
        # A long poll that waited for work says nothing about the round trip.
        self.acquire_s = self._ewma(self.acquire_s, min(seconds, 0.05))

    def prefetch(self, slots: int) -> int:
        if self.fixed is not None:
            return self.fixed
        if self.handler_s is None or self.acquire_s is None:
            return 0
        # Rounded: a handler slower than an acquire round trip gets no prefetch at all.
        return min(self.cap, round(slots * self.acquire_s / max(self.handler_s, 1e-5)))


def want(
    *,
    slots: int,
    running: int,
    waiting: int,
    held: int,
    limit: int,
    prefetch: int,
    remaining: int | None,
) -> int:
    """How many leases to ask for now: free slots plus the prefetch, within every bound."""
    n = slots - running + prefetch - waiting
    n = min(n, limit - held, MAX_ACQUIRE)
    if remaining is not None:
        n = min(n, remaining)
    return max(0, n)
