"""A thread-safe recorder of every operation a scenario performs, and its answer.

An :class:`Operation` is one HTTP request and what came back (or that nothing
came back). Besides operations a history holds backlog probe samples, the
faults injected, and per-tenant counts read at quiescent points. Histories
dump to JSONL and load back, so worker subprocesses can record their own and
the harness merges them (monotonic times come from ``CLOCK_MONOTONIC``, which
is one clock for every process of the machine).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import TypeAlias, TypeVar

__all__ = [
    "BacklogSample",
    "FaultEvent",
    "History",
    "HistoryRecorder",
    "JSONValue",
    "OpKind",
    "Operation",
    "PendingOperation",
    "QuiescentPoint",
    "hash_body",
    "hash_json",
    "parse_body",
]

JSONValue: TypeAlias = bool | int | float | str | list["JSONValue"] | dict[str, "JSONValue"] | None

#: HTTP statuses of a domain refusal that the server keeps as an idempotency receipt.
DEFINITIVE_REFUSALS = frozenset({409, 422})
#: Problem codes that are answers about the key itself, never the stored outcome.
TRANSIENT_CODES = frozenset({"idempotency-key-in-flight"})


class OpKind(StrEnum):
    ENQUEUE = "enqueue"
    ENQUEUE_BATCH = "enqueue_batch"
    ACQUIRE = "acquire"
    HEARTBEAT = "heartbeat"
    COMPLETE = "complete"
    REQUEUE = "requeue"
    TRIAGE = "triage"
    REPLAY = "replay"
    DISCARD = "discard"
    READ = "read"


#: Holder operations: they carry a fence and need the lease.
HOLDER_WRITES = frozenset({OpKind.HEARTBEAT, OpKind.COMPLETE, OpKind.REQUEUE, OpKind.TRIAGE})
ENQUEUES = frozenset({OpKind.ENQUEUE, OpKind.ENQUEUE_BATCH})


def hash_json(value: object) -> str:
    """SHA-256 of the canonical JSON form (sorted keys, no spaces)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def parse_body(raw: bytes | None) -> JSONValue:
    """The JSON value of a body, or None when it is empty or not JSON."""
    if not raw:
        return None
    try:
        value: JSONValue = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None
    return value


def hash_body(raw: bytes | None) -> str | None:
    """Hash of a raw body: canonical JSON hash when it parses, else SHA-256 of the bytes."""
    if raw is None:
        return None
    if raw:
        try:
            value: JSONValue = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return hashlib.sha256(raw).hexdigest()
        return hash_json(value)
    return hashlib.sha256(raw).hexdigest()


