"""Invariant checkers over a recorded :class:`~reliability.history.History` and a
final :class:`DatabaseSnapshot` taken at a quiescent point.

Each checker returns a list of :class:`Violation` (empty when the invariant
holds), each with an explanation a reader can act on:

1. :func:`check_completions`: every item completed at most once by an accepted
   request, and every 2xx-acknowledged completion is durable.
2. :func:`check_fences`: fences handed to successive holders strictly
   increase; no write with an older fence was accepted.
3. :func:`check_conservation`: accepted enqueues = completed + quarantined +
   cancelled + ready + leased, per tenant, at the snapshot and at every
   recorded quiescent point.
4. :func:`check_backlog_cap`: no probe sample saw the backlog above the cap.
5. :func:`check_idempotent_replays`: a replayed request (same key, same
   body) got the original status and body.
6. :func:`check_total_queue`: the Jepsen total-queue view: nothing lost,
   nothing duplicated, nothing unexpected.

Requests that got no answer (or a 5xx) are *indeterminate*: their effect may
or may not have happened, and the checkers allow both, never more.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reliability.history import (
    ENQUEUES,
    HOLDER_WRITES,
    History,
    JSONValue,
    Operation,
    OpKind,
)

__all__ = [
    "CHECKERS",
    "HOLDER_EVENT_KINDS",
    "SNAPSHOT_EVENTS_SQL",
    "SNAPSHOT_ITEMS_SQL",
    "STATES",
    "CheckReport",
    "DatabaseSnapshot",
    "ItemSnapshot",
    "LedgerEvent",
    "TotalQueueView",
    "Violation",
    "check_backlog_cap",
    "check_completions",
    "check_conservation",
    "check_fences",
    "check_idempotent_replays",
    "check_total_queue",
    "render_summary_row",
    "render_summary_table",
    "run_all_checks",
    "total_queue_view",
]

#: Every state a work item can be in; conservation sums exactly these.
STATES = ("ready", "leased", "completed", "quarantined", "cancelled")
#: Ledger kinds written on behalf of the lease holder, carrying the holder's fence.
HOLDER_EVENT_KINDS = frozenset({"heartbeat", "completed", "requeued", "triaged"})

COMPLETIONS = "completions"
FENCES = "fences"
CONSERVATION = "conservation"
BACKLOG_CAP = "backlog-cap"
IDEMPOTENT_REPLAY = "idempotent-replay"
TOTAL_QUEUE = "total-queue"
CHECKERS = (COMPLETIONS, FENCES, CONSERVATION, BACKLOG_CAP, IDEMPOTENT_REPLAY, TOTAL_QUEUE)

#: The final snapshot, read from the current schema (bind nothing; read everything).
SNAPSHOT_ITEMS_SQL = (
    "SELECT tenant_id, item_id::text AS item_id, state::text AS state, fence, acquisition_count "
    "FROM work_items ORDER BY tenant_id, item_id"
)
SNAPSHOT_EVENTS_SQL = (
    "SELECT tenant_id, item_id::text AS item_id, seq, kind, fence "
    "FROM item_events ORDER BY tenant_id, item_id, seq"
)

ItemKey = tuple[str, str]


# ------------------------------------------------------------------ snapshot


@dataclass(frozen=True)
class LedgerEvent:
    seq: int
    kind: str
    fence: int | None = None


@dataclass(frozen=True)
class ItemSnapshot:
    item_id: str
    tenant: str
    state: str
    fence: int
    acquisition_count: int
    events: tuple[LedgerEvent, ...] = ()

    @property
    def key(self) -> ItemKey:
        return (self.tenant, self.item_id)

    def events_by_seq(self) -> list[LedgerEvent]:
        return sorted(self.events, key=lambda e: e.seq)


@dataclass(frozen=True)
class DatabaseSnapshot:
    """Every work item of every tenant, with its ledger, read at a quiescent point."""

    items: tuple[ItemSnapshot, ...] = ()

    def index(self) -> dict[ItemKey, ItemSnapshot]:
        """Items by ``(tenant, item_id)``; the first row wins if a key repeats."""
        out: dict[ItemKey, ItemSnapshot] = {}
        for item in self.items:
            out.setdefault(item.key, item)
        return out

    def tenants(self) -> set[str]:
        return {item.tenant for item in self.items}

    @staticmethod
    def from_rows(
        items: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]] = ()
    ) -> DatabaseSnapshot:
        """Build from database rows (``tenant_id`` or ``tenant``; see ``SNAPSHOT_*_SQL``)."""
        ledger: dict[ItemKey, list[LedgerEvent]] = defaultdict(list)
        for row in events:
            key = (str(row.get("tenant_id", row.get("tenant"))), str(row["item_id"]))
            fence = row.get("fence")
            ledger[key].append(
                LedgerEvent(
                    int(row["seq"]), str(row["kind"]), None if fence is None else int(fence)
                )
            )
        out = []
        for row in items:
            tenant = str(row.get("tenant_id", row.get("tenant")))
            item_id = str(row["item_id"])
            out.append(
                ItemSnapshot(
                    item_id=item_id,
                    tenant=tenant,
                    state=str(row["state"]),
                    fence=int(row["fence"]),
                    acquisition_count=int(row["acquisition_count"]),
                    events=tuple(sorted(ledger.get((tenant, item_id), []), key=lambda e: e.seq)),
                )
            )
        return DatabaseSnapshot(tuple(out))

    def to_json(self) -> dict[str, JSONValue]:
        items: list[JSONValue] = []
        for item in self.items:
            events: list[JSONValue] = [
                {"seq": e.seq, "kind": e.kind, "fence": e.fence} for e in item.events
            ]
            items.append(
                {
                    "item_id": item.item_id,
                    "tenant": item.tenant,
                    "state": item.state,
                    "fence": item.fence,
                    "acquisition_count": item.acquisition_count,
                    "events": events,
                }
            )
        return {"items": items}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> DatabaseSnapshot:
        items = data.get("items", [])
        if not isinstance(items, list):
            raise ValueError("snapshot items must be a list")
        events = [
            {**event, "tenant": item["tenant"], "item_id": item["item_id"]}
            for item in items
            for event in item.get("events", [])
        ]
        return DatabaseSnapshot.from_rows(items, events)

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), sort_keys=True), encoding="utf-8")

    @staticmethod
    def load(path: str | Path) -> DatabaseSnapshot:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise ValueError(f"{path}: not a snapshot object")
        return DatabaseSnapshot.from_json(data)


# ----------------------------------------------------------------- violation


@dataclass(frozen=True)
class Violation:
    checker: str
    message: str
    tenant: str | None = None
    item_id: str | None = None
    op_ids: tuple[int, ...] = ()

    def __str__(self) -> str:
        where = ""
        if self.tenant is not None:
            where = f" [{self.tenant}/{self.item_id}]" if self.item_id else f" [{self.tenant}]"
        ops = f" (ops {', '.join(map(str, self.op_ids))})" if self.op_ids else ""
        return f"{self.checker}{where}: {self.message}{ops}"


# ------------------------------------------------------------------- helpers

EffectKey = tuple[str, str, str | None] | tuple[str, int]


def _effect_key(op: Operation) -> EffectKey:
    """Requests that make one effect: same tenant, key and body; a keyless op is its own."""
    if op.idempotency_key is None:
        return ("op", op.op_id)
    return (op.tenant, op.idempotency_key, op.request_body_hash)


def _effect_starts(ops: Iterable[Operation]) -> dict[EffectKey, float]:
    """The earliest start of each effect group: when its effect could first have happened."""
    starts: dict[EffectKey, float] = {}
    for op in ops:
        key = _effect_key(op)
        starts[key] = min(starts.get(key, math.inf), op.start_mono)
    return starts


def _item_key(op: Operation) -> ItemKey | None:
    return None if op.item_id is None else (op.tenant, op.item_id)


def _completed_events(item: ItemSnapshot) -> list[LedgerEvent]:
    return [e for e in item.events if e.kind == "completed"]


def _accepted_completions(history: History) -> dict[ItemKey, list[Operation]]:
    out: dict[ItemKey, list[Operation]] = defaultdict(list)
    for op in history.operations:
        key = _item_key(op)
        if op.kind is OpKind.COMPLETE and op.accepted and key is not None:
            out[key].append(op)
    return out


@dataclass
class _EnqueueEffect:
    tenant: str
    first_start: float = math.inf
    acked_end: float | None = None
    size: int = 1
    indeterminate: bool = False
    answers: list[tuple[Operation, tuple[str, ...]]] = field(default_factory=list)

    @property
    def ids(self) -> set[str]:
        return {item_id for _, ids in self.answers for item_id in ids}


def _enqueue_effects(history: History) -> dict[EffectKey, _EnqueueEffect]:
    effects: dict[EffectKey, _EnqueueEffect] = {}
    for op in history.operations:
        if op.kind not in ENQUEUES:
            continue
        effect = effects.setdefault(_effect_key(op), _EnqueueEffect(op.tenant))
        effect.first_start = min(effect.first_start, op.start_mono)
        effect.size = max(effect.size, op.batch_size)
        if op.accepted:
            effect.answers.append((op, tuple(op.enqueued_item_ids())))
            if effect.acked_end is None or op.end_mono < effect.acked_end:
                effect.acked_end = op.end_mono
        elif op.indeterminate:
            effect.indeterminate = True
    return effects


def _acknowledged(history: History) -> dict[ItemKey, list[Operation]]:
    """Every item id an accepted enqueue reported, with the ops that reported it."""
    out: dict[ItemKey, list[Operation]] = defaultdict(list)
    for op in history.operations:
        for item_id in op.enqueued_item_ids():
            out[(op.tenant, item_id)].append(op)
    return out


def _unacknowledged_budget(effects: Mapping[EffectKey, _EnqueueEffect]) -> Counter[str]:
    """Per tenant, how many items enqueues without any accepted answer may have made."""
    budget: Counter[str] = Counter()
    for effect in effects.values():
        if not effect.answers and effect.indeterminate:
            budget[effect.tenant] += effect.size
    return budget


# --------------------------------------------------------------- checker 1


def check_completions(history: History, snapshot: DatabaseSnapshot) -> list[Violation]:
    """Completed at most once by an accepted request; every acknowledged completion durable."""
    out: list[Violation] = []
    index = snapshot.index()
    for (tenant, item_id), ops in sorted(_accepted_completions(history).items()):
        op_ids = tuple(op.op_id for op in ops)
        effects = {_effect_key(op) for op in ops}
        if len(effects) > 1:
            out.append(
                Violation(
                    COMPLETIONS,
                    f"completed by {len(effects)} distinct accepted requests "
                    "(different idempotency keys or bodies); at most one may be accepted",
                    tenant,
                    item_id,
                    op_ids,
                )
            )
        item = index.get((tenant, item_id))
        if item is None:
            out.append(
                Violation(
                    COMPLETIONS,
                    "a completion was acknowledged with 2xx but the item is missing from the database",
                    tenant,
                    item_id,
                    op_ids,
                )
            )
            continue
        if item.state != "completed":
            out.append(
                Violation(
                    COMPLETIONS,
                    f"a completion was acknowledged with 2xx but the item is {item.state!r}",
                    tenant,
                    item_id,
                    op_ids,
                )
            )
        completed = _completed_events(item)
        if not completed:
            out.append(
                Violation(
                    COMPLETIONS,
                    "a completion was acknowledged with 2xx but the ledger has no completed event",
                    tenant,
                    item_id,
                    op_ids,
                )
            )
            continue
        acked_fences = {op.fence for op in ops if op.fence is not None}
        for event in completed:
            if event.fence is not None and acked_fences and event.fence not in acked_fences:
                out.append(
                    Violation(
                        COMPLETIONS,
                        f"the ledger's completed event (seq {event.seq}) has fence {event.fence}, "
                        f"but the acknowledged completion carried fence {sorted(acked_fences)}",
                        tenant,
                        item_id,
                        op_ids,
                    )
                )
    for item in snapshot.items:
        completed = _completed_events(item)
        if len(completed) > 1:
            out.append(
                Violation(
                    COMPLETIONS,
                    f"the ledger records {len(completed)} completed events "
                    f"(seq {', '.join(str(e.seq) for e in completed)})",
                    item.tenant,
                    item.item_id,
                )
            )
        if item.state == "completed" and item.events and not completed:
            out.append(
                Violation(
                    COMPLETIONS,
                    "the item is completed but its ledger has no completed event",
                    item.tenant,
                    item.item_id,
                )
            )
    return out


# --------------------------------------------------------------- checker 2


def check_fences(
    history: History,
    snapshot: DatabaseSnapshot,
    *,
    holder_event_kinds: frozenset[str] = HOLDER_EVENT_KINDS,
) -> list[Violation]:
    """Fences strictly increase across holders; no write with an older fence was accepted.

    Real time decides order: acquire A precedes acquire B only if A's response
    ended before B's request started; a write is stale only if a higher fence's
    acquire ended before the write's *first* attempt (same key and body) started,
    since a replay legitimately returns the answer of an earlier attempt.
    """
    out: list[Violation] = []
    grants: dict[ItemKey, list[tuple[int, Operation]]] = defaultdict(list)
    for op in history.operations:
        for item_id, fence in op.leases():
            grants[(op.tenant, item_id)].append((fence, op))

    for (tenant, item_id), item_grants in sorted(grants.items()):
        by_fence: dict[int, list[Operation]] = defaultdict(list)
        for fence, op in item_grants:
            by_fence[fence].append(op)
        for fence, ops in sorted(by_fence.items()):
            if len(ops) > 1:
                workers = ", ".join(str(op.worker) for op in ops)
                out.append(
                    Violation(
                        FENCES,
                        f"fence {fence} was handed out by {len(ops)} acquires (workers {workers})",
                        tenant,
                        item_id,
                        tuple(op.op_id for op in ops),
                    )
                )
        for fence_a, op_a in item_grants:
            for fence_b, op_b in item_grants:
                if op_a.end_mono < op_b.start_mono and fence_b < fence_a:
                    out.append(
                        Violation(
                            FENCES,
                            f"acquire {op_b.op_id} started after acquire {op_a.op_id} "
                            f"(fence {fence_a}) had answered, yet got the lower fence {fence_b}",
                            tenant,
                            item_id,
                            (op_a.op_id, op_b.op_id),
                        )
                    )

    starts = _effect_starts(history.operations)
    for op in history.operations:
        key = _item_key(op)
        if op.kind not in HOLDER_WRITES or not op.accepted or key is None or op.fence is None:
            continue
        first_start = starts.get(_effect_key(op), op.start_mono)
        for fence, grant in grants.get(key, []):
            if fence > op.fence and grant.end_mono < first_start:
                out.append(
                    Violation(
                        FENCES,
                        f"an accepted {op.kind} carried fence {op.fence}, but acquire "
                        f"{grant.op_id} had already handed out fence {fence} before "
                        "the request was first sent",
                        op.tenant,
                        op.item_id,
                        (grant.op_id, op.op_id),
                    )
                )
                break

    index = snapshot.index()
    for item in snapshot.items:
        highest: int | None = None
        for event in item.events_by_seq():
            if event.fence is None:
                continue
            if event.kind == "acquired":
                if highest is not None and event.fence <= highest:
                    out.append(
                        Violation(
                            FENCES,
                            f"ledger acquired event seq {event.seq} has fence {event.fence}, "
                            f"not above the earlier fence {highest}",
                            item.tenant,
                            item.item_id,
                        )
                    )
                highest = event.fence if highest is None else max(highest, event.fence)
            elif event.kind in holder_event_kinds and highest is not None and event.fence < highest:
                out.append(
                    Violation(
                        FENCES,
                        f"ledger {event.kind} event seq {event.seq} was accepted with fence "
                        f"{event.fence} after fence {highest} had been handed out",
                        item.tenant,
                        item.item_id,
                    )
                )
    for key, item_grants in sorted(grants.items()):
        current = index.get(key)
        if current is None:
            continue  # an item missing from the database is reported by the total-queue view
        top = max(fence for fence, _ in item_grants)
        if current.fence < top:
            out.append(
                Violation(
                    FENCES,
                    f"the item's fence is {current.fence}, below fence {top} handed out earlier",
                    key[0],
                    key[1],
                )
            )
        if current.events:
            ledger_fences = {e.fence for e in current.events if e.kind == "acquired"}
            for fence, grant in item_grants:
                if fence not in ledger_fences:
                    out.append(
                        Violation(
                            FENCES,
                            f"acquire handed out fence {fence} but the ledger has no acquired "
                            "event with that fence",
                            key[0],
                            key[1],
                            (grant.op_id,),
                        )
                    )
    return out


# --------------------------------------------------------------- checker 3


def _bounds_at(effects: Mapping[EffectKey, _EnqueueEffect], at: float) -> dict[str, list[int]]:
    """Per tenant ``[low, high]``: items that must exist / may exist at time ``at``."""
    bounds: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for effect in effects.values():
        ids = effect.ids
        if effect.acked_end is not None and effect.acked_end <= at:
            bounds[effect.tenant][0] += len(ids)
        if effect.first_start <= at:
            if ids:
                bounds[effect.tenant][1] += len(ids)
            elif effect.indeterminate:
                bounds[effect.tenant][1] += effect.size
    return bounds


def _conservation_violation(
    tenant: str, counts: Mapping[str, int], low: int, high: int, where: str
) -> Violation | None:
    total = sum(counts.get(state, 0) for state in STATES)
    breakdown = " + ".join(f"{state} {counts.get(state, 0)}" for state in STATES)
    if total < low:
        return Violation(
            CONSERVATION,
            f"{where}: {low} enqueued items were acknowledged but only {total} are accounted "
            f"for ({breakdown})",
            tenant,
        )
    if total > high:
        unknown = high - low
        return Violation(
            CONSERVATION,
            f"{where}: {total} items exist ({breakdown}) but only {low} enqueues were "
            f"acknowledged and at most {unknown} more had an unknown outcome",
            tenant,
        )
    return None


def check_conservation(history: History, snapshot: DatabaseSnapshot) -> list[Violation]:
    """Accepted enqueues = completed + quarantined + cancelled + ready + leased, per tenant.

    Checked on the final snapshot and on every recorded quiescent point. An
    enqueue that got no answer may or may not have made its items, so the
    count must lie between the acknowledged items and that plus the unknowns.
    """
    out: list[Violation] = []
    effects = _enqueue_effects(history)
    final = _bounds_at(effects, math.inf)
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for item in snapshot.items:
        counts[item.tenant][item.state] += 1
        if item.state not in STATES:
            out.append(
                Violation(
                    CONSERVATION, f"unknown item state {item.state!r}", item.tenant, item.item_id
                )
            )
    for tenant in sorted(set(final) | set(counts)):
        low, high = final.get(tenant, [0, 0])
        found = _conservation_violation(tenant, counts[tenant], low, high, "final snapshot")
        if found is not None:
            out.append(found)
    for point in history.quiescent:
        low, high = _bounds_at(effects, point.mono).get(point.tenant, [0, 0])
        found = _conservation_violation(
            point.tenant, point.counts, low, high, f"quiescent point at {point.wall:.3f}"
        )
        if found is not None:
            out.append(found)
    return out


# --------------------------------------------------------------- checker 4


def check_backlog_cap(history: History) -> list[Violation]:
    """The backlog (ready + leased) never exceeded the tenant's cap in any probe sample."""
    return [
        Violation(
            BACKLOG_CAP,
            f"probe at {sample.wall:.3f} saw backlog {sample.backlog} above the cap {sample.cap}",
            sample.tenant,
        )
        for sample in history.samples
        if sample.backlog > sample.cap
    ]


