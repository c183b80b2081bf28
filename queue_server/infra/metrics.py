"""Prometheus metrics: each API process's request counters and latency histograms, and the
figures of queues and watchers read from the database at scrape time.

With several worker processes (`queue-server serve --workers N`, or `--metrics-listen`),
PROMETHEUS_MULTIPROC_DIR is set before the workers start: every process writes its
counters and histograms there (prometheus_client's multiprocess mode) and a scrape,
whichever process answers it, adds them all up. The figures come from the database, so
they are the same whichever process (or the metrics listener) reads them.

A registry per app, so tests can build many apps in one process.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

LATENCY_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# Why a request was answered 503 for want of the database (db.py's on_unavailable).
UNAVAILABLE_CAUSES = ("pool-timeout", "connection-lost", "read-only", "protocol")
STATES = ("ready", "leased", "completed", "quarantined", "cancelled")
# From an item's becoming due to its lease: a busy queue's wait, up to an hour's backlog.
WAIT_BUCKETS = (*LATENCY_BUCKETS, 60.0, 300.0, 900.0, 3600.0)


def prepare_multiprocess(directory: Path) -> None:
    """Point every worker process started after this at `directory`, emptied first: this
    process's metrics made from now on too (with one worker, uvicorn serves in this process,
    and the metrics listener reads only the directory)."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(directory)
    # prometheus_client picks its value store when it is imported, which was before this.
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]


# The directory of one `serve`'s processes, under the temporary directory: the prefix and
# the pid of the `serve` that made it, so a later start knows whose it was.
DIR_PREFIX = "queue-server-metrics-"


def new_multiprocess_dir() -> tempfile.TemporaryDirectory[str]:
    """A directory for this `serve`'s processes, removed when it stops. Those of servers that
    ended without removing theirs (SIGKILL, a power cut) are removed first: each holds a
    file per process it ran, and the next start is the first to know they are not needed."""
    remove_orphaned_dirs(Path(tempfile.gettempdir()))
    return tempfile.TemporaryDirectory(prefix=f"{DIR_PREFIX}{os.getpid()}-")


def remove_orphaned_dirs(root: Path) -> list[Path]:
    """Remove the metrics directories under `root` that are this user's and whose `serve`
    has ended; the removed ones. A directory of a process still running, of another user,
    or not named by a pid (an older version's) is left alone."""
    removed = []
    for path in root.glob(f"{DIR_PREFIX}*-*"):
        pid = path.name.removeprefix(DIR_PREFIX).split("-", 1)[0]
        try:
            if not pid.isdigit() or path.lstat().st_uid != os.geteuid() or _running(int(pid)):
                continue
        except OSError:
            continue  # gone meanwhile
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_ENV) or None


# What an operator's scrape shows besides its own tenant's series: the health of the server
# it depends on. Every other series without a tenant label counts everyone's traffic (requests
# and latency by route, acquire and schedule latency): the admin's and the metrics listener's.
SERVER_HEALTH = frozenset(
    {
        "queue_server_listener_connected",
        "queue_server_listener_disconnects",
        "queue_server_database_unavailable",
        "queue_server_backup_last_good_age_seconds",
        "queue_server_backup_last_archived_wal_age_seconds",
    }
)


def process_families(registry: CollectorRegistry, *, tenant: str | None = None) -> list[Metric]:
    """The processes' own metrics (every process's in multiprocess mode); with `tenant`, only
    series labelled with that tenant, and those of the server's health (SERVER_HEALTH)."""
    directory = multiprocess_dir()
    if directory is not None:
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    families = list(registry.collect())
    if tenant is None:
        return families
    shown = []
    for family in families:
        shared = family.name in SERVER_HEALTH
        family.samples = [
            s
            for s in family.samples
            if s.labels.get("tenant") == tenant or (shared and "tenant" not in s.labels)
        ]
        if family.samples or shared:
            shown.append(family)
    return shown


def process_metrics(registry: CollectorRegistry) -> bytes:
    """The text of the processes' own metrics: every process's in multiprocess mode."""
    return _text(process_families(registry))


