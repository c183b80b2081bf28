"""Prometheus metrics of the API (a registry per app, so tests can build many apps).

With several worker processes (`queue-server serve --workers N`), the server sets
PROMETHEUS_MULTIPROC_DIR before starting them: every process writes its counters and
histograms there (prometheus_client's multiprocess mode), and `/metrics`, whichever
process answers it, adds up all of them. Items by state are read at scrape time.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare_multiprocess(directory: Path) -> None:
    """Point every worker process started after this at `directory`, emptied first."""
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()
    os.environ[MULTIPROC_ENV] = str(directory)


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

        self.database_unavailable = Counter(
            "queue_server_database_unavailable",
            "Requests answered 503 because the database connection failed, by cause"
            " (pool-timeout, connection-lost, read-only, protocol)",
            ["cause"],
            registry=self.registry,
        )
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

    def render(self, items: Iterable[dict[str, Any]] = ()) -> bytes:
        """The text format: this process's metrics, or every process's in multiprocess mode,
        then items by tenant and state as read now."""
        directory = os.environ.get(MULTIPROC_ENV)
        if directory:
            merged = CollectorRegistry()
            MultiProcessCollector(merged, path=directory)  # type: ignore[no-untyped-call]
            text = generate_latest(merged)
        else:
            text = generate_latest(self.registry)
        gauge = GaugeMetricFamily(
            "queue_server_items", "Work items by tenant and state, read at scrape time",
            labels=["tenant", "state"],
        )  # fmt: skip
        for row in items:
            gauge.add_metric([row["tenant_id"], row["state"]], row["n"])
        scrape = CollectorRegistry()
        scrape.register(_Once(gauge))
        return text + generate_latest(scrape)


class _Once:
    """A collector of one metric family already read."""

    def __init__(self, family: GaugeMetricFamily) -> None:
        self.family = family

    def collect(self) -> Iterable[GaugeMetricFamily]:
        yield self.family
