"""Server settings, read from QUEUE_SERVER_* environment variables."""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import platformdirs
from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from queue_server.policy.errors import PolicyError
from queue_server.policy.runtime import at_most
from queue_server.policy.values import ReliabilityPolicy

# As root, PostgreSQL runs as a system user, which cannot reach into root's home.
ROOT_DATA_DIR = Path("/var/lib/queue-server")


def default_data_dir() -> Path:
    """Where the embedded PostgreSQL and the admin key live unless told otherwise: the user's
    data directory, or /var/lib/queue-server as root (one made by an older version under
    root's home is still used while it is there)."""
    home = Path(platformdirs.user_data_dir("queue-server"))
    if os.geteuid() != 0 or ((home / "pgdata").exists() and not ROOT_DATA_DIR.exists()):
        return home
    return ROOT_DATA_DIR


class Settings(BaseSettings):
    """Everything the API process needs; built once and passed to `create_app`."""

    model_config = SettingsConfigDict(env_prefix="QUEUE_SERVER_", extra="ignore")

    # The operation-reliability policy document (the JSON `queue-server policy show --json`
    # prints); empty: the built-in operation-reliability.v2. QUEUE_SERVER_POLICY.
    policy: str = ""
    # A libpq URL (postgresql://user@host/db?host=/socket/dir). Empty: embedded PostgreSQL.
    database_url: str = ""
    data_dir: Path = Field(default_factory=default_data_dir)
    # A Barman repository directory for the embedded database (`serve --backup-repo`):
    # WAL is streamed into it while the server runs, and `queue-server backup create`
    # takes base backups there. Empty: no backups. docs/backup.md.
    backup_repo: Path | None = None
    # How long backups are kept: "7d" / "4w" (a recovery window: every point in time that
    # recent can be restored) or "3" (the newest three full backups). Empty: kept forever.
    backup_retention: str = ""
    # How often the server runs the repository's maintenance (archive streamed WAL, expire
    # backups past their retention, restart the WAL receiver if it stopped).
    backup_maintenance_interval: float = Field(default=30.0, gt=0)
    # "transaction": DATABASE_URL is a pooler in transaction mode (PgBouncer). Nothing is
    # kept on a session between transactions: no settings sent at connect (they become
    # the role's defaults in the database), no prepared statements unless
    # PREPARED_STATEMENTS says the pooler keeps them, LISTEN over LISTEN_DATABASE_URL.
    database_pooler: Literal["none", "transaction"] = "none"
    # A direct session to the primary for LISTEN (wake-ups, key revocation); through
    # HAProxy in a Patroni setup. Empty: DATABASE_URL (not allowed through a pooler).
    listen_database_url: str = ""
    # Seconds the notification listener's last sign of life (a notification or an
    # answered probe, sent every third of this) vouches for the per-process key cache:
    # with the listener half-open, a key revoked elsewhere is refused here after at
    # most this long.
    key_cache_trust: float = Field(default=5.0, gt=0, le=30)
    # Prepare every statement (generic plans). Default: on, unless through a transaction
    # pooler (PgBouncer before 1.21 cannot keep prepared statements).
    prepared_statements: bool | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    # Each process's pool of database connections: opened with POOL_MIN_SIZE, grown up to
    # POOL_MAX_SIZE. `serve` caps POOL_MAX_SIZE at each process's share of the connection
    # budget, and refuses to start when a share is below POOL_MIN_SIZE (infra/budget.py).
    pool_min_size: int = Field(default=4, ge=1)
    pool_max_size: int = Field(default=20, ge=1)
    # Database connections `serve` leaves for everyone else: psql, pg_dump, `queue-server
    # deliver` (the delivery concurrency + 1), applications enqueuing in their transactions.
    database_reserve: int = Field(default=10, ge=0)
    # The most database connections `serve` may use in all, its reserve included. Unset:
    # the database's max_connections less its superuser-reserved slots. Through a
    # transaction pooler: the pooler's limit for this server (unset: pools unchecked).
    database_budget: int | None = Field(default=None, ge=1)
    # How long a request waits for a pooled connection before answering 503
    # (while the database is down, every request waits this long).
    pool_timeout: float = Field(default=3.0, gt=0)
    # A 429 at the backlog cap is answered after this pause: a tenant hammering its full
    # backlog is slowed to a few requests per second per connection, at no CPU cost,
    # so it cannot crowd out other tenants' requests.
    cap_refusal_delay: float = Field(default=0.1, ge=0)
    # Idempotency receipts are kept at least this long (the API promises 24 hours).
    idempotency_retention: timedelta = timedelta(hours=24)
    # How often the retention sweeper deletes finished items past their tenant's retention
    # (and receipts past theirs), and how many rows one of its transactions deletes at most.
    retention_interval: float = Field(default=60.0, gt=0)
    retention_batch: int = Field(default=1000, ge=1, le=100_000)
    problem_base_uri: str = "https://queue-server.dev/problems"
    # Upper bound on any one statement and on waiting for a row lock, so a
    # blocked request answers with a problem instead of hanging.
    statement_timeout_ms: int = Field(default=15_000, ge=100)
    lock_timeout_ms: int = Field(default=5_000, ge=50)
    # The server's own sessions end when they sit idle inside a transaction this long: such
    # a transaction holds its locks and its snapshot, and while a snapshot is held no dead
    # row version younger than it is reclaimed (docs/operators.md#a-held-snapshot).
    idle_in_transaction_timeout_ms: int = Field(default=60_000, ge=100)
    # The console's queues page warns once a session's snapshot (or a prepared
    # transaction) has held the database's xmin horizon back this many seconds.
    horizon_warning_age: float = Field(default=300.0, gt=0)
    max_body_bytes: int = 1024 * 1024
    # Slow and idle clients (queue_server.infra.http_protocol): seconds to send a request's
    # headers (an idle new connection is closed then), then its body; seconds of silence
    # between requests; open connections per server process.
    # A console session's life in seconds (it ends sooner at sign-out or when its key is
    # revoked).
    console_session_ttl: float = Field(default=12 * 3600.0, gt=0, le=30 * 86400.0)
    header_timeout: float = Field(default=20.0, gt=0)
    body_timeout: float = Field(default=60.0, gt=0)
    keep_alive_timeout: float = Field(default=5.0, ge=1)
    max_connections: int = Field(default=1024, ge=1)
    # Of those, what one client address may hold (None: max(8, max_connections // 4));
    # behind a reverse proxy, set it to max_connections.
    max_connections_per_address: int | None = Field(default=None, ge=1)
    # A long-poll acquire re-checks at least this often even without a notification
    # (expired leases and delayed items become due without one).
    poll_interval: float = Field(default=1.0, gt=0)
    # While acquires wait in a process, it looks this often for rows made ready since its
    # last look, and wakes their queues' waiters (an enqueue sends no notification); 0: no
    # look (notifications and poll_interval alone).
    watch_interval: float = Field(default=0.01, ge=0, le=1.0)
    # Watcher URLs may reach these hosts or networks although they are loopback or
    # private (e.g. ["127.0.0.1"] for a local receiver). JSON list in the environment.
    transport_allow: list[str] = Field(default_factory=list)
    # Multiplies the watcher-delivery backoff schedule (30 s, 2 min, 8 min, 32 min);
    # below 1 only to run the real schedule's shape quickly in tests and demos.
    delivery_backoff_scale: float = Field(default=1.0, gt=0)
    # How often an idle `queue-server deliver` looks for due outbox rows.
    delivery_poll_interval: float = Field(default=1.0, gt=0)
    # Rows claimed at once; each attempt is a transport broker run of its own.
    delivery_batch_size: int = Field(default=32, ge=1, le=1000)
    # Dispatches in flight at once; unset: the policy's watcher-delivery/concurrency (4).
    # May lower the policy's value, never raise it.
    delivery_concurrency: int | None = Field(default=None, ge=1)
    # Per-attempt timeout; unset: the policy's watcher-delivery/attempt-timeout (10 s).
    # May lower the policy's value, never raise it.
    delivery_attempt_timeout: float | None = Field(default=None, gt=0)
    # Response-body bytes one delivery attempt (one broker run) may read.
    delivery_max_response_bytes: int = Field(default=4 * 1024 * 1024, ge=0)
    # How often the server ends verification runs past their deadline (artifact-verification).
    run_sweep_interval: float = Field(default=10.0, gt=0)
    # After a secret rotation the previous secret also signs for this long.
    watcher_secret_grace: timedelta = timedelta(hours=24)
    # Every API process runs a scheduler loop: it wakes when the next schedule is due, and
    # at least this often to see schedules created or changed meanwhile.
    schedule_poll_interval: float = Field(default=1.0, gt=0, le=60)
    # A spend approval expiring within this many seconds is shown as expiring: in the
    # queue's concurrency answer and console page, in /metrics (an alert's threshold) and
    # in the log of the workers of its queue.
    approval_warning_seconds: float = Field(default=86400.0, ge=0)
    # A server without --policy runs the published policy version activated last: the one
    # that published it at once, every other API process within this many seconds.
    policy_poll_interval: float = Field(default=5.0, gt=0, le=300)
    # A tick at most this many seconds old is on time and always fires; an older one was
    # missed (the servers were down) and its schedule's catch-up rule decides.
    schedule_grace: float = Field(default=15.0, ge=0)

    # The service level objectives (docs/slos.md): /metrics publishes each as
    # queue_server_slo_objective{objective=...}, and the rules of deploy/prometheus/ read
    # them from there. A lease is late when it comes more than `slo_lease_wait_seconds`
    # after its item became due; at most 1 - `slo_lease_wait_target` of leases may be.
    slo_lease_wait_seconds: float = Field(default=10.0, gt=0)
    slo_lease_wait_target: float = Field(default=0.99, gt=0, lt=1)
    # At most 1 - this of API requests may be answered 5xx.
    slo_api_availability: float = Field(default=0.999, gt=0, lt=1)
    # The API's p99 latency, long-poll acquires left out.
    slo_api_latency_p99_seconds: float = Field(default=0.5, gt=0)
    # At most this share of the items a queue finishes may end in dead letters.
    slo_dead_letter_ratio: float = Field(default=0.01, gt=0, lt=1)
    # No due item waits longer than this; no webhook delivery is pending longer than this.
    slo_oldest_ready_seconds: float = Field(default=300.0, gt=0)
    slo_delivery_lag_seconds: float = Field(default=300.0, gt=0)
    # No snapshot holds back the database's horizon longer than this.
    slo_horizon_age_seconds: float = Field(default=600.0, gt=0)

    def objectives(self) -> dict[str, float]:
        """The objectives by name, as /metrics publishes them."""
        return {
            name.removeprefix("slo_"): float(getattr(self, name))
            for name in type(self).model_fields
            if name.startswith("slo_")
        }

    @model_validator(mode="after")
    def _listener_needs_a_session(self) -> Settings:
        if self.database_pooler == "transaction" and not self.listen_database_url:
            raise ValueError(
                "QUEUE_SERVER_LISTEN_DATABASE_URL is required with"
                " QUEUE_SERVER_DATABASE_POOLER=transaction: LISTEN through a transaction"
                " pooler delivers nothing; point it at the primary directly (e.g. HAProxy)"
            )
        return self

    @model_validator(mode="after")
    def _pool_min_within_max(self) -> Settings:
        if self.pool_min_size > self.pool_max_size:
            raise ValueError(
                f"QUEUE_SERVER_POOL_MIN_SIZE ({self.pool_min_size}) is above"
                f" QUEUE_SERVER_POOL_MAX_SIZE ({self.pool_max_size}): a pool opens its minimum"
                " at start and never grows past its maximum; lower the one or raise the other"
            )
        return self

    @property
    def uses_prepared_statements(self) -> bool:
        if self.prepared_statements is not None:
            return self.prepared_statements
        return self.database_pooler == "none"

    def listen_url(self, database_url: str) -> str:
        """Where the listener connects: LISTEN_DATABASE_URL, else the database itself."""
        return self.listen_database_url or database_url

    def own_ports(self) -> frozenset[int]:
        """The ports of this server's own services, which the transport allowance never
        opens to a watcher: its API's, its database's (and PostgreSQL's and PgBouncer's
        defaults)."""
        ports = {self.port, 5432, 6432}
        for url in (self.database_url, self.listen_database_url):
            with contextlib.suppress(ValueError):
                if url and (port := urlsplit(url).port) is not None:
                    ports.add(port)
        return frozenset(ports)

    def bounded_by(self, policy: ReliabilityPolicy) -> None:
        """Settings may lower a policy value, never raise it: PolicyError names each cell."""
        delivery = policy.delivery
        problems: list[tuple[str, str]] = []
        checks: list[tuple[float | None, float, str, str]] = [
            (
                self.delivery_concurrency,
                delivery.concurrency,
                "QUEUE_SERVER_DELIVERY_CONCURRENCY",
                delivery.cell("concurrency"),
            ),
            (
                self.delivery_attempt_timeout,
                delivery.attempt_timeout,
                "QUEUE_SERVER_DELIVERY_ATTEMPT_TIMEOUT",
                delivery.cell("attempt_timeout"),
            ),
        ]
        for value, ceiling, setting, cell in checks:
            try:
                at_most(value, ceiling, setting=setting, cell=cell)
            except PolicyError as error:
                problems.extend(error.problems)
        if problems:
            raise PolicyError(problems)