@dataclass(frozen=True)
class Operation:
    """One request and its answer.

    ``status`` is None when no answer arrived (timeout, reset, lost reply).
    ``fence`` is the fence the request carried (holder writes); an acquire's
    fences are in its response body (see :meth:`leases`).
    """

    op_id: int
    kind: OpKind
    tenant: str
    start_mono: float
    end_mono: float
    start_wall: float
    end_wall: float
    item_id: str | None = None
    queue: str | None = None
    fence: int | None = None
    worker: str | None = None
    idempotency_key: str | None = None
    request_body_hash: str | None = None
    batch_size: int = 1
    status: int | None = None
    response_body_hash: str | None = None
    response_body: JSONValue = None
    replayed: bool = False
    error: str | None = None
    source: str = ""

    @property
    def answered(self) -> bool:
        return self.status is not None

    @property
    def accepted(self) -> bool:
        """A 2xx answer."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def indeterminate(self) -> bool:
        """No answer, or a 5xx: the effect may or may not have happened."""
        return self.status is None or self.status >= 500

    @property
    def problem_code(self) -> str | None:
        body = self.response_body
        if isinstance(body, dict):
            code = body.get("code")
            if isinstance(code, str):
                return code
        return None

    @property
    def definitive(self) -> bool:
        """An answer the server keeps as the idempotency receipt (2xx, 409/422 refusals)."""
        if self.accepted:
            return True
        return self.status in DEFINITIVE_REFUSALS and self.problem_code not in TRANSIENT_CODES

    def leases(self) -> list[tuple[str, int]]:
        """``(item_id, fence)`` of every lease an accepted acquire handed out."""
        if self.kind is not OpKind.ACQUIRE or not self.accepted:
            return []
        body = self.response_body
        if not isinstance(body, dict):
            return []
        leases = body.get("leases")
        out: list[tuple[str, int]] = []
        if isinstance(leases, list):
            for lease in leases:
                if isinstance(lease, dict):
                    item_id, fence = lease.get("item_id"), lease.get("fence")
                    if isinstance(item_id, str) and isinstance(fence, int):
                        out.append((item_id, fence))
        return out

    def enqueued_item_ids(self) -> list[str]:
        """Item ids an accepted enqueue (single or batch) reported."""
        if self.kind not in ENQUEUES or not self.accepted:
            return []
        body = self.response_body
        if not isinstance(body, dict):
            return []
        items = body.get("items")
        if isinstance(items, list):
            ids: list[str] = []
            for item in items:
                if isinstance(item, dict):
                    item_id = item.get("item_id")
                    if isinstance(item_id, str):
                        ids.append(item_id)
            return ids
        single = body.get("item_id")
        return [single] if isinstance(single, str) else []

    def to_json(self) -> dict[str, JSONValue]:
        data: dict[str, JSONValue] = asdict(self)
        data["kind"] = str(self.kind)
        return data

    @staticmethod
    def from_json(data: Mapping[str, JSONValue]) -> Operation:
        return Operation(
            op_id=_int(data, "op_id"),
            kind=OpKind(_str(data, "kind")),
            tenant=_str(data, "tenant"),
            start_mono=_float(data, "start_mono"),
            end_mono=_float(data, "end_mono"),
            start_wall=_float(data, "start_wall"),
            end_wall=_float(data, "end_wall"),
            item_id=_opt_str(data, "item_id"),
            queue=_opt_str(data, "queue"),
            fence=_opt_int(data, "fence"),
            worker=_opt_str(data, "worker"),
            idempotency_key=_opt_str(data, "idempotency_key"),
            request_body_hash=_opt_str(data, "request_body_hash"),
            batch_size=_int(data, "batch_size"),
            status=_opt_int(data, "status"),
            response_body_hash=_opt_str(data, "response_body_hash"),
            response_body=data.get("response_body"),
            replayed=bool(data.get("replayed", False)),
            error=_opt_str(data, "error"),
            source=_opt_str(data, "source") or "",
        )


@dataclass(frozen=True)
class BacklogSample:
    """One reading of a tenant's backlog by the probe."""

    tenant: str
    backlog: int
    cap: int
    mono: float
    wall: float

    def to_json(self) -> dict[str, JSONValue]:
        data: dict[str, JSONValue] = asdict(self)
        return data

    @staticmethod
    def from_json(data: Mapping[str, JSONValue]) -> BacklogSample:
        return BacklogSample(
            tenant=_str(data, "tenant"),
            backlog=_int(data, "backlog"),
            cap=_int(data, "cap"),
            mono=_float(data, "mono"),
            wall=_float(data, "wall"),
        )


@dataclass(frozen=True)
class FaultEvent:
    """A fault the scenario injected (proxy mode, SIGKILL, database crash...)."""

    kind: str
    detail: str
    mono: float
    wall: float

    def to_json(self) -> dict[str, JSONValue]:
        data: dict[str, JSONValue] = asdict(self)
        return data

    @staticmethod
    def from_json(data: Mapping[str, JSONValue]) -> FaultEvent:
        return FaultEvent(
            kind=_str(data, "kind"),
            detail=_str(data, "detail"),
            mono=_float(data, "mono"),
            wall=_float(data, "wall"),
        )


@dataclass(frozen=True)
class QuiescentPoint:
    """Per-state item counts of one tenant read while no request was in flight."""

    tenant: str
    counts: dict[str, int]
    mono: float
    wall: float

    def to_json(self) -> dict[str, JSONValue]:
        counts: dict[str, JSONValue] = dict(self.counts)
        return {"tenant": self.tenant, "counts": counts, "mono": self.mono, "wall": self.wall}

    @staticmethod
    def from_json(data: Mapping[str, JSONValue]) -> QuiescentPoint:
        raw = data.get("counts")
        if not isinstance(raw, dict):
            raise ValueError("quiescent point without counts")
        counts = {str(k): int(v) for k, v in raw.items() if isinstance(v, int)}
        return QuiescentPoint(
            tenant=_str(data, "tenant"),
            counts=counts,
            mono=_float(data, "mono"),
            wall=_float(data, "wall"),
        )


