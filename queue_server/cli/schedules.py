"""`queue-server schedules ...`: periodic enqueues (operator)."""

from __future__ import annotations

import json as jsonlib
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from queue_server.cli.common import (
    CLI,
    EXIT_REFUSED,
    DataDir,
    Json,
    Key,
    Tenant,
    Url,
    console,
    fail,
    fields,
    print_json,
    table,
    tenant_session,
)
from queue_server.client.schedules import Schedule, ScheduleClient

app = CLI(
    help="Schedules: enqueue an item at each tick of a cron expression or every n seconds.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="Schedule name.")]
CATCH_UP = ("skip", "latest", "all-bounded")


def _timing(s: Schedule) -> str:
    if s.every is not None:
        return f"every {s.every}s"
    return f"{s.cron} ({s.timezone})"


def _schedule_fields(s: Schedule) -> None:
    pairs: list[tuple[str, object]] = [
        ("schedule", s.schedule),
        ("queue", s.queue),
        ("timing", _timing(s)),
        ("catch up", f"{s.catch_up} (limit {s.catch_up_limit})"),
        ("state", "paused" if s.paused else "running"),
        ("payload", s.payload),
        ("priority", s.priority),
        ("max acquisitions", s.max_acquisitions or "tenant default"),
        ("fires", s.fires),
        ("refusals", s.refusals),
        ("skipped ticks", s.skipped),
    ]
    fields(None, pairs)
    if s.next_fires:
        table("next fires (UTC)", ["tick"], [(at,) for at in s.next_fires])
    if s.recent_fires:
        table(
            "recent fires",
            ["tick", "kind", "outcome", "item", "attempts"],
            [(f.tick_at, f.kind, f.outcome, f.item_id, f.attempts) for f in s.recent_fires],
        )


@app.command("list")
def list_schedules(
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """The tenant's schedules with their next fire time and counters."""
    found: list[Schedule] = []
    with tenant_session(url, key, data_dir, tenant) as qs:
        schedules = ScheduleClient(qs)
        cursor = None
        while True:
            page = schedules.list_schedules(limit=500, cursor=cursor)
            found += page.schedules
            cursor = page.next_cursor
            if cursor is None:
                break
    if json:
        print_json(found)
        return
    table(
        "schedules",
        ["schedule", "queue", "timing", "catch up", "state", "next fire (UTC)", "fires", "refused"],
        [
            (
                s.schedule,
                s.queue,
                _timing(s),
                s.catch_up,
                "paused" if s.paused else "running",
                s.next_fires[0] if s.next_fires else None,
                s.fires,
                s.refusals,
            )
            for s in found
        ],
        drop=["refused", "fires", "catch up", "state"],
    )


@app.command("show")
def show(
    name: Name,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """One schedule: its next fire times and its recent fires (refusals included)."""
    with tenant_session(url, key, data_dir, tenant) as qs:
        found = ScheduleClient(qs).get(name)
    if json:
        print_json(found)
    else:
        _schedule_fields(found)


@app.command("put")
def put(
    name: Name,
    queue: Annotated[str, typer.Option("--queue", "-q", help="The queue the items go to.")],
    cron: Annotated[
        str | None,
        typer.Option(help='Cron expression of five fields, e.g. "*/5 * * * *", or @daily.'),
    ] = None,
    every: Annotated[
        int | None, typer.Option(min=1, help="Seconds between ticks (instead of --cron).")
    ] = None,
    timezone: Annotated[
        str, typer.Option("--timezone", "--tz", help="IANA time zone of --cron.")
    ] = "UTC",
    catch_up: Annotated[
        str, typer.Option(help="Missed ticks: skip, latest or all-bounded.")
    ] = "skip",
    catch_up_limit: Annotated[
        int, typer.Option(min=1, max=1000, help="Ticks caught up at most (all-bounded).")
    ] = 100,
    payload: Annotated[
        str | None, typer.Option(help="Each item's payload, as JSON (default null).")
    ] = None,
    payload_file: Annotated[
        Path | None, typer.Option(help="Read the payload (JSON) from this file.")
    ] = None,
    priority: Annotated[int, typer.Option(help="Each item's priority.")] = 0,
    max_acquisitions: Annotated[
        int | None, typer.Option(min=1, help="Each item's acquisition budget.")
    ] = None,
    paused: Annotated[bool, typer.Option("--paused", help="Create it paused.")] = False,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Create or replace a schedule; prints it with its next fire times.

    A new timing (or unpausing) starts at the first tick after now.

    Example: [bold]queue-server schedules put nightly -q reports --cron "30 2 * * *"
    --tz Europe/Berlin --payload '{"report": "sales"}'[/bold]
    """
    if (cron is None) == (every is None):
        fail("Invalid schedule", "give exactly one of --cron and --every")
    if catch_up not in CATCH_UP:
        fail("Invalid schedule", f"--catch-up must be one of: {', '.join(CATCH_UP)}")
    body = _payload(payload, payload_file)
    mode: Literal["skip", "latest", "all-bounded"] = catch_up  # type: ignore[assignment]
    with tenant_session(url, key, data_dir, tenant) as qs:
        saved = ScheduleClient(qs).put(
            name,
            queue=queue,
            cron=cron,
            every=every,
            timezone=timezone,
            payload=body,
            priority=priority,
            max_acquisitions=max_acquisitions,
            catch_up=mode,
            catch_up_limit=catch_up_limit,
            paused=paused,
        )
    if json:
        print_json(saved)
    else:
        _schedule_fields(saved)


def _payload(text: str | None, path: Path | None) -> Any:
    if text is not None and path is not None:
        fail("Invalid payload", "give --payload or --payload-file, not both")
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            fail("Cannot read the payload file", str(exc))
    if text is None:
        return None
    try:
        return jsonlib.loads(text)
    except ValueError as exc:
        fail("Invalid payload", f"not JSON: {exc}", EXIT_REFUSED)


def _act(
    action: Literal["pause", "resume"],
    name: str,
    url: str | None,
    key: str | None,
    tenant: str | None,
    data_dir: Path | None,
    json: bool,
) -> None:
    with tenant_session(url, key, data_dir, tenant) as qs:
        schedules = ScheduleClient(qs)
        done = schedules.pause(name) if action == "pause" else schedules.resume(name)
    if json:
        print_json(done)
    else:
        _schedule_fields(done)


@app.command("pause")
def pause(
    name: Name,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Stop firing until resumed."""
    _act("pause", name, url, key, tenant, data_dir, json)


@app.command("resume")
def resume(
    name: Name,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Fire again from the first tick after now (the paused ticks are not caught up)."""
    _act("resume", name, url, key, tenant, data_dir, json)


@app.command("trigger")
def trigger(
    name: Name,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Enqueue one run now (also while paused); refused at the backlog cap."""
    with tenant_session(url, key, data_dir, tenant) as qs:
        fired = ScheduleClient(qs).trigger(name)
    if json:
        print_json(fired)
    else:
        console.print(f"enqueued item {fired.item.item_id} on {fired.item.queue}")


@app.command("delete")
def delete(
    name: Name,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
) -> None:
    """Delete the schedule; the items it enqueued stay."""
    with tenant_session(url, key, data_dir, tenant) as qs:
        ScheduleClient(qs).delete(name)
    console.print(f"schedule {name} deleted")
