"""What an enqueue is asked for: each item (`NewItem`, or the API's body as is: `ItemSpec`),
a batch's fan-in item (`CallbackSpec`), and the items each one waits for, a request's own
refs resolved to the ids it makes (`resolve_dependencies`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from queue_server import errors
from queue_server.models import is_uuid
from queue_server.tracecontext import TraceContext


@dataclass(frozen=True, slots=True)
class NewItem:
    payload: Any
    priority: int = 0
    delay: float = 0.0
    max_acquisitions: int | None = None
    # Default: a new time-ordered id. A schedule's fire names its item (schedule, tick).
    item_id: str | None = None
    # The producer's W3C trace context (already validated), handed to each lease.
    trace: TraceContext | None = None
    # While an item of the queue with this key is ready or leased, none is made.
    unique_key: str | None = None
    # Items of the queue with this key are handed out one at a time, in enqueue order.
    ordering_key: str | None = None
    # What a rate limit per partition key counts this item's leases against.
    partition_key: str | None = None
    # With unique_key: nor while an item with it was made within this many seconds.
    unique_for: float | None = None
    # Items of the tenant this one waits for (migration 0035), and what their failure does;
    # an entry may be the `ref` of an earlier item of the same enqueue (0037).
    depends_on: list[str] | None = None
    on_dependency_failure: str | None = None
    ref: str | None = None


class CallbackSpec(Protocol):
    """A batch's fan-in item (the API's `CallbackIn`): run once every item is finished."""

    @property
    def queue(self) -> str | None: ...

    @property
    def payload(self) -> Any: ...

    @property
    def priority(self) -> int: ...

    @property
    def max_acquisitions(self) -> int | None: ...

    @property
    def depends_on(self) -> Sequence[object] | None:
        """Items enqueued before that it waits for too (ids)."""
        ...


class ItemSpec(Protocol):
    """One item an enqueue is asked for: a `NewItem`, or the API's body (`ItemIn`) as is."""

    @property
    def payload(self) -> Any: ...

    @property
    def priority(self) -> int: ...

    @property
    def delay(self) -> float: ...

    @property
    def max_acquisitions(self) -> int | None: ...

    @property
    def unique_key(self) -> str | None: ...

    @property
    def ordering_key(self) -> str | None: ...

    @property
    def partition_key(self) -> str | None: ...

    @property
    def unique_for(self) -> float | None: ...

    @property
    def depends_on(self) -> Sequence[object] | None: ...

    @property
    def on_dependency_failure(self) -> str | None: ...

    @property
    def ref(self) -> str | None: ...


def resolve_dependencies(items: Sequence[ItemSpec], ids: Sequence[str]) -> list[list[str] | None]:
    """Each item's dependencies as item ids: an id as given, a `ref` as the id of the earlier
    item of this enqueue that bears it (so no request makes a cycle)."""
    refs: dict[str, str] = {}
    needs: list[list[str] | None] = []
    for i, (item, item_id) in enumerate(zip(items, ids, strict=True)):
        resolved = None
        if item.depends_on is not None:
            resolved = []
            for entry in map(str, item.depends_on):
                if entry in refs:
                    resolved.append(refs[entry])
                elif is_uuid(entry):
                    resolved.append(entry)
                else:
                    raise errors.InvalidRequestError(
                        f"items[{i}].depends_on: {entry!r} is neither an item id nor the ref"
                        " of an earlier item of this request."
                    )
        needs.append(resolved)
        ref = item.ref
        if ref is not None:
            if ref in refs:
                raise errors.InvalidRequestError(f"items[{i}].ref: {ref!r} names two items.")
            if item.unique_key is not None:
                # Answered by the item holding its key, it may not be made: nothing to wait for.
                raise errors.InvalidRequestError(
                    f"items[{i}].ref: an item with a unique_key cannot be named by a ref."
                )
            refs[ref] = item_id
    return needs
