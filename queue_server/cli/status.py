"""`queue-server status`: per queue counts and the tenant's backlog against its cap."""

from __future__ import annotations

from queue_server.cli.common import (
    DataDir,
    Json,
    Key,
    Tenant,
    Url,
    age,
    print_json,
    table,
    tenant_session,
)
from queue_server.client import DEFAULT_URL


def status(
    url: Url = DEFAULT_URL,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Per queue: ready, leased, quarantined, oldest ready age; the backlog against its cap.

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
        ["queue", "ready", "due", "leased", "quarantined", "oldest ready", "concurrency"],
        [
            (
                q.queue,
                q.ready,
                q.due,
                q.leased,
                q.quarantined,
                age(q.oldest_ready_age),
                f"{q.active_leases}/{q.concurrency_limit}",
            )
            for q in snapshot.queues
        ],
    )
