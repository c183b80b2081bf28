"""The connection budget of `serve`: how many database connections each process's pool may
hold, so that every process, its listener and a reserve for operators and applications fit
in what the database accepts.

What one `serve` holds on its database, besides nothing else for long:

- per process, its pool (requests, and the sweepers, the sampler, the scheduler and the
  policy recording, which borrow from it) and its LISTEN session (`background/notifier.py`,
  direct to PostgreSQL even through a pooler);
- in the supervisor, the metrics listener's session while it answers a scrape
  (`--metrics-listen`).

The budget is the database's `max_connections` less the slots only superusers
(`superuser_reserved_connections`) or `pg_use_reserved_connections` members
(`reserved_connections`) may use, or QUEUE_SERVER_DATABASE_BUDGET if lower. The reserve
(QUEUE_SERVER_DATABASE_RESERVE) is left for everyone else: psql, pg_dump, `queue-server
deliver` (its pool holds the policy's delivery concurrency + 1), applications that enqueue
in their own transactions. What remains, less the listeners, is split between the
processes; each pool is capped there (and at QUEUE_SERVER_POOL_MAX_SIZE), and a process
whose share is below QUEUE_SERVER_POOL_MIN_SIZE is a configuration that cannot fit.

Through a transaction pooler (PgBouncer) the pools' connections are the pooler's clients:
the budget is the pooler's (`max_client_conn`, shared with its other clients), which the
server cannot read; QUEUE_SERVER_DATABASE_BUDGET states it, and without it the pools are
as configured, unchecked.
"""

from __future__ import annotations

from dataclasses import dataclass

from queue_server.settings import Settings

# A fresh cluster's max_connections (PostgreSQL's default): the embedded database never
# gets fewer, so a single process keeps the room it always had.
EMBEDDED_MAX_CONNECTIONS_FLOOR = 100


class ConnectionBudgetError(RuntimeError):
    """The server's processes, their pools and the reserve do not fit in the database's
    connections."""


@dataclass(frozen=True)
class Limits:
    """What the database accepts: `max_connections`, and how many of them only superusers
    and `pg_use_reserved_connections` members may use."""

    max_connections: int
    reserved: int

    @property
    def usable(self) -> int:
        return self.max_connections - self.reserved


@dataclass(frozen=True)
class Budget:
    """The pool size each of `processes` runs with, and the figures it was made from."""

    processes: int
    pool_min: int
    pool_max: int
    reserve: int
    listeners: int
    # The database's limits (None through a pooler), and the budget setting if any.
    limits: Limits | None
    budget: int | None

    @property
    def pooled(self) -> bool:
        return self.limits is None

    def describe(self) -> str:
        """The one line `serve` prints at start."""
        pools = f"{self.processes} processes x pool {self.pool_min}-{self.pool_max}"
        if self.pooled:
            within = (
                f"within a budget of {self.budget} at the pooler, reserve {self.reserve}"
                if self.budget is not None
                else "as configured, unchecked: the pooler's max_client_conn is the budget"
                " (QUEUE_SERVER_DATABASE_BUDGET states it)"
            )
            return (
                f"database connections: {pools} through a transaction pooler, {within};"
                f" {self.processes} listeners direct to PostgreSQL"
            )
        assert self.limits is not None
        budget = f", budget {self.budget}" if self.budget is not None else ""
        return (
            f"database connections: {pools} + {self.listeners} listeners, reserve"
            f" {self.reserve}, of max_connections {self.limits.max_connections}"
            f" ({self.limits.reserved} reserved for superusers{budget})"
        )


def listeners(processes: int, *, metrics_listener: bool) -> int:
    """The server's sessions outside its pools: a LISTEN session per process, and the
    supervisor's metrics listener."""
    return processes + int(metrics_listener)


def plan(
    settings: Settings,
    limits: Limits | None,
    *,
    processes: int,
    metrics_listener: bool,
) -> Budget:
    """Each process's pool for `processes` processes on a database with `limits` (None:
    through a transaction pooler); ConnectionBudgetError when even the minimum pools do
    not fit."""
    budget = settings.database_budget
    if limits is None:
        # The listeners bypass the pooler; the metrics listener's scrapes go through it.
        own = int(metrics_listener)
        total = budget
    else:
        own = listeners(processes, metrics_listener=metrics_listener)
        total = limits.usable if budget is None else min(budget, limits.usable)
    if total is None:
        return Budget(
            processes=processes,
            pool_min=settings.pool_min_size,
            pool_max=settings.pool_max_size,
            reserve=settings.database_reserve,
            listeners=own,
            limits=None,
            budget=None,
        )
    share = (total - settings.database_reserve - own) // processes
    if share < settings.pool_min_size:
        raise ConnectionBudgetError(_refusal(settings, limits, processes, own, total))
    pool_max = min(settings.pool_max_size, share)
    return Budget(
        processes=processes,
        pool_min=settings.pool_min_size,
        pool_max=pool_max,
        reserve=settings.database_reserve,
        listeners=own,
        limits=limits,
        budget=budget,
    )


def _refusal(
    settings: Settings, limits: Limits | None, processes: int, own: int, total: int
) -> str:
    needed = processes * settings.pool_min_size + own + settings.database_reserve
    if limits is None:
        where = f"QUEUE_SERVER_DATABASE_BUDGET={total} at the pooler"
    else:
        where = (
            f"the database's max_connections {limits.max_connections} less"
            f" {limits.reserved} reserved for superusers"
        )
        if settings.database_budget is not None and settings.database_budget < limits.usable:
            where = f"QUEUE_SERVER_DATABASE_BUDGET={settings.database_budget}"
    listening = f" + {own} listener sessions" if own else ""
    return (
        f"{processes} server processes do not fit in the database's connections: they need"
        f" at least {needed} ({processes} x a minimum pool of {settings.pool_min_size}"
        f"{listening} + a reserve of {settings.database_reserve} for operators and"
        f" applications), and {where} leaves {total}. Run fewer processes (--workers),"
        " lower QUEUE_SERVER_POOL_MIN_SIZE or QUEUE_SERVER_DATABASE_RESERVE, or raise the"
        " database's max_connections."
    )


def embedded_max_connections(
    settings: Settings, *, processes: int, metrics_listener: bool, reserved: int = 3
) -> int:
    """The max_connections the embedded PostgreSQL starts with: every process's full pool,
    the listeners, the reserve and the superusers' slots (`reserved`, PostgreSQL's default
    3), and never below PostgreSQL's default."""
    needed = (
        processes * settings.pool_max_size
        + listeners(processes, metrics_listener=metrics_listener)
        + settings.database_reserve
        + reserved
    )
    return max(EMBEDDED_MAX_CONNECTIONS_FLOOR, needed)
