"""`queue-server status`: per queue counts and the tenant's backlog against its cap."""

from __future__ import annotations

from queue_server.cli.common import (
    DataDir,
    Json,
    Key,
    Tenant,
    Url,
    Wide,
    age,
    print_json,
    table,
    tenant_session,
)


def status(
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
    wide: Wide = False,
) -> None:
    """Per queue: items by state, oldest ready age, concurrency; who holds each lease.

    Also the tenant's backlog against its cap and its open dead letters; each lease
    with its holder, since when and until when.

    Example: [bold]queue-server status --tenant acme[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        snapshot = qs.status()
    if json:
        print_json(snapshot)
        return
    table(
        f"tenant {snapshot.tenant}: backlog {snapshot.backlog} of {snapshot.backlog_cap},"
        f" {snapshot.open_dead_letters} open dead letters",
        [
            "queue",
            "ready",
            "due",
            "leased",
            "quarantined",
            "completed",
            "cancelled",
            "oldest ready",
            "concurrency",
            "done/min",
            "paused",
        ],
        [
            (
                q.queue,
                q.ready,
                q.due,
                q.leased,
                q.quarantined,
                q.completed,
                q.cancelled,
                age(q.oldest_ready_age),
                f"{q.active_leases}/{q.concurrency_limit}",
                q.completions.last_minute,
                "yes" if q.paused else "",
            )
            for q in snapshot.queues
        ],
        drop=["cancelled", "done/min", "due", "oldest ready"],
        wide=wide,
    )
    if snapshot.leases:
        table(
            "leases (oldest first)",
            ["item", "queue", "worker", "since", "expires", "fence"],
            [
                (
                    lease.item_id,
                    lease.queue,
                    lease.worker,
                    lease.acquired_at,
                    lease.lease_expires_at,
                    lease.fence,
                )
                for lease in snapshot.leases
            ],
            drop=["fence", "expires", "queue"],
            wide=wide,
        )
