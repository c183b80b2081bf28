"""schemathesis extension loaded by the ``schema fuzz`` scenario (``SCHEMATHESIS_HOOKS``).

One custom check: every error answer (4xx, 5xx) is ``application/problem+json``.
It also appends every exchange (method, route template, URL, status, content
type, request and answer bodies, cut short) to the JSONL file named by
``RELIABILITY_ST_LOG``, so the harness can judge each answer against the
documented statuses itself and report the exact input of each finding.
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import schemathesis

__all__ = ["problem_json_errors"]

_LOCK = threading.Lock()
_LOG = os.environ.get("RELIABILITY_ST_LOG")
CUT = 400


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value[:CUT].decode("utf-8", "replace")
    try:
        return json.dumps(value, default=str)[:CUT]
    except (TypeError, ValueError):
        return repr(value)[:CUT]


def _record(response: Any, case: Any, content_type: str) -> None:
    if not _LOG:
        return
    request = getattr(response, "request", None)
    line = json.dumps(
        {
            "method": str(case.method).upper(),
            "template": str(case.path),
            "url": str(getattr(request, "url", ""))[:CUT],
            "status": int(response.status_code),
            "content_type": content_type,
            "request_body": _text(getattr(request, "body", None)),
            "answer": _text(response.content),
        }
    )
    with _LOCK, open(_LOG, "a", encoding="utf-8") as out:
        out.write(line + "\n")


@schemathesis.check
def problem_json_errors(ctx: Any, response: Any, case: Any) -> bool | None:
    """Error answers are application/problem+json."""
    values = response.headers.get("content-type") or response.headers.get("Content-Type") or [""]
    content_type = values[0] if isinstance(values, list) else str(values)
    _record(response, case, content_type)
    if response.status_code >= 400 and not content_type.startswith("application/problem+json"):
        raise AssertionError(
            f"error answer {response.status_code} is {content_type!r}, not application/problem+json"
        )
    return None