def _text(families: list[Metric]) -> bytes:
    registry = CollectorRegistry()
    registry.register(_Families(families))
    return generate_latest(registry)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "queue_server_requests",
            "HTTP requests by route template, method and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "queue_server_request_seconds",
            "HTTP request latency by route template",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.acquire_seconds = Histogram(
            "queue_server_acquire_seconds",
            "Latency of one acquire transaction (without long-poll waiting)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.lease_wait_seconds = Histogram(
            "queue_server_lease_wait_seconds",
            "From an item's becoming due (its enqueue, delay or requeue) to its lease, by the"
            " database's clock; an expired lease's time counts as waiting",
            ["tenant", "queue"],
            buckets=WAIT_BUCKETS,
            registry=self.registry,
        )
        self.late_leases = Counter(
            "queue_server_late_leases",
            "Leases that came later after their item became due than the lease-wait"
            " objective (slo_lease_wait_seconds)",
            ["tenant", "queue"],
            registry=self.registry,
        )
        self.database_unavailable = Counter(
            "queue_server_database_unavailable",
            "Requests answered 503 because the database connection failed, by cause"
            " (pool-timeout, connection-lost, read-only, protocol)",
            ["cause"],
            registry=self.registry,
        )
        # Each cause at zero from the start: a rule's increase() sees the first 503 too.
        for cause in UNAVAILABLE_CAUSES:
            self.database_unavailable.labels(cause)
        self.listener_connected = Gauge(
            "queue_server_listener_connected",
            "1 while the LISTEN session (wake-ups, key revocation) is up, 0 while polling",
            registry=self.registry,
            # With several processes: one series per process (a `pid` label).
            multiprocess_mode="all",
        )
        self.listener_disconnects = Counter(
            "queue_server_listener_disconnects",
            "LISTEN sessions lost since the process started",
            registry=self.registry,
        )
        self.watch_looks = Counter(
            "queue_server_wakeup_watch_looks",
            "Looks of the wake-up watch for rows made ready (one statement each): every"
            " watch_interval while an acquire waits in the process, none while none does",
            registry=self.registry,
        )

        self.schedule_fires = Counter(
            "queue_server_schedule_fires",
            "Items enqueued by schedules (ticks and manual triggers), by tenant and schedule",
            ["tenant", "schedule"],
            registry=self.registry,
        )
        self.schedule_refusals = Counter(
            "queue_server_schedule_refusals",
            "Schedule fires refused at the tenant's backlog cap, by tenant and schedule",
            ["tenant", "schedule"],
            registry=self.registry,
        )
        self.schedule_skipped = Counter(
            "queue_server_schedule_skipped_ticks",
            "Missed ticks dropped by the catch-up rule, by tenant and schedule",
            ["tenant", "schedule"],
            registry=self.registry,
        )
        self.schedule_lag_seconds = Histogram(
            "queue_server_schedule_lag_seconds",
            "From a tick's instant to its item's enqueue (database clock)",
            buckets=(*LATENCY_BUCKETS, 60.0, 300.0, 3600.0),
            registry=self.registry,
        )

    def observe_leases(
        self, tenant: str, queue: str, rows: Sequence[dict[str, Any]], *, late_after: float
    ) -> None:
        """Each new lease's wait since its item became due; those over `late_after` seconds
        are counted late too (the lease-wait objective's bad events)."""
        wait = self.lease_wait_seconds.labels(tenant, queue)
        late = 0
        for row in rows:
            seconds = max((row["leased_at"] - row["available_at"]).total_seconds(), 0.0)
            wait.observe(seconds)
            late += seconds > late_after
        # Created at zero on the first lease, so a rate of it exists before anything is late.
        self.late_leases.labels(tenant, queue).inc(late)

    def render(
        self,
        snapshot: Any | None = None,
        *,
        tenant: str | None = None,
        backup_ages: dict[str, float] | None = None,
        objectives: dict[str, float] | None = None,
    ) -> bytes:
        """The processes' metrics, then the figures of `snapshot` (a `services.figures`
        Snapshot: tenants, queues, watchers, the horizon's holders, the hot tables), then
        the backup repository's ages. With `tenant`, only series of that tenant and the
        server's health (the horizon, the backups) are shown: the hot tables' row versions
        count every tenant's traffic."""
        families = process_families(self.registry, tenant=tenant)
        if snapshot is not None:
            families += figure_families(snapshot.tenants, snapshot.queues, snapshot.watchers)
            families += approval_families(snapshot.approvals)
            families += horizon_families(snapshot.horizon)
            if tenant is None:
                families += table_families(snapshot.tables)
        if backup_ages is not None:
            families += backup_families(backup_ages)
        if objectives is not None:
            families.append(objective_family(objectives))
        return _text(families)


