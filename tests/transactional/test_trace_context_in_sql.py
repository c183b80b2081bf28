"""queue_server.trace_context, the database's reading of a W3C trace context, gives the
same answer as queue_server.tracecontext (what the REST routes read) over a table of valid
and malformed traceparent and tracestate values: kept as sent, or dropped, never an error."""

from __future__ import annotations

import itertools

import psycopg

from queue_server import tracecontext

DB = psycopg.Connection[dict[str, object]]

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"

TRACEPARENTS: list[str | None] = [
    f"00-{TRACE_ID}-{PARENT_ID}-01",
    f"00-{TRACE_ID}-{PARENT_ID}-00",
    f"00-{TRACE_ID}-{PARENT_ID}-ff",
    None,
    "",
    f"00-{TRACE_ID.upper()}-{PARENT_ID}-01",  # upper-case hex
    f"00-{TRACE_ID}-{PARENT_ID}-0A",
    f"01-{TRACE_ID}-{PARENT_ID}-01",  # another version
    f"ff-{TRACE_ID}-{PARENT_ID}-01",
    f"00-{'0' * 32}-{PARENT_ID}-01",  # the invalid trace id
    f"00-{TRACE_ID}-{'0' * 16}-01",  # the invalid parent id
    f"00-{TRACE_ID[:31]}-{PARENT_ID}-01",
    f"00-{TRACE_ID}0-{PARENT_ID}-01",
    f"00-{TRACE_ID}-{PARENT_ID[:15]}-01",
    f"00-{TRACE_ID}-{PARENT_ID}-1",
    f"00-{TRACE_ID}-{PARENT_ID}-011",
    f"00-{TRACE_ID}-{PARENT_ID}-01-extra",
    f"00-{TRACE_ID}-{PARENT_ID}-01\n",
    f" 00-{TRACE_ID}-{PARENT_ID}-01",
    f"00-{TRACE_ID}-{PARENT_ID}-01 ",
    f"00_{TRACE_ID}_{PARENT_ID}_01",
    f"00-{TRACE_ID[:-1]}g-{PARENT_ID}-01",
    f"00-{TRACE_ID[:-1]}\u0663-{PARENT_ID}-01",  # an Arabic-Indic digit
    f"00-{TRACE_ID}{PARENT_ID}01",
]


def members(n: int, width: int) -> str:
    """`n` members, `width` characters each, joined by commas."""
    return ",".join(f"k{i:02d}=" + "v" * (width - 4) for i in range(n))


TRACESTATES: list[str | None] = [
    None,
    "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7",
    " congo=t61 , tenant@vendor=x ",
    "a=b",
    "a= b",  # a value may start with a space
    "a=b c",
    "a=b\t",  # trailing tabs and spaces around a member are skipped
    ",,a=b,,",
    "a*/_-=x",
    "0a@b=c",  # a multi-tenant key may start with a digit
    "tenant@=x",
    "a" + "b" * 255 + "=x",  # a key of 256 characters
    "a" + "b" * 256 + "=x",
    "t" * 241 + "@v=x",
    "t" * 242 + "@v=x",
    "t@v" + "w" * 13 + "=x",  # a vendor of 14 characters
    "t@v" + "w" * 14 + "=x",
    "k=" + "v" * 256,
    "k=" + "v" * 257,
    members(32, 8),
    members(33, 8),
    members(16, 30) + ",z=" + "v" * 14,  # 16 * 30 + 15 + 17 = 512 characters
    members(16, 30) + ",z=" + "v" * 15,  # 513
    "",
    " ",
    ",",
    "k=",
    "=v",
    "K=v",
    "k=v=w",
    "k=v,k=w",  # a key twice
    "k=v,j",
    "k=v;w",
    "k=\u00e9",
    "k=v\n",
    "k=a\tb",
    "k=v,,  ,j=w",
]


def test_the_sql_check_and_the_python_one_agree_on_every_value(db: DB) -> None:
    assert [len(s) for s in TRACESTATES if s and s.startswith("k00=") and ",z=" in s] == [512, 513]
    pairs = list(itertools.product(TRACEPARENTS, TRACESTATES))
    rows = db.execute(
        "SELECT queue_server.trace_context(tp, ts) AS trace"
        " FROM unnest(%s::text[], %s::text[]) WITH ORDINALITY AS x(tp, ts, i) ORDER BY i",
        [[p for p, _ in pairs], [s for _, s in pairs]],
    ).fetchall()
    assert len(rows) == len(pairs)
    disagreements = []
    for (traceparent, tracestate), row in zip(pairs, rows, strict=True):
        parsed = tracecontext.parse(traceparent, tracestate)
        expected = None if parsed is None else parsed.as_dict()
        if row["trace"] != expected:
            disagreements.append((traceparent, tracestate, row["trace"], expected))
    assert disagreements == []
    # The table holds both answers of each check.
    kept = {(p, s) for p, s in pairs if tracecontext.parse(p, s) is not None}
    states = {s for p, s in kept if tracecontext.parse(p, s).tracestate is not None}  # type: ignore[union-attr]
    assert 0 < len({p for p, _ in kept}) < len(TRACEPARENTS)
    assert 0 < len(states) < len(TRACESTATES)
