"""`queue-server enqueue`: one item, or a JSONL file in resumable batches."""

from __future__ import annotations

import hashlib
import json as jsonlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from queue_server.cli.common import (
    EXIT_REFUSED,
    DataDir,
    Json,
    Key,
    Quiet,
    Tenant,
    Url,
    console,
    err_console,
    fail,
    print_json,
    tenant_session,
)
from queue_server.client import NewItem, QueueClientError, new_idempotency_key
from queue_server.client.models import Item

MAX_BATCH = 500


def register(app: typer.Typer) -> None:
    app.command()(enqueue)


def _parse(text: str, where: str) -> Any:
    try:
        return jsonlib.loads(text)
    except ValueError as exc:
        fail("Invalid JSON", f"{where}: {exc}", EXIT_REFUSED)


def read_lines(path: Path) -> list[tuple[str, NewItem]]:
    """Each non-blank line's key (its number and a hash of its text) and its item.

    A line is a payload, or an object {"payload": ..., "priority", "delay",
    "max_acquisitions", "unique_key", "ordering_key", "partition_key", "depends_on",
    "on_dependency_failure"} when it has a "payload" key and only those keys.
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        fail("Cannot read the file", f"{path}: {exc.strerror}")
    items = []
    for number, raw in enumerate(data.decode("utf-8", errors="strict").splitlines(), start=1):
        if not raw.strip():
            continue
        value = _parse(raw, f"{path}:{number}")
        known = {
            "payload",
            "priority",
            "delay",
            "max_acquisitions",
            "unique_key",
            "unique_for",
            "ordering_key",
            "partition_key",
            "depends_on",
            "on_dependency_failure",
        }
        if isinstance(value, dict) and "payload" in value and set(value) <= known:
            item = NewItem(**value)
        else:
            item = NewItem(payload=value)
        items.append((line_key(number, raw), item))
    return items


def line_key(number: int, text: str) -> str:
    """A line of a file: its number and its content. An edited line is a new line."""
    return f"{number}:{hashlib.sha256(text.encode()).hexdigest()[:20]}"


def batch_key(tenant: str, queue: str, lines: Sequence[str]) -> str:
    """The same lines of the same file to the same queue: the same key, whatever batch
    they are sent in, so a batch re-sent after a crash is replayed, never enqueued twice."""
    seed = "\n".join([tenant, queue, *lines]).encode()
    return f"qs-lines-{hashlib.sha256(seed).hexdigest()[:48]}"


def journal_dir() -> Path:
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "queue-server" / "loads"


class Journal:
    """Which lines of a file a queue already holds: one JSON line per batch, written
    `sending` (before the request) and `done` (after). A batch left `sending` by a
    crash is re-sent as it was, under its own key, so the server replays it."""

    def __init__(self, url: str, tenant: str, queue: str, path: Path) -> None:
        seed = "\n".join([url, tenant, queue, str(path.resolve())]).encode()
        self.path = journal_dir() / f"{hashlib.sha256(seed).hexdigest()[:32]}.jsonl"
        self.done: set[str] = set()
        self.sending: dict[str, list[str]] = {}
        # The last record torn by a crash: the next one starts a line of its own.
        self._torn = False
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return
        self._torn = bool(text) and not text.endswith("\n")
        for raw in text.splitlines():
            try:
                record = jsonlib.loads(raw)
                lines = [str(k) for k in record["lines"]]
                state = record["state"]
            except (ValueError, KeyError, TypeError):
                continue  # a record torn by a crash: its batch is still `sending`
            key = "\n".join(lines)
            if state == "done":
                self.done.update(lines)
                self.sending.pop(key, None)
            else:
                self.sending[key] = lines

    def write(self, state: str, lines: Sequence[str]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        record = jsonlib.dumps({"state": state, "lines": list(lines)}) + "\n"
        with self.path.open("a") as handle:
            handle.write("\n" + record if self._torn else record)
            self._torn = False
            handle.flush()
            os.fsync(handle.fileno())


def _batches(
    lines: list[tuple[str, NewItem]], journal: Journal, batch_size: int
) -> tuple[list[list[tuple[str, NewItem]]], int]:
    """The batches still to send (interrupted ones first, as they were) and the count of
    lines an earlier run already loaded."""
    by_key = dict(lines)
    batches = [
        [(k, by_key[k]) for k in keys]
        for keys in journal.sending.values()
        if all(k in by_key and k not in journal.done for k in keys)
    ]
    queued = {k for batch in batches for k, _ in batch}
    rest = [(k, item) for k, item in lines if k not in journal.done and k not in queued]
    batches += [rest[i : i + batch_size] for i in range(0, len(rest), batch_size)]
    return batches, sum(1 for k, _ in lines if k in journal.done)


def enqueue(
    queue: Annotated[str, typer.Argument(help="Queue name.")],
    payload: Annotated[str | None, typer.Option(help="The item's payload, as JSON.")] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="A JSONL file: one payload (or item object) per line."),
    ] = None,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    delay: Annotated[float, typer.Option(help="Seconds before the item is due.")] = 0,
    max_acquisitions: Annotated[
        int | None, typer.Option(help="Acquisition budget (default: the tenant's).")
    ] = None,
    batch_size: Annotated[
        int, typer.Option(min=1, max=MAX_BATCH, help="Items per request with --file.")
    ] = 100,
    idempotency_key: Annotated[
        str | None, typer.Option(help="Key of a single enqueue (default: a new one).")
    ] = None,
    unique_key: Annotated[
        str | None,
        typer.Option(
            help="While an item of the queue with this key is ready or leased, make none:"
            " answer that one (a file's line may carry its own)."
        ),
    ] = None,
    unique_for: Annotated[
        float | None,
        typer.Option(
            min=0.001,
            show_default=False,
            help="With --unique-key: make none either while an item with the key was made"
            " within this many seconds, finished or not (a report a day: 86400).",
        ),
    ] = None,
    ordering_key: Annotated[
        str | None,
        typer.Option(
            help="Hand out the queue's items with this key one at a time, in enqueue order:"
            " this one waits while one before it is not finished (a file's line may carry"
            " its own)."
        ),
    ] = None,
    partition_key: Annotated[
        str | None,
        typer.Option(
            help="The partition (a customer) a queue's rate limit per partition key counts"
            " this item's leases against (a file's line may carry its own)."
        ),
    ] = None,
    depends_on: Annotated[
        list[str] | None,
        typer.Option(
            "--depends-on",
            help="The id of an item of the tenant this one waits for: it is waiting until"
            " every one named (repeat the option) has completed.",
        ),
    ] = None,
    on_dependency_failure: Annotated[
        str | None,
        typer.Option(
            help="With --depends-on, when a dependency goes to dead letters or is cancelled:"
            " cancel this item (the default; its own dependents follow), run it anyway, or"
            " wait for the dependency's replay.",
        ),
    ] = None,
    url: Url = None,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Enqueue one item (--payload) or every line of a JSONL file (--file).

    A file is sent in batches with a progress bar. The load is resumable, line by
    line: a journal (under $XDG_STATE_HOME/queue-server/loads) records which lines
    (number and content) of the file the queue already holds, so re-running the same
    file, with any --batch-size, sends only the lines not yet loaded; a batch cut off
    by a crash is re-sent under its own Idempotency-Key and the server replays it
    (within its receipt retention of at least 24 hours). Lines appended to the file
    since are loaded; an edited line counts as a new one.

    Examples: [bold]queue-server enqueue emails --payload '{"to": "a@example.com"}'[/bold]
              [bold]queue-server enqueue emails --file emails.jsonl[/bold]
    """
    if (payload is None) == (file is None):
        fail("Nothing to enqueue", "give exactly one of --payload JSON or --file items.jsonl")
    if file is not None and unique_key is not None:
        fail("--unique-key is for one item", "in a file, give each line its own unique_key")
    if unique_for is not None and unique_key is None:
        fail("--unique-for needs --unique-key", "the period is the unique key's")
    if file is not None and ordering_key is not None:
        fail("--ordering-key is for one item", "in a file, give each line its own ordering_key")
    if file is not None and partition_key is not None:
        fail("--partition-key is for one item", "in a file, give each line its own partition_key")
    if file is not None and depends_on:
        fail("--depends-on is for one item", "in a file, give each line its own depends_on")
    if on_dependency_failure is not None and not depends_on:
        fail("--on-dependency-failure needs --depends-on", "the rule is for its dependencies")
    rule: Literal["cancel", "run", "wait"] | None = None
    if on_dependency_failure is not None:
        if on_dependency_failure not in ("cancel", "run", "wait"):
            fail(
                f"Unknown --on-dependency-failure {on_dependency_failure!r}",
                "give cancel, run or wait",
                EXIT_REFUSED,
            )
        rule = on_dependency_failure  # type: ignore[assignment]
    with tenant_session(url, key, data_dir, tenant) as qs:
        if payload is not None and unique_key is not None:
            answer = qs.request(
                "POST",
                f"/v1/tenants/{qs.tenant or ''}/queues/{queue}/items",
                json=_item_body(
                    NewItem(
                        payload=_parse(payload, "--payload"),
                        unique_key=unique_key,
                        unique_for=unique_for,
                        ordering_key=ordering_key,
                        partition_key=partition_key,
                        depends_on=depends_on or None,
                        on_dependency_failure=rule,
                    ),
                    priority=priority,
                    delay=delay,
                    budget=max_acquisitions,
                ),
                idempotency_key=idempotency_key or new_idempotency_key(),
            )
            held = Item.model_validate_json(answer.content)
            if quiet:
                print(held.item_id)
            elif json:
                print_json(held)
            elif answer.status_code == 200:
                console.print(
                    f"{held.item_id} on {held.queue} ({held.state}) already holds unique key"
                    f" {unique_key}: nothing enqueued"
                )
            else:
                console.print(f"enqueued {held.item_id} on {held.queue}")
            return
        if payload is not None:
            item = qs.enqueue(
                queue,
                _parse(payload, "--payload"),
                priority=priority,
                delay=delay,
                max_acquisitions=max_acquisitions,
                idempotency_key=idempotency_key,
                ordering_key=ordering_key,
                partition_key=partition_key,
                depends_on=depends_on or None,
                on_dependency_failure=rule,
            )
            if quiet:
                print(item.item_id)
            elif json:
                print_json(item)
            elif item.state == "waiting" and depends_on:
                console.print(
                    f"enqueued {item.item_id} on {item.queue}: waiting for"
                    f" {len(depends_on)} {'item' if len(depends_on) == 1 else 'items'} to complete"
                )
            elif item.state == "waiting":
                console.print(
                    f"enqueued {item.item_id} on {item.queue}: waiting behind the items before"
                    f" it with ordering key {item.ordering_key}"
                )
            else:
                console.print(f"enqueued {item.item_id} on {item.queue}")
            return
        assert file is not None
        lines = read_lines(file)
        chosen_tenant = qs.tenant or ""
        journal = Journal(qs.url, chosen_tenant, queue, file)
        batches, already = _batches(lines, journal, batch_size)
        ids: list[str] = []
        replayed = 0
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err_console,
            disable=json or quiet,
        )
        with progress:
            task = progress.add_task(f"enqueue {file.name}", total=len(lines), completed=already)
            for batch in batches:
                keys = [k for k, _ in batch]
                body = {
                    "items": [
                        _item_body(item, priority=priority, delay=delay, budget=max_acquisitions)
                        for _, item in batch
                    ]
                }
                journal.write("sending", keys)
                try:
                    response = qs.request(
                        "POST",
                        f"/v1/tenants/{chosen_tenant}/queues/{queue}/items:batch",
                        json=body,
                        idempotency_key=batch_key(chosen_tenant, queue, keys),
                    )
                except QueueClientError:
                    progress.stop()
                    loaded = already + replayed + len(ids)
                    err_console.print(
                        f"{loaded} of {len(lines)} lines of {file} are loaded; once the cause"
                        " is fixed, the same command loads the rest."
                    )
                    raise
                journal.write("done", keys)
                created = [str(i["item_id"]) for i in response.json()["items"]]
                if response.headers.get("Idempotent-Replayed") == "true":
                    replayed += len(created)  # sent by the run that was interrupted
                else:
                    ids += created
                progress.advance(task, len(batch))
    skipped = already + replayed
    if quiet:
        for item_id in ids:
            print(item_id)
    elif json:
        print_json({"queue": queue, "count": len(ids), "already_loaded": skipped, "item_ids": ids})
    else:
        console.print(
            f"{len(ids)} items enqueued on {queue} from {file}"
            + (f"; {skipped} lines were already loaded by an earlier run" if skipped else "")
        )


def _item_body(item: NewItem, *, priority: int, delay: float, budget: int | None) -> dict[str, Any]:
    """A line's own options win over the command's."""
    body: dict[str, Any] = {
        "payload": item.payload,
        "priority": item.priority if "priority" in item.model_fields_set else priority,
        "delay": item.delay if "delay" in item.model_fields_set else delay,
    }
    if item.max_acquisitions or budget:
        body["max_acquisitions"] = item.max_acquisitions or budget
    if item.unique_key is not None:
        body["unique_key"] = item.unique_key
    if item.unique_for is not None:
        body["unique_for"] = item.unique_for
    if item.ordering_key is not None:
        body["ordering_key"] = item.ordering_key
    if item.partition_key is not None:
        body["partition_key"] = item.partition_key
    if item.depends_on is not None:
        body["depends_on"] = item.depends_on
    if item.on_dependency_failure is not None:
        body["on_dependency_failure"] = item.on_dependency_failure
    return body
