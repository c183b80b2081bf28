"""`queue-server enqueue`: one item, or a JSONL file in resumable batches."""

from __future__ import annotations

import hashlib
import json as jsonlib
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from queue_server.cli.common import (
    DataDir,
    Json,
    Key,
    Tenant,
    Url,
    console,
    err_console,
    fail,
    print_json,
    tenant_session,
)
from queue_server.client import DEFAULT_URL, NewItem

MAX_BATCH = 500


def register(app: typer.Typer) -> None:
    app.command()(enqueue)


def _parse(text: str, where: str) -> Any:
    try:
        return jsonlib.loads(text)
    except ValueError as exc:
        fail("Invalid JSON", f"{where}: {exc}")


def read_lines(path: Path) -> tuple[bytes, list[tuple[int, NewItem]]]:
    """The file's bytes and its items with 1-based line numbers; blank lines are skipped.

    A line is a payload, or an object {"payload": ..., "priority", "delay",
    "max_acquisitions"} when it has a "payload" key and only those keys.
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
        known = {"payload", "priority", "delay", "max_acquisitions"}
        if isinstance(value, dict) and "payload" in value and set(value) <= known:
            items.append((number, NewItem(**value)))
        else:
            items.append((number, NewItem(payload=value)))
    return data, items


def batch_key(tenant: str, queue: str, digest: str, batch_size: int, index: int) -> str:
    """The same file, queue and batch size give the same keys: a re-run replays, never duplicates."""
    seed = f"{tenant}\n{queue}\n{digest}\n{batch_size}\n{index}".encode()
    return f"qs-file-{hashlib.sha256(seed).hexdigest()[:48]}"


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
    url: Url = DEFAULT_URL,
    key: Key = None,
    tenant: Tenant = None,
    data_dir: DataDir = None,
    json: Json = False,
) -> None:
    """Enqueue one item (--payload) or every line of a JSONL file (--file).

    A file is sent in batches with a progress bar. Each batch's Idempotency-Key is
    derived from the file's content and the batch's line numbers, so re-running the
    same file (with the same --batch-size, within the server's receipt retention of
    at least 24 hours) enqueues nothing twice: an interrupted run just resumes.

    Examples: [bold]queue-server enqueue emails --payload '{"to": "a@example.com"}'[/bold]
              [bold]queue-server enqueue emails --file emails.jsonl[/bold]
    """
    if (payload is None) == (file is None):
        fail("Nothing to enqueue", "give exactly one of --payload JSON or --file items.jsonl")
    with tenant_session(url, key, data_dir, tenant) as qs:
        if payload is not None:
            item = qs.enqueue(
                queue,
                _parse(payload, "--payload"),
                priority=priority,
                delay=delay,
                max_acquisitions=max_acquisitions,
                idempotency_key=idempotency_key,
            )
            if json:
                print_json(item)
            else:
                console.print(f"enqueued {item.item_id} on {item.queue}")
            return
        assert file is not None
        data, lines = read_lines(file)
        digest = hashlib.sha256(data).hexdigest()
        chosen_tenant = qs.tenant or ""
        ids: list[str] = []
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err_console,
            disable=json,
        )
        with progress:
            task = progress.add_task(f"enqueue {file.name}", total=len(lines))
            for index, start in enumerate(range(0, len(lines), batch_size)):
                batch = lines[start : start + batch_size]
                items = [
                    NewItem(
                        payload=item.payload,
                        priority=item.priority if "priority" in item.model_fields_set else priority,
                        delay=item.delay if "delay" in item.model_fields_set else delay,
                        max_acquisitions=item.max_acquisitions or max_acquisitions,
                    )
                    for _, item in batch
                ]
                created = qs.enqueue_batch(
                    queue,
                    items,
                    idempotency_key=batch_key(chosen_tenant, queue, digest, batch_size, index),
                )
                ids += [c.item_id for c in created]
                progress.advance(task, len(batch))
    if json:
        print_json({"queue": queue, "count": len(ids), "item_ids": ids})
    else:
        console.print(f"{len(ids)} items on {queue} from {file}")
