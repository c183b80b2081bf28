"""`queue-server deliver`: claim due outbox rows and send them through the transport broker.

Many deliverers may run against one database. A delivery run claims up to a batch
of due rows (FOR UPDATE SKIP LOCKED) and, in that same committed statement, counts
the attempt and persists the instant of the next one; only then does it send. So a
deliverer killed after sending leaves the row due again at the persisted instant
(or when its claim expires), and the resend carries the same delivery key.

Together, all deliverers keep at most the class's concurrency of requests in flight
(`watcher-delivery/concurrency` of the loaded policy, or a lower
QUEUE_SERVER_DELIVERY_CONCURRENCY). One watcher's claimed rows go out one at a time and
a watcher with a claimed row gets no other claim, so a claim (serialized with every
other deliverer's by an advisory lock) takes the rows of only so many watchers that the
watchers with claimed rows stay within the bound. A row claimed by a deliverer that
died counts until its claim expires.

Each attempt is one broker run (`TransportBroker`): its own request and byte
budget, the class's attempt timeout as the request timeout, and as its wall
deadline what is left of the delivery's deadline (the class deadline counted from
the row's `deadline_from`; the database's clock says how much is left). The run
goes through the broker's guard, so whatever happens after it starts ends in a
failure receipt recorded on the row:

    2xx                                   delivered
    410 Gone                              cancelled; the watcher is disabled
    a retryable failure class             pending at the persisted instant; after the
      (the class's list: attempt-timeout,   last attempt, dead
      transport-error, dependency-
      unavailable = 5xx, rate-limited = 429)
    any other answer (3xx, 4xx), a policy dead at once, with its reason
      refusal (SSRF), a response over
      the byte budget, an unexpected error
      in the run (`run-failed: <class>`)
    the wall deadline                     dead, `deadline-exceeded`
    the deliverer stopped mid-dispatch    pending, due now (receipt `cancelled`)

The loop outlives every failure: a database that is away (killed, restarting, a
connection reset) is waited for with a capped backoff and a log line per try, an
exception from one delivery fails that delivery only, and an unexpected error of
a whole run is logged and the next run starts after the poll interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast

import orjson
import psycopg
from psycopg_pool import PoolTimeout

from queue_server import errors
from queue_server.db import Database, uncancelled
from queue_server.infra import tracing
from queue_server.infra.tasks import wait_event
from queue_server.policy import (
    FailureClass,
    OperationClass,
    ReliabilityPolicy,
    backoff_schedule,
    classify_failure,
    runtime_policy,
)
from queue_server.settings import Settings
from queue_server.store import outbox, watchers
from queue_server.store.types import Row
from queue_server.transport import (
    AllowList,
    BrokerSnapshot,
    Budget,
    BudgetExhaustedError,
    DispatchReceipt,
    DispatchResult,
    Outcome,
    PolicyRefusedError,
    RunFailedError,
    TransportBroker,
    TransportError,
    WallDeadlineExceededError,
    webhook_request,
)
from queue_server.transport.ssrf import Resolver

log = logging.getLogger(__name__)

OPERATION_CLASS = OperationClass.WATCHER_DELIVERY
# Receipts kept on one outbox row (newest last); older ones are counted as omitted.
MAX_ROW_RECEIPTS = 20
RESPONSE_PREFIX = 512
# Overdue rows moved to dead per expiry statement.
EXPIRE_BATCH = 500
# Backlogged watchers backfilled per run (each with at most the outbox cap's room).
BACKFILL_WATCHERS = 16
# While the database is away: the first retry after the poll interval, doubling to this.
MAX_OUTAGE_BACKOFF = 10.0


def schedule(scale: float = 1.0, policy: ReliabilityPolicy | None = None) -> list[float]:
    """Seconds from attempt n to attempt n + 1 (the policy's unjittered schedule, scaled)."""
    return [delay * scale for delay in backoff_schedule(OPERATION_CLASS, policy=policy)]


def failure_class(outcome: dict[str, Any]) -> FailureClass | None:
    """The named failure class of a recorded attempt, or None when it names none.

    A timeout of the request, a failure on the wire, 429 and any 5xx are the classes
    a delivery policy can call retryable; a 3xx, another 4xx, a policy refusal, a
    response over the byte budget and an unexpected error of the run are not.
    """
    kind = outcome.get("outcome")
    status = outcome.get("status")
    if kind == Outcome.TIMEOUT:
        return FailureClass.ATTEMPT_TIMEOUT
    if kind == Outcome.TRANSPORT_ERROR:
        return FailureClass.TRANSPORT_ERROR
    if kind == Outcome.HTTP_ERROR and isinstance(status, int):
        if status == 429:
            return FailureClass.RATE_LIMITED
        if 500 <= status < 600:
            return FailureClass.DEPENDENCY_UNAVAILABLE
    return None


def database_trouble(exc: BaseException) -> str | None:
    """Why `exc` says the database is away (unreachable, restarting, reset), or None."""
    if isinstance(exc, errors.ServiceUnavailableError | PoolTimeout):
        return "unavailable"
    if isinstance(exc, errors.TimeoutExceededError):
        return "too slow"
    if isinstance(exc, psycopg.OperationalError):
        return "connection failed"
    return None


@dataclass(slots=True)
class RunReport:
    """What one delivery run did."""

    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    dead: int = 0
    gone: int = 0
    released: int = 0
    returned: int = 0
    expired: int = 0
    lost: int = 0
    errors: int = 0
    # Rows written from the ledger for backlogged watchers, and the marks cleared.
    backfilled: int = 0
    caught_up: int = 0
    # Each attempt's broker run: its receipts and usage, by delivery key.
    runs: dict[str, BrokerSnapshot] = field(default_factory=dict)
    outcomes: dict[str, str] = field(default_factory=dict)


class DatabaseAwayError(Exception):
    """The database went away during a delivery run; the run stopped."""

    def __init__(self, cause: str) -> None:
        self.cause = cause
        super().__init__(cause)


class Deliverer:
    """Sends due outbox rows; `run_once` claims a batch, each attempt its own broker run."""

    def __init__(
        self,
        settings: Settings,
        conninfo: str,
        *,
        budget: Budget | None = None,
        resolver: Resolver | None = None,
        on_claimed: Callable[[list[Row]], None] | None = None,
        policy: ReliabilityPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.allow = AllowList.parse(settings.transport_allow, settings.own_ports())
        self.policy = policy or runtime_policy(settings.policy or None)
        settings.bounded_by(self.policy)
        delivery = self.policy.delivery
        # Settings may lower the policy's values, never raise them (checked just above).
        self.concurrency = settings.delivery_concurrency or delivery.concurrency
        self.attempt_timeout = settings.delivery_attempt_timeout or delivery.attempt_timeout
        # The class's deadline: a delivery still undelivered this long after its event
        # (pauses excepted) is dead; each attempt's broker run gets what is left as its
        # wall deadline.
        self.deadline = delivery.deadline
        # At most this many pending rows per watcher: the backfill writes up to it.
        self.outbox_cap = delivery.outbox_cap
        # Only these failure classes are retried; any other failure is dead at once.
        self.retryable = delivery.retryable
        # One attempt is one broker run: one request, and the bytes one response may cost.
        self.budget = budget or Budget(
            max_requests=1, max_response_bytes=settings.delivery_max_response_bytes
        )
        self.resolver = resolver
        self.on_claimed = on_claimed
        self.delays = schedule(settings.delivery_backoff_scale, self.policy)
        self.max_attempts = len(self.delays) + 1
        # Resolution and the request each get the attempt timeout; a claim outlives both.
        self.claim_lease = timedelta(seconds=2 * self.attempt_timeout + 1)
        self.db = Database.for_deliverer(settings, conninfo, concurrency=self.concurrency)
        self._swept_at: float | None = None
        # A span per delivery attempt, only with an OTLP endpoint configured.
        self._tracer = tracing.tracer("queue_server.deliverer")

    async def open(self, *, wait: bool = True) -> None:
        """Open the pool; with `wait`, fail unless the database answers now."""
        await self.db.open(wait=wait)

    async def close(self) -> None:
        await self.db.close()

    async def __aenter__(self) -> Deliverer:
        await self.open()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    # -- the loop ----------------------------------------------------------------------

    async def run_forever(self, stop: asyncio.Event | None = None) -> None:
        """Deliver until `stop` is set; an idle deliverer polls every `delivery_poll_interval`.

        Nothing a run raises ends the loop: while the database is away the next try
        waits longer each time (up to MAX_OUTAGE_BACKOFF s) and each try is logged; any
        other error is logged with its traceback and the next run starts as usual.
        """
        stop = stop or asyncio.Event()
        poll = self.settings.delivery_poll_interval
        outage: float | None = None
        while not stop.is_set():
            pause = poll
            try:
                report = await self.run_once()
            except Exception as exc:
                cause = database_trouble(exc)
                if cause is None and isinstance(exc, DatabaseAwayError):
                    cause = exc.cause
                if cause is None:
                    log.exception("a delivery run failed; the next one starts in %.1f s", poll)
                else:
                    outage = poll if outage is None else min(outage * 2, MAX_OUTAGE_BACKOFF)
                    pause = outage
                    log.warning(
                        "the database is %s (%s); retrying in %.1f s",
                        cause,
                        _describe(exc),
                        pause,
                    )
            else:
                if outage is not None:
                    log.info("the database is back; delivering again")
                    outage = None
                if (report.claimed and not report.released) or report.backfilled:
                    continue
            await wait_event(stop, pause)

    async def run_once(self) -> RunReport:
        """Move overdue rows to dead (at most once per poll interval), then claim due rows
        within the bound on deliveries in flight and send them: each time a watcher's rows
        are done, claim again, until the run has claimed `delivery_batch_size` rows."""
        token = str(uuid.uuid4())
        report = RunReport()
        now = time.monotonic()
        if self._swept_at is None or now - self._swept_at >= self.settings.delivery_poll_interval:
            # Overdue rows are swept once per poll interval, not by every busy run.
            async with self.db.conn() as conn:
                report.expired = await outbox.expire(
                    conn, deadline=self.deadline, limit=EXPIRE_BATCH
                )
            self._swept_at = now
        gate = asyncio.Semaphore(self.concurrency)
        away: list[Exception] = []
        sending: set[asyncio.Task[None]] = set()
        claimed: list[str] = []

        async def send_group(group: list[Row]) -> None:
            async with gate:
                for index, row in enumerate(group):
                    try:
                        verdict = await self._traced_deliver(row, token, report)
                    except DatabaseAwayError as exc:
                        # The rest keep their claims and are due again when those expire.
                        away.append(exc)
                        return
                    except Exception:
                        # Not the run's failure (that is recorded on the row): a fault in
                        # recording it. The row keeps its claim and is due when it expires.
                        report.errors += 1
                        log.exception("delivery %s could not be recorded", row["delivery_key"])
                        continue
                    report.outcomes[row["delivery_key"]] = verdict
                    if verdict == "released":
                        for rest in group[index + 1 :]:
                            await self._release(rest, token, report)
                        return
                    if verdict == "gone":
                        # The watcher is disabled and its other rows were cancelled.
                        return

        async def claim(limit: int) -> None:
            async with self._tx() as conn:
                rows = await outbox.claim(
                    conn,
                    limit=limit,
                    concurrency=self.concurrency,
                    token=token,
                    lease=self.claim_lease,
                    delays=self.delays,
                    deadline=self.deadline,
                    # A run sends each row at most once.
                    exclude=claimed,
                )
            report.claimed += len(rows)
            claimed.extend(str(row["delivery_id"]) for row in rows)
            if self.on_claimed is not None:
                self.on_claimed(rows)
            # One watcher's rows go out one after another, in creation order (and a claim
            # never takes a row of a watcher that has one in flight).
            groups: dict[tuple[str, str], list[Row]] = {}
            for row in rows:
                groups.setdefault((row["tenant_id"], str(row["watcher_id"])), []).append(row)
            for group in groups.values():
                sending.add(asyncio.create_task(send_group(group)))

        await claim(self.settings.delivery_batch_size)
        try:
            while sending:
                done, _ = await asyncio.wait(sending, return_when=asyncio.FIRST_COMPLETED)
                sending.difference_update(done)
                for task in done:
                    if task.exception() is not None:
                        away.append(cast(Exception, task.exception()))
                room = self.settings.delivery_batch_size - report.claimed
                if room > 0 and not away and not report.released:
                    try:
                        await claim(room)
                    except DatabaseAwayError as exc:
                        away.append(exc)
        finally:
            # Cancelled (the deliverer stops at once): each delivery in flight returns its
            # row to the outbox before the run ends.
            for task in sending:
                task.cancel()
            if sending:
                await asyncio.wait(sending)
        if away:
            raise away[0]
        await self._backfill(report)
        return report

    async def _backfill(self, report: RunReport) -> None:
        """Each backlogged watcher whose outbox has room under the cap again gets its missed
        events from the ledger, in order, as many as fit; caught up, its mark is cleared."""
        async with self._tx() as conn:
            for watcher in await outbox.lock_backlogged(conn, limit=BACKFILL_WATCHERS):
                done = await outbox.backfill(conn, watcher=watcher, cap=self.outbox_cap)
                report.backfilled += int(done["written"])
                report.caught_up += 0 if done["backlogged"] else 1

    # -- one delivery ------------------------------------------------------------------

    def _broker(self, row: Row) -> TransportBroker:
        """This attempt's run: the attempt timeout per request, the delivery's time left."""
        return TransportBroker(
            budget=self.budget,
            allow=self.allow,
            request_timeout=self.attempt_timeout,
            wall_deadline=max(float(row["deadline_in"]), 0.0),
            max_receipts=4,
            retain_bytes=RESPONSE_PREFIX,
            resolver=self.resolver,
        )

    async def _traced_deliver(self, row: Row, token: str, report: RunReport) -> str:
        """`_deliver` in a span of its own when tracing is on: the delivery, its attempt,
        the receipt's outcome and the verdict (docs/observability.md)."""
        if self._tracer is None:
            return await self._deliver(row, token, report)
        attributes = {
            "queue_server.tenant": row["tenant_id"],
            "queue_server.queue": row["queue"] or "",
            "queue_server.item_id": str(row["item_id"] or ""),
            "queue_server.watcher_id": str(row["watcher_id"]),
            "queue_server.delivery.key": row["delivery_key"],
            "queue_server.delivery.event": row["event"],
            "queue_server.delivery.attempt": int(row["attempts"]),
        }
        with tracing.span(self._tracer, f"deliver {row['event']}", **attributes) as span:
            verdict = await self._deliver(row, token, report)
            assert span is not None
            span.set_attribute("queue_server.delivery.verdict", verdict)
            return verdict

    def _note_outcome(self, outcome: dict[str, Any]) -> None:
        """The receipt's outcome on the delivery's span (tracing on only)."""
        if self._tracer is None:
            return
        from opentelemetry import trace

        noted = {
            "queue_server.delivery.outcome": outcome.get("outcome"),
            "http.response.status_code": outcome.get("status"),
            "queue_server.delivery.failure_class": outcome.get("failure_class"),
        }
        trace.get_current_span().set_attributes(
            {name: value for name, value in noted.items() if value is not None}
        )

    async def _deliver(self, row: Row, token: str, report: RunReport) -> str:
        """Send one claimed row in its own broker run and record the outcome; the verdict."""
        attempt = int(row["attempts"])
        if attempt > self.max_attempts:
            # The deliverer that held the last attempt stopped before recording it.
            outcome = {"attempt": attempt - 1, "outcome": "abandoned", "status": None}
            reason = f"abandoned: attempt {attempt - 1} was never recorded"
            return await self._record(row, token, "dead", outcome, [], report, reason)
        broker = self._broker(row)
        key = row["delivery_key"]
        try:
            # Every run that starts ends in a receipt: an unexpected error inside becomes
            # RunFailedError carrying what the broker had committed.
            with broker.guard():
                result = await broker.dispatch(self._request(row))
        except asyncio.CancelledError:
            report.runs[key] = broker.snapshot()
            try:
                await uncancelled(self._cancelled(row, token, broker.snapshot(), report))
            except Exception:
                # The claim expires and the row is due again then.
                log.exception("delivery %s: could not return it to the outbox", key)
            raise
        except BudgetExhaustedError as exc:
            report.runs[key] = broker.snapshot()
            if exc.receipt is None:
                # Refused before any socket: not an attempt, nothing charged to the row.
                await self._release(row, token, report)
                return "released"
            outcome = _failure(exc, attempt)
            reason = f"response-budget-exhausted: {exc.detail}"
            return await self._record(row, token, "dead", outcome, [exc.receipt], report, reason)
        except WallDeadlineExceededError as exc:
            report.runs[key] = broker.snapshot()
            outcome = {**_failure(exc, attempt), "outcome": "deadline_exceeded"}
            reason = f"deadline-exceeded: not delivered within {self.deadline:g} s of its event"
            receipts = [exc.receipt] if exc.receipt is not None else []
            return await self._record(row, token, "dead", outcome, receipts, report, reason)
        except PolicyRefusedError as exc:
            report.runs[key] = broker.snapshot()
            outcome = {
                "attempt": attempt,
                "outcome": "policy_refused",
                "status": None,
                "detail": exc.detail,
            }
            reason = f"policy-refused: {exc.detail}"
            return await self._record(row, token, "dead", outcome, [], report, reason)
        except RunFailedError as exc:
            report.runs[key] = broker.snapshot()
            error = exc.__cause__ or exc
            log.error("delivery %s: the run failed: %r", key, error)
            outcome = {
                "attempt": attempt,
                "outcome": "run_failed",
                "status": None,
                "error": type(error).__name__,
                "detail": str(error)[:200],
            }
            # Retried only if the error names a retryable class (an OSError that is a
            # transient I/O failure could); a bug, a bad secret or bad data names none.
            named = classify_failure(error)
            reason = f"run-failed: {type(error).__name__}"
            return await self._retry_or_dead(
                row, token, attempt, outcome, list(exc.receipts), report, named, reason
            )
        except TransportError as exc:
            report.runs[key] = broker.snapshot()
            receipts = [exc.receipt] if exc.receipt is not None else []
            outcome = _failure(exc, attempt)
            return await self._retry_or_dead(row, token, attempt, outcome, receipts, report)
        report.runs[key] = broker.snapshot()
        return await self._answered(row, token, attempt, result, report)

    def _request(self, row: Row) -> Any:
        secrets = [row["secret"]]
        if row["previous_secret"]:
            secrets.append(row["previous_secret"])
        return webhook_request(
            row["url"],
            secrets=secrets,
            delivery_key=row["delivery_key"],
            body=orjson.dumps(row["body"]),
            timestamp=row["claimed_at"],
            timeout=self.attempt_timeout,
        )

    async def _answered(
        self, row: Row, token: str, attempt: int, result: DispatchResult, report: RunReport
    ) -> str:
        outcome = {
            "attempt": attempt,
            "outcome": result.outcome.value,
            "status": result.status,
            "response_prefix": result.body[:RESPONSE_PREFIX].decode("utf-8", "replace"),
        }
        if result.ok:
            return await self._record(row, token, "delivered", outcome, [result.receipt], report)
        if result.status == 410:
            return await self._gone(row, token, outcome, result.receipt, report)
        return await self._retry_or_dead(row, token, attempt, outcome, [result.receipt], report)

    async def _retry_or_dead(
        self,
        row: Row,
        token: str,
        attempt: int,
        outcome: dict[str, Any],
        receipts: list[DispatchReceipt],
        report: RunReport,
        named: FailureClass | None = None,
        reason: str | None = None,
    ) -> str:
        """Retried at the persisted instant if its class is retryable and attempts are left."""
        named = named or failure_class(outcome)
        outcome["failure_class"] = named.value if named else None
        if named is None or named not in self.retryable:
            reason = reason or f"not-retryable: {_what(outcome)}"
            return await self._record(row, token, "dead", outcome, receipts, report, reason)
        if attempt >= self.max_attempts:
            reason = f"attempts-exhausted: {attempt} attempts, the last {_what(outcome)}"
            return await self._record(row, token, "dead", outcome, receipts, report, reason)
        return await self._record(row, token, "pending", outcome, receipts, report)

    async def _release(self, row: Row, token: str, report: RunReport) -> None:
        async with self._conn() as conn:
            await outbox.release(conn, row=row, token=token)
        report.released += 1
        report.outcomes[row["delivery_key"]] = "released"

    async def _cancelled(
        self, row: Row, token: str, snapshot: BrokerSnapshot, report: RunReport
    ) -> None:
        """The deliverer stopped mid-dispatch: back to the outbox, due now, receipt kept."""
        if not snapshot.receipts:
            await self._release(row, token, report)
            return
        outcome = {"attempt": int(row["attempts"]), "outcome": "cancelled", "status": None}
        kept, omitted = _merge_receipts(row, list(snapshot.receipts), outcome["attempt"])
        async with self._conn() as conn:
            await outbox.return_to_outbox(
                conn, row=row, token=token, outcome=outcome, receipts=kept, omitted=omitted
            )
        report.returned += 1
        log.info("delivery %s: stopped mid-dispatch, back in the outbox", row["delivery_key"])

    async def _record(
        self,
        row: Row,
        token: str,
        state: str,
        outcome: dict[str, Any],
        receipts: list[DispatchReceipt],
        report: RunReport,
        reason: str = "",
    ) -> str:
        self._note_outcome(outcome)
        kept, omitted = _merge_receipts(row, receipts, outcome.get("attempt"))
        async with self._conn() as conn:
            recorded = await outbox.record(
                conn,
                row=row,
                token=token,
                state=state,
                outcome=outcome,
                receipts=kept,
                omitted=omitted,
                lease=self.claim_lease,
                reason=reason,
            )
        if recorded is None:
            # The watcher was cancelled meanwhile, or the claim expired and was taken over.
            report.lost += 1
            return "lost"
        verdict = {"delivered": "delivered", "dead": "dead"}.get(state, "failed")
        setattr(report, verdict, getattr(report, verdict) + 1)
        log.info(
            "delivery %s attempt %s: %s%s",
            row["delivery_key"],
            outcome.get("attempt"),
            verdict,
            f" ({reason})" if reason else "",
        )
        return verdict

    async def _gone(
        self,
        row: Row,
        token: str,
        outcome: dict[str, Any],
        receipt: DispatchReceipt,
        report: RunReport,
    ) -> str:
        self._note_outcome(outcome)
        kept, omitted = _merge_receipts(row, [receipt], outcome.get("attempt"))
        async with self._tx() as conn:
            recorded = await outbox.record(
                conn,
                row=row,
                token=token,
                state="cancelled",
                outcome=outcome,
                receipts=kept,
                omitted=omitted,
                lease=self.claim_lease,
            )
            if recorded is None:
                report.lost += 1
                return "lost"
            await watchers.cancel_watcher(
                conn,
                tenant=row["tenant_id"],
                watcher_id=str(row["watcher_id"]),
                disabled_reason="the receiver answered 410 Gone",
                except_delivery=str(row["delivery_id"]),
            )
        report.gone += 1
        log.info("delivery %s: 410 Gone, watcher disabled", row["delivery_key"])
        return "gone"

    # -- the database, with its absence made one error ----------------------------------

    @contextlib.asynccontextmanager
    async def _conn(self) -> Any:
        try:
            async with self.db.conn() as conn:
                yield conn
        except Exception as exc:
            cause = database_trouble(exc)
            if cause is None:
                raise
            raise DatabaseAwayError(f"{cause} ({_describe(exc)})") from exc

    @contextlib.asynccontextmanager
    async def _tx(self) -> Any:
        try:
            async with self.db.tx() as conn:
                yield conn
        except Exception as exc:
            cause = database_trouble(exc)
            if cause is None:
                raise
            raise DatabaseAwayError(f"{cause} ({_describe(exc)})") from exc


def _describe(exc: BaseException) -> str:
    """The first line of an error and of its cause, for a log line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    cause = exc.__cause__
    if cause is not None and str(cause).strip():
        text += f": {str(cause).strip().splitlines()[0]}"
    return text


def _what(outcome: dict[str, Any]) -> str:
    """A failed attempt in words: `the receiver answered 404`, `timeout`, ..."""
    if outcome.get("status") is not None:
        return f"the receiver answered {outcome['status']}"
    if outcome.get("error"):
        return f"{outcome['outcome']} ({outcome['error']})"
    return str(outcome.get("outcome"))


def _failure(exc: TransportError, attempt: int) -> dict[str, Any]:
    receipt = exc.receipt
    return {
        "attempt": attempt,
        "outcome": receipt.outcome.value if receipt else type(exc).__name__,
        "status": receipt.status if receipt else None,
        "error": receipt.error if receipt else None,
        "detail": exc.detail,
    }


def _merge_receipts(
    row: Row, receipts: list[DispatchReceipt], attempt: Any
) -> tuple[list[dict[str, Any]], int]:
    """The row's receipts plus this attempt's, newest last, bounded; overflow is counted."""
    stored: list[dict[str, Any]] = list(row["receipts"] or [])
    stored += [{**r.to_dict(), "attempt": attempt} for r in receipts]
    overflow = max(0, len(stored) - MAX_ROW_RECEIPTS)
    return stored[overflow:], int(row["receipts_omitted"]) + overflow