# --------------------------------------------------------------- checker 5


def check_idempotent_replays(history: History) -> list[Violation]:
    """Every definitive answer to one (tenant, key, body) is the same status and body;
    and one key never makes effects for two different bodies.
    """
    out: list[Violation] = []
    by_key: dict[tuple[str, str], list[Operation]] = defaultdict(list)
    for op in history.operations:
        if op.idempotency_key is not None:
            by_key[(op.tenant, op.idempotency_key)].append(op)
    for (tenant, key), ops in sorted(by_key.items()):
        by_body: dict[str | None, list[Operation]] = defaultdict(list)
        for op in ops:
            by_body[op.request_body_hash].append(op)
        for body_ops in by_body.values():
            answers = sorted(
                (op for op in body_ops if op.definitive), key=lambda op: (op.end_mono, op.op_id)
            )
            if not answers:
                continue
            original = answers[0]
            for op in answers[1:]:
                diffs = []
                if op.status != original.status:
                    diffs.append(f"status {op.status} instead of {original.status}")
                if op.response_body_hash != original.response_body_hash:
                    diffs.append("a different body")
                if diffs:
                    out.append(
                        Violation(
                            IDEMPOTENT_REPLAY,
                            f"{op.kind} with key {key!r} replayed the same request but got "
                            f"{' and '.join(diffs)} than the original answer (op {original.op_id})",
                            tenant,
                            op.item_id or original.item_id,
                            (original.op_id, op.op_id),
                        )
                    )
        accepted_bodies = {
            h for h, body_ops in by_body.items() if any(o.accepted for o in body_ops)
        }
        if len(accepted_bodies) > 1:
            accepted = tuple(op.op_id for op in ops if op.accepted)
            out.append(
                Violation(
                    IDEMPOTENT_REPLAY,
                    f"key {key!r} was accepted for {len(accepted_bodies)} different request "
                    "bodies; a reused key must be refused with 422 idempotency-key-reuse",
                    tenant,
                    None,
                    accepted,
                )
            )
    return out