@dataclass(frozen=True)
class History:
    """An immutable recorded history."""

    operations: tuple[Operation, ...] = ()
    samples: tuple[BacklogSample, ...] = ()
    faults: tuple[FaultEvent, ...] = ()
    quiescent: tuple[QuiescentPoint, ...] = field(default=())

    def dump_jsonl(self, path: str | Path) -> None:
        with Path(path).open("w", encoding="utf-8") as fh:
            for record in self._records():
                fh.write(json.dumps(record, ensure_ascii=False, sort_keys=True))
                fh.write("\n")

    def _records(self) -> Iterable[dict[str, JSONValue]]:
        for op in self.operations:
            yield {"type": "op", **op.to_json()}
        for sample in self.samples:
            yield {"type": "sample", **sample.to_json()}
        for fault in self.faults:
            yield {"type": "fault", **fault.to_json()}
        for point in self.quiescent:
            yield {"type": "quiescent", **point.to_json()}

    @staticmethod
    def load_jsonl(path: str | Path) -> History:
        ops: list[Operation] = []
        samples: list[BacklogSample] = []
        faults: list[FaultEvent] = []
        points: list[QuiescentPoint] = []
        with Path(path).open(encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError(f"{path}:{lineno}: not a JSON object")
                kind = record.get("type")
                if kind == "op":
                    ops.append(Operation.from_json(record))
                elif kind == "sample":
                    samples.append(BacklogSample.from_json(record))
                elif kind == "fault":
                    faults.append(FaultEvent.from_json(record))
                elif kind == "quiescent":
                    points.append(QuiescentPoint.from_json(record))
                else:
                    raise ValueError(f"{path}:{lineno}: unknown record type {kind!r}")
        return History(tuple(ops), tuple(samples), tuple(faults), tuple(points))

    @staticmethod
    def merge(*histories: History) -> History:
        """One history from several (e.g. one per worker process).

        Operations are ordered by start time and renumbered from 1.
        """
        ops = sorted(
            (op for h in histories for op in h.operations),
            key=lambda op: (op.start_mono, op.end_mono, op.source, op.op_id),
        )
        renumbered = tuple(replace(op, op_id=i) for i, op in enumerate(ops, 1))
        return History(
            operations=renumbered,
            samples=tuple(sorted((s for h in histories for s in h.samples), key=_by_mono)),
            faults=tuple(sorted((f for h in histories for f in h.faults), key=_by_mono)),
            quiescent=tuple(sorted((q for h in histories for q in h.quiescent), key=_by_mono)),
        )


_T = TypeVar("_T", BacklogSample, FaultEvent, QuiescentPoint)


def _by_mono(record: _T) -> float:
    return record.mono


@dataclass(frozen=True)
class PendingOperation:
    """A started operation, to be finished with :meth:`HistoryRecorder.finish`."""

    op_id: int
    kind: OpKind
    tenant: str
    start_mono: float
    start_wall: float
    item_id: str | None
    queue: str | None
    fence: int | None
    worker: str | None
    idempotency_key: str | None
    request_body_hash: str | None
    batch_size: int


class HistoryRecorder:
    """Records operations from many threads. Clocks are injectable for tests."""

    def __init__(
        self,
        *,
        source: str = "",
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._clock = clock
        self._wall = wall_clock
        self._lock = threading.Lock()
        self._next_id = 1
        self._ops: list[Operation] = []
        self._samples: list[BacklogSample] = []
        self._faults: list[FaultEvent] = []
        self._quiescent: list[QuiescentPoint] = []

    def begin(
        self,
        kind: OpKind | str,
        *,
        tenant: str,
        item_id: str | None = None,
        queue: str | None = None,
        fence: int | None = None,
        worker: str | None = None,
        idempotency_key: str | None = None,
        request_body: object = None,
        batch_size: int | None = None,
    ) -> PendingOperation:
        """Note the start of an operation, just before its request is sent."""
        op_kind = OpKind(kind)
        if batch_size is None:
            batch_size = 1
            if op_kind is OpKind.ENQUEUE_BATCH and isinstance(request_body, dict):
                items = request_body.get("items")
                if isinstance(items, list):
                    batch_size = len(items)
        with self._lock:
            op_id = self._next_id
            self._next_id += 1
        return PendingOperation(
            op_id=op_id,
            kind=op_kind,
            tenant=tenant,
            start_mono=self._clock(),
            start_wall=self._wall(),
            item_id=item_id,
            queue=queue,
            fence=fence,
            worker=worker,
            idempotency_key=idempotency_key,
            request_body_hash=None if request_body is None else hash_json(request_body),
            batch_size=batch_size,
        )

    def finish(
        self,
        pending: PendingOperation,
        *,
        status: int | None,
        body: bytes | None = None,
        replayed: bool = False,
        error: str | None = None,
    ) -> Operation:
        """Note the answer (``status=None`` and an ``error`` when none came)."""
        end_mono, end_wall = self._clock(), self._wall()
        op = Operation(
            op_id=pending.op_id,
            kind=pending.kind,
            tenant=pending.tenant,
            start_mono=pending.start_mono,
            end_mono=end_mono,
            start_wall=pending.start_wall,
            end_wall=end_wall,
            item_id=pending.item_id,
            queue=pending.queue,
            fence=pending.fence,
            worker=pending.worker,
            idempotency_key=pending.idempotency_key,
            request_body_hash=pending.request_body_hash,
            batch_size=pending.batch_size,
            status=status,
            response_body_hash=hash_body(body) if status is not None else None,
            response_body=parse_body(body),
            replayed=replayed,
            error=error,
            source=self._source,
        )
        self.add(op)
        return op

    def fail(self, pending: PendingOperation, error: BaseException | str) -> Operation:
        """Note that no answer came."""
        text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
        return self.finish(pending, status=None, error=text)

    def add(self, op: Operation) -> None:
        """Add a finished operation as is (synthetic histories, imports)."""
        with self._lock:
            self._ops.append(op)
            self._next_id = max(self._next_id, op.op_id + 1)

    def record_backlog(self, tenant: str, backlog: int, cap: int) -> BacklogSample:
        sample = BacklogSample(tenant, backlog, cap, self._clock(), self._wall())
        with self._lock:
            self._samples.append(sample)
        return sample

    def note_fault(self, kind: str, detail: str = "") -> FaultEvent:
        fault = FaultEvent(kind, detail, self._clock(), self._wall())
        with self._lock:
            self._faults.append(fault)
        return fault

    def record_quiescent(self, tenant: str, counts: Mapping[str, int]) -> QuiescentPoint:
        point = QuiescentPoint(tenant, dict(counts), self._clock(), self._wall())
        with self._lock:
            self._quiescent.append(point)
        return point

    def history(self) -> History:
        """An immutable copy of everything recorded so far."""
        with self._lock:
            ops = sorted(self._ops, key=lambda op: op.op_id)
            return History(
                tuple(ops), tuple(self._samples), tuple(self._faults), tuple(self._quiescent)
            )

    def __len__(self) -> int:
        with self._lock:
            return len(self._ops)


# ------------------------------------------------------------------ decoding


def _get(data: Mapping[str, JSONValue], key: str) -> JSONValue:
    if key not in data:
        raise ValueError(f"missing field {key!r}")
    return data[key]


def _int(data: Mapping[str, JSONValue], key: str) -> int:
    value = _get(data, key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field {key!r} is not an integer: {value!r}")
    return value


def _opt_int(data: Mapping[str, JSONValue], key: str) -> int | None:
    return None if data.get(key) is None else _int(data, key)


def _float(data: Mapping[str, JSONValue], key: str) -> float:
    value = _get(data, key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"field {key!r} is not a number: {value!r}")
    return float(value)


def _str(data: Mapping[str, JSONValue], key: str) -> str:
    value = _get(data, key)
    if not isinstance(value, str):
        raise ValueError(f"field {key!r} is not a string: {value!r}")
    return value


def _opt_str(data: Mapping[str, JSONValue], key: str) -> str | None:
    return None if data.get(key) is None else _str(data, key)
