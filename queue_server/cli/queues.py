"""`queue-server queues`: pause and resume a queue, and show one queue's figures."""

from __future__ import annotations

from typing import Annotated

import typer

from queue_server.cli.common import (
    CLI,
    DataDir,
    Json,
    Key,
    Tenant,
    Url,
    age,
    fields,
    print_json,
    tenant_session,
)
from queue_server.client.models import QueueStatus

app = CLI(help="Pause and resume queues; show a queue's figures.", no_args_is_help=True)

QueueName = Annotated[str, typer.Argument(help="Queue name.")]
Reason = Annotated[str, typer.Option(help="Why: kept in the queue's ledger.")]


def queue_fields(q: QueueStatus) -> None:
    paused = f"since {q.paused_at} by {q.paused_by} ({q.pause_reason})" if q.paused else "no"
    fields(
        f"queue {q.queue}",
        [
            ("paused", paused),
            ("items", q.states),
            ("oldest ready", age(q.oldest_ready_age)),
            ("leases", f"{q.active_leases} active of {q.concurrency_limit} allowed"),
            ("oldest lease", age(q.oldest_lease_age)),
            ("open dead letters", q.open_dead_letters),
            ("completions", f"{q.completions.last_minute}/min, {q.completions.last_hour}/h"),
            ("failures", f"{q.failures.last_minute}/min, {q.failures.last_hour}/h"),
        ],
    )


@app.command("show")
def queues_show(
    queue: QueueName,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """One queue: items by state, ages, leases, dead letters, rates, paused.

    Example: [bold]queue-server queues show emails[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        found = [q for q in qs.status().queues if q.queue == queue]
    status = (
        found[0]
        if found
        else QueueStatus(
            queue=queue,
            ready=0,
            due=0,
            leased=0,
            quarantined=0,
            concurrency_limit=1,
            active_leases=0,
        )
    )
    if json:
        print_json(status)
    else:
        queue_fields(status)


@app.command("pause")
def queues_pause(
    queue: QueueName,
    reason: Reason = "",
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Stop handing out leases of a queue (enqueues are still admitted) until resumed.

    Example: [bold]queue-server queues pause emails --reason "provider outage"[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        status = qs.pause_queue(queue, reason=reason)
    if json:
        print_json(status)
    else:
        queue_fields(status)


@app.command("resume")
def queues_resume(
    queue: QueueName,
    reason: Reason = "",
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Hand out leases of a paused queue again; waiting workers wake up.

    Example: [bold]queue-server queues resume emails[/bold]
    """
    with tenant_session(url, key, data_dir, tenant) as qs:
        status = qs.resume_queue(queue, reason=reason)
    if json:
        print_json(status)
    else:
        queue_fields(status)