# --------------------------------------------------------------- checker 6


@dataclass(frozen=True)
class TotalQueueView:
    """The Jepsen total-queue accounting of one run."""

    acknowledged: int
    recovered: tuple[ItemKey, ...]
    lost: tuple[ItemKey, ...]
    duplicated: tuple[ItemKey, ...]
    unexpected: tuple[ItemKey, ...]
    notes: tuple[Violation, ...]

    @property
    def ok(self) -> bool:
        return not self.notes


def total_queue_view(history: History, snapshot: DatabaseSnapshot) -> TotalQueueView:
    """Nothing lost, nothing duplicated, nothing unexpected.

    * lost: acknowledged by an enqueue but not in the database;
    * duplicated: a repeated row, a retry of one enqueue (same key and body)
      that made new items, or an item consumed (completed) more than once;
    * unexpected: items beyond what the enqueues, counting the unanswered
      ones, could have made; or an item acquired or completed that was never
      enqueued and is not in the database.
    ``recovered`` counts items present whose enqueue answer never arrived.
    """
    notes: list[Violation] = []
    acked = _acknowledged(history)
    effects = _enqueue_effects(history)
    index = snapshot.index()

    lost = sorted(key for key in acked if key not in index)
    for tenant, item_id in lost:
        notes.append(
            Violation(
                TOTAL_QUEUE,
                "lost: the enqueue was acknowledged but the item is not in the database",
                tenant,
                item_id,
                tuple(op.op_id for op in acked[(tenant, item_id)]),
            )
        )

    duplicated: set[ItemKey] = set()
    rows = Counter(item.key for item in snapshot.items)
    for key, n in sorted(rows.items()):
        if n > 1:
            duplicated.add(key)
            notes.append(
                Violation(TOTAL_QUEUE, f"duplicated: {n} rows for one item", key[0], key[1])
            )
    for effect in effects.values():
        if len(effect.answers) < 2:
            continue
        first_op, first_ids = effect.answers[0]
        for op, ids in effect.answers[1:]:
            extra = sorted(set(ids) - set(first_ids))
            for item_id in extra:
                duplicated.add((effect.tenant, item_id))
                notes.append(
                    Violation(
                        TOTAL_QUEUE,
                        "duplicated: a retry of one enqueue (same key and body) made a new item",
                        effect.tenant,
                        item_id,
                        (first_op.op_id, op.op_id),
                    )
                )
    for key, ops in sorted(_accepted_completions(history).items()):
        n = len({_effect_key(op) for op in ops})
        if n > 1:
            duplicated.add(key)
            notes.append(
                Violation(
                    TOTAL_QUEUE,
                    f"duplicated: consumed {n} times (distinct accepted completions)",
                    key[0],
                    key[1],
                    tuple(op.op_id for op in ops),
                )
            )
    for item in snapshot.items:
        n = len(_completed_events(item))
        if n > 1 and item.key not in duplicated:
            duplicated.add(item.key)
            notes.append(
                Violation(
                    TOTAL_QUEUE,
                    f"duplicated: consumed {n} times (completed events in the ledger)",
                    item.tenant,
                    item.item_id,
                )
            )

    unexpected: set[ItemKey] = set()
    budget = _unacknowledged_budget(effects)
    extras: dict[str, list[ItemKey]] = defaultdict(list)
    for key in index:
        if key not in acked:
            extras[key[0]].append(key)
    recovered: list[ItemKey] = []
    for tenant, keys in sorted(extras.items()):
        if len(keys) <= budget[tenant]:
            recovered.extend(keys)
            continue
        for key in sorted(keys):
            unexpected.add(key)
        notes.append(
            Violation(
                TOTAL_QUEUE,
                f"unexpected: {len(keys)} items were never acknowledged as enqueued, but "
                f"unanswered enqueues could account for at most {budget[tenant]}",
                tenant,
            )
        )
    for op in history.operations:
        touched: list[str] = [item_id for item_id, _ in op.leases()]
        if op.accepted and op.kind in HOLDER_WRITES and op.item_id is not None:
            touched.append(op.item_id)
        for item_id in touched:
            key = (op.tenant, item_id)
            if key not in acked and key not in index and key not in unexpected:
                unexpected.add(key)
                notes.append(
                    Violation(
                        TOTAL_QUEUE,
                        f"unexpected: an accepted {op.kind} touched an item that was never "
                        "enqueued and is not in the database",
                        op.tenant,
                        item_id,
                        (op.op_id,),
                    )
                )
    return TotalQueueView(
        acknowledged=len(acked),
        recovered=tuple(sorted(recovered)),
        lost=tuple(lost),
        duplicated=tuple(sorted(duplicated)),
        unexpected=tuple(sorted(unexpected)),
        notes=tuple(notes),
    )


