"""Reliability harness for queue-server: a fault-injecting TCP proxy, a history
recorder and invariant checkers that run over a recorded history plus a final
database snapshot.

The harness treats the server as a black box: it talks to it over HTTP (through
the proxy) and reads the database only for the final snapshot. It imports
nothing from ``queue_server``.
"""

from reliability.checkers import (
    CheckReport,
    DatabaseSnapshot,
    ItemSnapshot,
    LedgerEvent,
    TotalQueueView,
    Violation,
    check_backlog_cap,
    check_completions,
    check_conservation,
    check_fences,
    check_idempotent_replays,
    check_total_queue,
    render_summary_row,
    render_summary_table,
    run_all_checks,
    total_queue_view,
)
from reliability.history import (
    BacklogSample,
    FaultEvent,
    History,
    HistoryRecorder,
    Operation,
    OpKind,
    PendingOperation,
    QuiescentPoint,
    hash_body,
    hash_json,
)
from reliability.model import ManualClock, QueueModel
from reliability.proxy import ProxyMode, ProxyStats, TcpProxy

__all__ = [
    "BacklogSample",
    "CheckReport",
    "DatabaseSnapshot",
    "FaultEvent",
    "History",
    "HistoryRecorder",
    "ItemSnapshot",
    "LedgerEvent",
    "ManualClock",
    "OpKind",
    "Operation",
    "PendingOperation",
    "ProxyMode",
    "ProxyStats",
    "QueueModel",
    "QuiescentPoint",
    "TcpProxy",
    "TotalQueueView",
    "Violation",
    "check_backlog_cap",
    "check_completions",
    "check_conservation",
    "check_fences",
    "check_idempotent_replays",
    "check_total_queue",
    "hash_body",
    "hash_json",
    "render_summary_row",
    "render_summary_table",
    "run_all_checks",
    "total_queue_view",
]
