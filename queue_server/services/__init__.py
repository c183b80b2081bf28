"""Transaction boundaries and policy, one module per concern; each service is built once.

    keys          who is calling; API keys and the first admin key
    tenants       tenants and their settings
    items         enqueue, read, acquire (long-polled), heartbeat, complete, requeue, triage
    queues        spend approvals, concurrency limits, queue status
    queue_settings  a queue's lease TTL, deadline, budget and retry backoff, below the envelope
    dead_letters  list, show, replay, discard, bulk replay
    ledgers       ledger verification: each item's events fold to its row
    figures       what /metrics publishes of queues, watchers and the database's health
    watchers      webhook subscriptions and their deliveries
    receipts      confirmation receipts of confirmed mutations
    runs          artifact verification runs and their checkpoints
    schedules     periodic enqueues and the scheduler pass that fires them
    policies      the policy versions the server has run under, and those an admin publishes

A service takes the `Database` (and, for effecting requests, the idempotency
`Effects`) it was built with; the statements are in `queue_server.store`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from queue_server.db import Database
from queue_server.idempotency import Effects
from queue_server.infra.metrics import Metrics
from queue_server.policy import ReliabilityPolicy, runtime_policy
from queue_server.services.dead_letters import DeadLetters
from queue_server.services.figures import Figures
from queue_server.services.items import Items
from queue_server.services.keys import Keys
from queue_server.services.leases import Leases, Wakeups
from queue_server.services.ledgers import Ledgers
from queue_server.services.policies import Adopt, PolicyHistory
from queue_server.services.queue_settings import QueueSettings
from queue_server.services.queues import Queues
from queue_server.services.receipts import ConfirmationReceipts
from queue_server.services.runs import VerificationRuns
from queue_server.services.schedules import Schedules
from queue_server.services.tenants import Tenants
from queue_server.services.watchers import Watchers
from queue_server.settings import Settings

__all__ = [
    "ConfirmationReceipts",
    "DeadLetters",
    "Figures",
    "Items",
    "Keys",
    "Leases",
    "Ledgers",
    "PolicyHistory",
    "QueueSettings",
    "Queues",
    "Schedules",
    "Services",
    "Tenants",
    "VerificationRuns",
    "Watchers",
]


@dataclass(frozen=True, slots=True)
class Services:
    """Every service of one API process, built once when the app is created."""

    keys: Keys
    tenants: Tenants
    items: Items
    leases: Leases
    queues: Queues
    queue_settings: QueueSettings
    dead_letters: DeadLetters
    ledgers: Ledgers
    watchers: Watchers
    receipts: ConfirmationReceipts
    runs: VerificationRuns
    schedules: Schedules
    figures: Figures
    policies: PolicyHistory

    @classmethod
    def build(
        cls,
        settings: Settings,
        db: Database,
        *,
        keys: Keys,
        wakeups: Wakeups,
        metrics: Metrics,
        policy: ReliabilityPolicy | None = None,
        pinned: bool = False,
        adopt: Adopt | None = None,
    ) -> Services:
        """Every service, under `policy` (default: the one `settings.policy` names); `adopt`
        runs a published version in this process (none when `pinned` to a policy file)."""
        policy = policy or runtime_policy(settings.policy or None)
        effects = Effects(
            db,
            retention=settings.idempotency_retention,
            problem_base_uri=settings.problem_base_uri,
        )
        items = Items(db, effects, settings, policy=policy, wakeups=wakeups)
        return cls(
            keys=keys,
            tenants=Tenants(db, policy, on_keys_deleted=keys.cache.clear),
            items=items,
            leases=Leases(db, effects, settings, wakeups=wakeups, metrics=metrics, policy=policy),
            queues=Queues(
                db,
                effects,
                policy,
                approval_warning=timedelta(seconds=settings.approval_warning_seconds),
            ),
            queue_settings=QueueSettings(db, effects, policy),
            dead_letters=DeadLetters(db, effects, policy),
            ledgers=Ledgers(db),
            watchers=Watchers(db, effects, settings),
            receipts=ConfirmationReceipts(db, effects, policy),
            runs=VerificationRuns(db, effects, policy),
            schedules=Schedules(db, effects, items, settings, metrics),
            figures=Figures(
                db,
                horizon_warning_age=settings.horizon_warning_age,
                approval_warning=timedelta(seconds=settings.approval_warning_seconds),
            ),
            policies=PolicyHistory(
                db,
                policy,
                receipt_retention=settings.idempotency_retention,
                pinned=pinned,
                adopt=adopt,
            ),
        )