class _Families:
    """A collector of metric families already read."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def figure_families(
    tenants: Iterable[str], queues: Sequence[dict[str, Any]], watchers: Sequence[dict[str, Any]]
) -> list[Metric]:
    """Prometheus families of the figures: every state of every known queue (zero as zero)."""
    q = ["tenant", "queue"]
    items = GaugeMetricFamily(
        "queue_server_queue_items", "Work items of the queue by state", labels=[*q, "state"]
    )
    ready_age = GaugeMetricFamily(
        "queue_server_queue_oldest_ready_age_seconds",
        "How long the queue's oldest due item has waited (0 when none)",
        labels=q,
    )
    lease_age = GaugeMetricFamily(
        "queue_server_queue_oldest_lease_age_seconds",
        "How long ago the queue's oldest active lease began (0 when none)",
        labels=q,
    )
    active = GaugeMetricFamily(
        "queue_server_queue_active_leases", "Leases not expired yet", labels=q
    )
    letters = GaugeMetricFamily(
        "queue_server_queue_open_dead_letters", "Item dead letters not yet resolved", labels=q
    )
    paused = GaugeMetricFamily("queue_server_queue_paused", "1 while the queue is paused", labels=q)
    completions = CounterMetricFamily(
        "queue_server_queue_completions", "Items completed since the queue began", labels=q
    )
    failures = CounterMetricFamily(
        "queue_server_queue_failures", "Failures reported by triage", labels=q
    )
    quarantines = CounterMetricFamily(
        "queue_server_queue_quarantines",
        "Items quarantined (by triage or past their acquisition budget)",
        labels=q,
    )
    by_tenant: dict[str, dict[str, int]] = {t: dict.fromkeys(STATES, 0) for t in tenants}
    for f in queues:
        labels = [f["tenant"], f["queue"]]
        for state in STATES:
            n = f["states"][state]
            items.add_metric([*labels, state], n)
            by_tenant.setdefault(f["tenant"], dict.fromkeys(STATES, 0))[state] += n
        ready_age.add_metric(labels, f["oldest_ready_age"] or 0.0)
        lease_age.add_metric(labels, f["oldest_lease_age"] or 0.0)
        active.add_metric(labels, f["active_leases"])
        letters.add_metric(labels, f["open_dead_letters"])
        paused.add_metric(labels, 1 if f["paused"] else 0)
        completions.add_metric(labels, f["completions"]["total"])
        failures.add_metric(labels, f["failures"]["total"])
        quarantines.add_metric(labels, f["quarantines"])
    tenant_items = GaugeMetricFamily(
        "queue_server_items", "Work items by tenant and state", labels=["tenant", "state"]
    )
    for tenant, counts in sorted(by_tenant.items()):
        for state in STATES:
            tenant_items.add_metric([tenant, state], counts[state])
    deliveries = GaugeMetricFamily(
        "queue_server_watcher_deliveries",
        "Webhook deliveries of the watcher waiting to be sent (pending) or given up (dead)",
        labels=["tenant", "watcher", "state"],
    )
    backlogged = GaugeMetricFamily(
        "queue_server_watcher_backlogged",
        "1 while the watcher is past its outbox cap (its new events wait in the ledger)",
        labels=["tenant", "watcher"],
    )
    lag = GaugeMetricFamily(
        "queue_server_watcher_oldest_pending_age_seconds",
        "How long ago the event of the watcher's oldest pending delivery was written (0 when"
        " none is pending): the webhooks' delivery lag",
        labels=["tenant", "watcher"],
    )
    for w in watchers:
        for state in ("pending", "dead"):
            deliveries.add_metric([w["tenant"], w["watcher_id"], state], w[state])
        backlogged.add_metric([w["tenant"], w["watcher_id"]], w["backlogged"])
        lag.add_metric([w["tenant"], w["watcher_id"]], w["oldest_pending_age"])
    return [
        items,
        tenant_items,
        ready_age,
        lease_age,
        active,
        letters,
        paused,
        completions,
        failures,
        quarantines,
        deliveries,
        backlogged,
        lag,
    ]


def approval_families(approvals: Iterable[dict[str, Any]]) -> list[Metric]:
    """Per queue with a live spend approval, the seconds until the one behind its approved
    limit expires, and 1 while that is within the server's warning window (then the queue
    falls back to the policy's concurrency unless another approval is recorded)."""
    q = ["tenant", "queue"]
    expiry = GaugeMetricFamily(
        "queue_server_spend_approval_expiry_seconds",
        "Seconds until the spend approval behind the queue's concurrency limit expires",
        labels=q,
    )
    expiring = GaugeMetricFamily(
        "queue_server_spend_approval_expiring",
        "1 while the spend approval behind the queue's concurrency limit expires within the"
        " server's warning window (QUEUE_SERVER_APPROVAL_WARNING_SECONDS)",
        labels=q,
    )
    for a in approvals:
        labels = [a["tenant"], a["queue"]]
        expiry.add_metric(labels, a["expires_in"])
        expiring.add_metric(labels, 1 if a["expiring"] else 0)
    return [expiry, expiring]