def check_total_queue(history: History, snapshot: DatabaseSnapshot) -> list[Violation]:
    return list(total_queue_view(history, snapshot).notes)


# ------------------------------------------------------------------- summary


@dataclass(frozen=True)
class CheckReport:
    scenario: str
    operations: int
    faults_injected: int
    lost: int
    duplicated: int
    violations: tuple[Violation, ...]
    by_checker: dict[str, int]

    @property
    def passed(self) -> bool:
        return not self.violations

    @property
    def result(self) -> str:
        return "PASS" if self.passed else "FAIL"


def run_all_checks(
    history: History,
    snapshot: DatabaseSnapshot,
    *,
    scenario: str,
    faults_injected: int | None = None,
) -> CheckReport:
    """Run the six checkers; ``faults_injected`` defaults to the faults in the history."""
    view = total_queue_view(history, snapshot)
    results: dict[str, Sequence[Violation]] = {
        COMPLETIONS: check_completions(history, snapshot),
        FENCES: check_fences(history, snapshot),
        CONSERVATION: check_conservation(history, snapshot),
        BACKLOG_CAP: check_backlog_cap(history),
        IDEMPOTENT_REPLAY: check_idempotent_replays(history),
        TOTAL_QUEUE: view.notes,
    }
    violations = tuple(v for name in CHECKERS for v in results[name])
    return CheckReport(
        scenario=scenario,
        operations=len(history.operations),
        faults_injected=len(history.faults) if faults_injected is None else faults_injected,
        lost=len(view.lost),
        duplicated=len(view.duplicated),
        violations=violations,
        by_checker={name: len(results[name]) for name in CHECKERS},
    )


SUMMARY_COLUMNS = (
    "scenario",
    "operations",
    "faults injected",
    "lost",
    "duplicated",
    "invariant violations",
    "result",
)


def render_summary_row(report: CheckReport) -> str:
    """One Markdown table row: scenario, operations, faults, lost, duplicated, violations, result."""
    cells = (
        report.scenario,
        str(report.operations),
        str(report.faults_injected),
        str(report.lost),
        str(report.duplicated),
        str(len(report.violations)),
        report.result,
    )
    return "| " + " | ".join(cells) + " |"


def render_summary_table(reports: Iterable[CheckReport]) -> str:
    header = "| " + " | ".join(SUMMARY_COLUMNS) + " |"
    rule = "|" + "|".join(" --- " for _ in SUMMARY_COLUMNS) + "|"
    return "\n".join([header, rule, *(render_summary_row(r) for r in reports)])
