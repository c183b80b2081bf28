"""`queue-server queues`: pause and resume a queue, show one queue's figures, and its settings."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

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
    table,
    tenant_session,
    when,
)
from queue_server.client.models import QueueSettings, QueueStatus, Setting

app = CLI(
    help="Pause and resume queues; show a queue's figures; show and set its settings.",
    no_args_is_help=True,
)

QueueName = Annotated[str, typer.Argument(help="Queue name.")]
Reason = Annotated[str, typer.Option(help="Why: kept in the queue's ledger.")]


def queue_fields(q: QueueStatus) -> None:
    since = when(q.paused_at) if q.paused_at else "-"
    paused = f"since {since} by {q.paused_by} ({q.pause_reason})" if q.paused else "no"
    fields(
        f"queue {q.queue}",
        [
            ("paused", paused),
            ("items", ", ".join(f"{n:,} {state}" for state, n in q.states.items())),
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
            # A queue with no items yet: every state, at zero, as the server lists them.
            states=dict.fromkeys(("ready", "leased", "completed", "quarantined", "cancelled"), 0),
        )
    )
    if json:
        print_json(status)
    else:
        queue_fields(status)


@app.command("events")
def queues_events(
    queue: QueueName,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """The queue's ledger, newest first: pauses and resumes, settings and concurrency
    changes (who, the values before and after), and spend approvals that expired (with
    the limit the queue fell to). The latest 50.

    Example: [bold]queue-server queues events emails[/bold]
    """
    from queue_server.views import queue_event_text

    with tenant_session(url, key, data_dir, tenant) as qs:
        answer = qs.request("GET", f"/v1/tenants/{qs.tenant or ''}/queues/{queue}")
    events = answer.json()["events"]
    if json:
        print_json(events)
        return
    table(
        f"queue {queue}: {len(events)} events",
        ["seq", "at", "by", "what"],
        [
            [e["seq"], when(datetime.fromisoformat(e["at"])), e["actor_name"] or e["actor"],
             queue_event_text(e)]
            for e in events
        ],
    )  # fmt: skip


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


# Fields `--clear` may name, with the settings key they unset.
CLEARABLE = (
    "lease-ttl",
    "deadline",
    "max-acquisitions",
    "retry-base",
    "retry-cap",
    "jitter",
    "ordering-dead-letters",
    "fairness",
    "rate-limit",
)


def _shown(setting: Setting, unit: str = "") -> str:
    value = setting.value
    if isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, float | int):
        text = f"{value:g}{unit}"
    else:
        text = str(value)
    return f"{text}  ({setting.source})"


def _rate(setting: Setting) -> str:
    """`20 per 1 s`, `10 per 60 s per partition key`, or `none`, with its source."""
    rate = setting.value
    if not rate:
        return f"none  ({setting.source})"
    keyed = " per partition key" if rate["partitioned"] else ""
    return f"{rate['limit']} per {rate['per']:g} s{keyed}  ({setting.source})"


def settings_fields(s: QueueSettings) -> None:
    retry = s.retry
    fields(
        f"queue {s.queue} settings",
        [
            ("lease TTL", _shown(s.lease_ttl, " s")),
            ("lease deadline", _shown(s.deadline, " s")),
            ("max acquisitions", _shown(s.max_acquisitions)),
            ("retry base", _shown(retry.base, " s")),
            ("retry factor", _shown(retry.factor)),
            ("retry cap", _shown(retry.cap, " s")),
            ("retry jitter", _shown(retry.jitter)),
            *([("rate limit", _rate(s.rate_limit))] if s.rate_limit is not None else []),
            *(
                [("ordering dead letters", _shown(s.ordering_dead_letters))]
                if s.ordering_dead_letters is not None
                else []
            ),
            *([("fairness", _shown(s.fairness))] if s.fairness is not None else []),
            ("updated", f"{s.updated_at} by {s.updated_by}" if s.updated_at else "never"),
        ],
    )


@app.command("settings")
def queues_settings(
    queue: QueueName,
    lease_ttl: Annotated[
        float | None,
        typer.Option(
            min=1, show_default=False, help="A lease's TTL when the worker asks for none (s)."
        ),
    ] = None,
    deadline: Annotated[
        float | None,
        typer.Option(
            min=1,
            show_default=False,
            help="The longest life of one lease, heartbeats included (s).",
        ),
    ] = None,
    max_acquisitions: Annotated[
        int | None,
        typer.Option(
            min=1,
            show_default=False,
            help="An item's acquisition budget when its enqueue gives none.",
        ),
    ] = None,
    retry_base: Annotated[
        float | None,
        typer.Option(
            min=0, show_default=False, help="The first backoff delay of a failed item (s)."
        ),
    ] = None,
    retry_cap: Annotated[
        float | None,
        typer.Option(min=0, show_default=False, help="The longest backoff delay (s)."),
    ] = None,
    jitter: Annotated[
        bool | None,
        typer.Option(
            "--jitter/--no-jitter",
            show_default=False,
            help="Full jitter: each backoff delay a uniform draw up to its value.",
        ),
    ] = None,
    ordering_dead_letters: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="When an item with an ordering key goes to dead letters: release (hand out"
            " the next of its key) or hold (its key waits until it is replayed or discarded).",
        ),
    ] = None,
    fairness: Annotated[
        str | None,
        typer.Option(
            show_default=False,
            help="How a priority's due items are handed out: arrival (the one due longest"
            " first) or partition_key (round-robin between their partition keys, so a key"
            " that floods the queue does not hold back the others).",
        ),
    ] = None,
    rate_limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            show_default=False,
            help="At most this many leases in any --rate-per seconds, across every worker.",
        ),
    ] = None,
    rate_per: Annotated[
        float | None,
        typer.Option(min=0.001, show_default=False, help="The rate limit's interval (s)."),
    ] = None,
    rate_by_partition: Annotated[
        bool | None,
        typer.Option(
            "--rate-by-partition/--rate-whole-queue",
            show_default=False,
            help="The rate limit holds per partition key (an item's partition_key), or over"
            " the whole queue.",
        ),
    ] = None,
    clear: Annotated[
        list[str] | None,
        typer.Option(
            show_default=False,
            help="Unset a setting (inherit the tenant's default, else the policy's): "
            + ", ".join(CLEARABLE)
            + "; repeat for several.",
        ),
    ] = None,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Show a queue's settings (each effective value and where it comes from: queue, tenant,
    policy or default), or change the ones given (an operator key); the others stay. Each
    value is at most the loaded policy's envelope: above it, the server refuses naming the
    cell (exit 4); `policy set` raises the envelope first (an admin key).

    Examples: [bold]queue-server queues settings reports --deadline 600 --retry-cap 120[/bold]
              [bold]queue-server policy set deadline 7200 --reason "reports run two hours"[/bold]
              [bold]queue-server queues settings reports --deadline 7200[/bold]
    """
    from queue_server.cli.common import fail

    unknown = [c for c in clear or [] if c not in CLEARABLE]
    if unknown:
        fail("Unknown --clear", f"{', '.join(unknown)}: one of {', '.join(CLEARABLE)}")
    if ordering_dead_letters not in (None, "release", "hold"):
        fail("Unknown --ordering-dead-letters", f"{ordering_dead_letters}: release or hold")
    if fairness not in (None, "arrival", "partition_key"):
        fail("Unknown --fairness", f"{fairness}: arrival or partition_key")
    given = {
        "lease-ttl": lease_ttl,
        "deadline": deadline,
        "max-acquisitions": max_acquisitions,
        "retry-base": retry_base,
        "retry-cap": retry_cap,
        "jitter": jitter,
        "ordering-dead-letters": ordering_dead_letters,
        "fairness": fairness,
    }
    given_rate = {"limit": rate_limit, "per": rate_per, "partitioned": rate_by_partition}
    rate_given = any(v is not None for v in given_rate.values())
    with tenant_session(url, key, data_dir, tenant) as qs:
        current = qs.queue_settings(queue)
        if any(v is not None for v in given.values()) or rate_given or clear:
            own = {
                "lease-ttl": _own(current.lease_ttl),
                "deadline": _own(current.deadline),
                "max-acquisitions": _own(current.max_acquisitions),
                "retry-base": _own(current.retry.base),
                "retry-cap": _own(current.retry.cap),
                "jitter": _own(current.retry.jitter),
                "ordering-dead-letters": (
                    _own(current.ordering_dead_letters) if current.ordering_dead_letters else None
                ),
                "fairness": _own(current.fairness) if current.fairness else None,
            }
            own.update({k: v for k, v in given.items() if v is not None})
            for name in clear or []:
                own[name] = None
            rate: dict[str, Any] = dict(
                (current.rate_limit and _own(current.rate_limit)) or {"partitioned": False}
            )
            if "rate-limit" in (clear or []):
                rate = {"partitioned": False}
            rate.update({k: v for k, v in given_rate.items() if v is not None})
            if rate_given and (rate.get("limit") is None or rate.get("per") is None):
                fail("A rate limit needs both", "give --rate-limit N and --rate-per SECONDS")
            current = qs.put_queue_settings(
                queue,
                lease_ttl=own["lease-ttl"],
                deadline=own["deadline"],
                max_acquisitions=own["max-acquisitions"],
                retry_base=own["retry-base"],
                retry_cap=own["retry-cap"],
                retry_jitter=own["jitter"],
                ordering_dead_letters=own["ordering-dead-letters"],
                rate_limit=rate.get("limit"),
                rate_per=rate.get("per"),
                rate_partitioned=bool(rate["partitioned"]),
                fairness=own["fairness"],
            )
    if json:
        print_json(current)
    else:
        settings_fields(current)


def _own(setting: Setting) -> Any:
    """The queue's own value of a setting, or None where it inherits one."""
    return setting.value if setting.source == "queue" else None
