"""`queue-server deliver`: claim due outbox rows and send them through the transport broker.

Many deliverers may run against one database. Each delivery run claims up to a
batch of due rows (FOR UPDATE SKIP LOCKED) and, in that same committed statement,
counts the attempt and persists the instant of the next one; only then does it
send. So a deliverer killed after sending leaves the row due again at the
persisted instant (or when its claim expires), and the resend carries the same
delivery key. One TransportBroker per run holds the run's request and byte
budget; a dispatch the budget refuses never reaches a socket and the row is
released as if it had not been claimed.

Outcomes: 2xx delivered; 410 Gone cancels the row and disables the watcher
(its pending rows are cancelled); anything else fails the attempt, and after the
last one (5, counting the first) the row is dead-lettered as kind `delivery`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import orjson

from queue_server.db import Database
from queue_server.policy import ReliabilityPolicy, backoff_schedule, runtime_policy
from queue_server.settings import Settings
from queue_server.store import outbox, watchers
from queue_server.store.types import Row
from queue_server.transport import (
    BrokerSnapshot,
    Budget,
    BudgetExhaustedError,
    DispatchReceipt,
    PolicyRefusedError,
    TransportBroker,
    TransportError,
    WallDeadlineExceededError,
    webhook_request,
)
from queue_server.transport.policy import Resolver

log = logging.getLogger(__name__)

OPERATION_CLASS = "watcher-delivery"
# Receipts kept on one outbox row (newest last); older ones are counted as omitted.
MAX_ROW_RECEIPTS = 20
RESPONSE_PREFIX = 512


def schedule(scale: float = 1.0) -> list[float]:
    """Seconds from attempt n to attempt n + 1 (the policy's unjittered schedule, scaled)."""
    return [delay * scale for delay in backoff_schedule(OPERATION_CLASS)]


@dataclass(slots=True)
class RunReport:
    """What one delivery run did."""

    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    dead: int = 0
    gone: int = 0
    released: int = 0
    lost: int = 0
    snapshot: BrokerSnapshot | None = None
    outcomes: dict[str, str] = field(default_factory=dict)


class Deliverer:
    """Sends due outbox rows; `run_once` is one delivery run with its own broker and budget."""

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
        self.policy = policy or runtime_policy(settings.policy or None)
        settings.bounded_by(self.policy)
        delivery = self.policy.delivery
        # Settings may lower the policy's values, never raise them (checked just above).
        self.concurrency = settings.delivery_concurrency or delivery.concurrency
        self.attempt_timeout = settings.delivery_attempt_timeout or delivery.attempt_timeout
        self.budget = budget or Budget(
            max_requests=settings.delivery_batch_size,
            max_response_bytes=settings.delivery_max_response_bytes,
        )
        self.resolver = resolver
        self.on_claimed = on_claimed
        self.delays = schedule(settings.delivery_backoff_scale)
        self.max_attempts = len(self.delays) + 1
        # Resolution and the request each get the attempt timeout; a claim outlives both.
        self.claim_lease = timedelta(seconds=2 * self.attempt_timeout + 1)
        self.db = Database.for_deliverer(settings, conninfo, concurrency=self.concurrency)

    async def open(self) -> None:
        await self.db.open(wait=True)

    async def close(self) -> None:
        await self.db.close()

    async def __aenter__(self) -> Deliverer:
        await self.open()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def run_forever(self, stop: asyncio.Event | None = None) -> None:
        """Deliver until `stop` is set; an idle deliverer polls every `delivery_poll_interval`."""
        stop = stop or asyncio.Event()
        while not stop.is_set():
            try:
                report = await self.run_once()
            except OSError as exc:
                log.warning("delivery run failed: %s", exc)
                report = RunReport()
            if report.claimed == 0 or report.released:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.settings.delivery_poll_interval)

    async def run_once(self) -> RunReport:
        """Claim a batch of due rows and send them through one broker."""
        broker = TransportBroker(
            budget=self.budget,
            allow=self.settings.transport_allow,
            request_timeout=self.attempt_timeout,
            max_receipts=max(self.settings.delivery_batch_size, 1) * 2,
            retain_bytes=RESPONSE_PREFIX,
            resolver=self.resolver,
        )
        token = str(uuid.uuid4())
        async with self.db.conn() as conn:
            rows = await outbox.claim(
                conn,
                limit=self.settings.delivery_batch_size,
                token=token,
                lease=self.claim_lease,
                delays=self.delays,
            )
        report = RunReport(claimed=len(rows))
        if self.on_claimed is not None:
            self.on_claimed(rows)
        # One watcher's rows go out one after another, in creation order.
        groups: dict[tuple[str, str], list[Row]] = {}
        for row in rows:
            groups.setdefault((row["tenant_id"], str(row["watcher_id"])), []).append(row)
        gate = asyncio.Semaphore(self.concurrency)

        async def send_group(group: list[Row]) -> None:
            async with gate:
                for index, row in enumerate(group):
                    verdict = await self._deliver(broker, row, token, report)
                    report.outcomes[row["delivery_key"]] = verdict
                    if verdict == "released":
                        for rest in group[index + 1 :]:
                            await self._release(rest, token, report)
                        return
                    if verdict == "gone":
                        # The watcher is disabled and its other rows were cancelled.
                        return

        await asyncio.gather(*(send_group(g) for g in groups.values()))
        report.snapshot = broker.snapshot()
        return report

    async def _release(self, row: Row, token: str, report: RunReport) -> None:
        async with self.db.conn() as conn:
            await outbox.release(conn, row=row, token=token)
        report.released += 1
        report.outcomes[row["delivery_key"]] = "released"

    async def _deliver(
        self, broker: TransportBroker, row: Row, token: str, report: RunReport
    ) -> str:
        """Send one claimed row and record its outcome; returns the verdict."""
        attempt = int(row["attempts"])
        if attempt > self.max_attempts:
            # The deliverer that held the last attempt stopped before recording it.
            outcome = {"attempt": attempt - 1, "outcome": "abandoned", "status": None}
            return await self._record(row, token, "dead", outcome, [], report)
        secrets = [row["secret"]]
        if row["previous_secret"]:
            secrets.append(row["previous_secret"])
        request = webhook_request(
            row["url"],
            secrets=secrets,
            delivery_key=row["delivery_key"],
            body=orjson.dumps(row["body"]),
            timestamp=row["claimed_at"],
            timeout=self.attempt_timeout,
        )
        try:
            result = await broker.dispatch(request)
        except (BudgetExhaustedError, WallDeadlineExceededError) as exc:
            if exc.receipt is None:
                # Refused before any socket: not an attempt, nothing charged to the row.
                await self._release(row, token, report)
                return "released"
            return await self._failed(row, token, attempt, _outcome(exc, attempt), exc, report)
        except PolicyRefusedError as exc:
            outcome = {
                "attempt": attempt,
                "outcome": "policy_refused",
                "status": None,
                "detail": exc.detail,
            }
            return await self._failed(row, token, attempt, outcome, exc, report)
        except TransportError as exc:
            return await self._failed(row, token, attempt, _outcome(exc, attempt), exc, report)
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
        return await self._failed(row, token, attempt, outcome, None, report, result.receipt)

    async def _failed(
        self,
        row: Row,
        token: str,
        attempt: int,
        outcome: dict[str, Any],
        exc: TransportError | None,
        report: RunReport,
        receipt: DispatchReceipt | None = None,
    ) -> str:
        receipts = [receipt] if receipt is not None else []
        if exc is not None and exc.receipt is not None:
            receipts = [exc.receipt]
        state = "dead" if attempt >= self.max_attempts else "pending"
        return await self._record(row, token, state, outcome, receipts, report)

    async def _record(
        self,
        row: Row,
        token: str,
        state: str,
        outcome: dict[str, Any],
        receipts: list[DispatchReceipt],
        report: RunReport,
    ) -> str:
        kept, omitted = _merge_receipts(row, receipts, outcome.get("attempt"))
        reason = f"delivery failed after {outcome.get('attempt')} attempts"
        async with self.db.conn() as conn:
            recorded = await outbox.record(
                conn,
                row=row,
                token=token,
                state=state,
                outcome=outcome,
                receipts=kept,
                omitted=omitted,
                reason=reason,
            )
        if recorded is None:
            # The watcher was cancelled meanwhile, or the claim expired and was taken over.
            report.lost += 1
            return "lost"
        verdict = {"delivered": "delivered", "dead": "dead"}.get(state, "failed")
        setattr(report, verdict, getattr(report, verdict) + 1)
        log.info("delivery %s attempt %s: %s", row["delivery_key"], outcome.get("attempt"), verdict)
        return verdict

    async def _gone(
        self,
        row: Row,
        token: str,
        outcome: dict[str, Any],
        receipt: DispatchReceipt,
        report: RunReport,
    ) -> str:
        kept, omitted = _merge_receipts(row, [receipt], outcome.get("attempt"))
        async with self.db.tx() as conn:
            recorded = await outbox.record(
                conn,
                row=row,
                token=token,
                state="cancelled",
                outcome=outcome,
                receipts=kept,
                omitted=omitted,
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


def _outcome(exc: TransportError, attempt: int) -> dict[str, Any]:
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