def objective_family(objectives: dict[str, float]) -> Metric:
    """The service level objectives the server runs with (`Settings.objectives`): the alert
    rules of deploy/prometheus/ compare each indicator with its objective read from here."""
    family = GaugeMetricFamily(
        "queue_server_slo_objective",
        "A service level objective of the server (docs/slos.md), from its settings",
        labels=["objective"],
    )
    for name, value in sorted(objectives.items()):
        family.add_metric([name], value)
    return family


def backup_families(ages: dict[str, float]) -> list[Metric]:
    """The backup repository's ages (`serve --backup-repo`); a family is left out while there
    is nothing to be old (no backup yet, no WAL yet): alert on its absence too."""
    families: list[Metric] = []
    if "last_good_backup" in ages:
        backup = GaugeMetricFamily(
            "queue_server_backup_last_good_age_seconds",
            "Seconds since the newest complete base backup in the repository ended",
        )
        backup.add_metric([], ages["last_good_backup"])
        families.append(backup)
    if "last_archived_wal" in ages:
        wal = GaugeMetricFamily(
            "queue_server_backup_last_archived_wal_age_seconds",
            "Seconds since the newest WAL in the repository was written (the segment being"
            " streamed counts): how much a restore would lose if the database were lost now,"
            " while it is writing",
        )
        wal.add_metric([], ages["last_archived_wal"])
        families.append(wal)
    return families


def horizon_families(holders: Iterable[Any]) -> list[Metric]:
    """What holds back the database's xmin horizon (`services.figures.Horizon`s), by kind of
    holder: how many, the oldest one's age in seconds (snapshots and prepared transactions:
    slots keep no time) and in transactions. Zero when there is none: alert on the age."""
    labels = ["holder"]
    age = GaugeMetricFamily(
        "queue_server_database_horizon_age_seconds",
        "Seconds the oldest snapshot (a transaction or statement of any session, by its"
        " backend_xmin) or prepared transaction has held back the database's xmin horizon:"
        " no row version deleted or updated since can be reclaimed (0 when none)",
        labels=labels,
    )
    xid_age = GaugeMetricFamily(
        "queue_server_database_horizon_xid_age",
        "Transactions the oldest holder of the xmin horizon lags behind the current one"
        " (age() of its backend_xmin, of a replication slot's xmin or catalog_xmin, of a"
        " prepared transaction; 0 when none)",
        labels=labels,
    )
    count = GaugeMetricFamily(
        "queue_server_database_horizon_holders",
        "Sessions with a snapshot, replication slots with an xmin, prepared transactions",
        labels=labels,
    )
    for h in holders:
        if h.holder != "replication_slot":
            age.add_metric([h.holder], h.age_seconds or 0.0)
        xid_age.add_metric([h.holder], h.xid_age)
        count.add_metric([h.holder], h.holders)
    return [age, xid_age, count]


def table_families(tables: Iterable[dict[str, Any]]) -> list[Metric]:
    """Live and dead row versions of each hot table (pg_stat_user_tables' estimates)."""
    live = GaugeMetricFamily(
        "queue_server_table_live_tuples",
        "Live row versions of the table (the statistics collector's estimate)",
        labels=["table"],
    )
    dead = GaugeMetricFamily(
        "queue_server_table_dead_tuples",
        "Dead row versions of the table not yet vacuumed: they grow while the xmin"
        " horizon is held, and every scan of the table walks them",
        labels=["table"],
    )
    for t in tables:
        live.add_metric([t["table"]], t["live"])
        dead.add_metric([t["table"]], t["dead"])
    return [live, dead]
