"""W3C Trace Context headers (https://www.w3.org/TR/trace-context/), read strictly.

An enqueue keeps its producer's `traceparent` and `tracestate` with the item, and each lease
hands them to its worker. A header that is not exactly what the recommendation writes is
dropped, never refused: tracing is the producer's business, and a bad header must not cost
it its enqueue. Pure standard library: the server, the SDK and the CLI all read it. Its
SQL twin, `queue_server.trace_context` (migration 0017), reads the arguments of an enqueue
inside an application's transaction; tests/transactional/test_trace_context_in_sql.py
holds the two to the same answers: change both together.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

# Version 00 only: lower-case hex, a trace id and a parent id that are not all zeros.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_INVALID_TRACE_ID = "0" * 32
_INVALID_PARENT_ID = "0" * 16
# tracestate: at most 32 list members `key=value`, kept whole only up to 512 characters
# (the length the recommendation lets a vendor truncate to).
MAX_TRACESTATE = 512
_MAX_MEMBERS = 32
_KEY = re.compile(
    r"[a-z][a-z0-9_\-*/]{0,255}"
    r"|[a-z0-9][a-z0-9_\-*/]{0,240}@[a-z][a-z0-9_\-*/]{0,13}"
)
_VALUE = re.compile(r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]")


@dataclass(frozen=True, slots=True)
class TraceContext:
    """A producer's trace context, as it sent it."""

    traceparent: str
    tracestate: str | None = None

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]

    @property
    def parent_id(self) -> str:
        return self.traceparent[36:52]

    def as_dict(self) -> dict[str, str]:
        """The lease's `trace` object (and the ledger's): traceparent, tracestate if any."""
        out = {"traceparent": self.traceparent}
        if self.tracestate is not None:
            out["tracestate"] = self.tracestate
        return out


def valid_traceparent(value: str) -> bool:
    match = _TRACEPARENT.fullmatch(value)
    return (
        match is not None
        and match.group(1) != _INVALID_TRACE_ID
        and match.group(2) != _INVALID_PARENT_ID
    )


def valid_tracestate(value: str) -> bool:
    if len(value) > MAX_TRACESTATE:
        return False
    members = [m.strip(" \t") for m in value.split(",")]
    members = [m for m in members if m]
    if not members or len(members) > _MAX_MEMBERS:
        return False
    keys = set()
    for member in members:
        key, sep, val = member.partition("=")
        if not sep or _KEY.fullmatch(key) is None or _VALUE.fullmatch(val) is None:
            return False
        if key in keys:
            return False
        keys.add(key)
    return True


def parse(traceparent: str | None, tracestate: str | None = None) -> TraceContext | None:
    """The context, or None when `traceparent` is missing or malformed. A malformed or
    oversized `tracestate` is dropped on its own (the recommendation's rule); a valid one
    is kept as sent."""
    if traceparent is None or not valid_traceparent(traceparent):
        return None
    if tracestate is not None and not valid_tracestate(tracestate):
        tracestate = None
    return TraceContext(traceparent, tracestate)


def from_headers(headers: Iterable[tuple[bytes, bytes]]) -> TraceContext | None:
    """The context of raw ASGI headers: one `traceparent` (two are malformed), and the
    `tracestate` fields joined as the recommendation combines them."""
    parents: list[bytes] = []
    states: list[bytes] = []
    for name, value in headers:
        if name == b"traceparent":
            parents.append(value)
        elif name == b"tracestate":
            states.append(value)
    if len(parents) != 1:
        return None
    state = b",".join(states).decode("latin-1") if states else None
    return parse(parents[0].decode("latin-1"), state)
