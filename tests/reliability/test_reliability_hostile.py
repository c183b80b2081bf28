"""Hostile input against the real server process (one round of every case)."""

from __future__ import annotations

import pytest

from reliability.fuzz import _judge
from reliability.history import JSONValue
from reliability.hostile import hostile_cases, hostile_input
from reliability.rawhttp import chunked, repeat_bytes


def test_chunk_coding_frames_every_piece_and_ends_with_an_empty_chunk() -> None:
    wire = b"".join(chunked([b"abc", b"", b"de"]))
    assert wire == b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    assert sum(len(p) for p in repeat_bytes(200_000, b"xy")) == 200_000


@pytest.mark.slow
def test_body_and_encoding_cases_get_a_fast_problem_and_write_nothing() -> None:
    # Left to the full suite, where they document open server findings (see
    # reliability/results/latest.md): headers of any size are accepted, and a URL
    # past 64 KB gets uvicorn's text/plain 400.
    findings = ("header", "cursor of 100 KB")
    cases = [case for case in hostile_cases() if not any(f in case.name for f in findings)]
    outcome = hostile_input(rounds=1, cases=cases)
    assert outcome.report.violations == (), [str(v) for v in outcome.report.violations]
    assert outcome.metrics["requests"] == len(cases)


def test_fuzz_judge_flags_5xx_non_problem_errors_and_undocumented_statuses() -> None:
    documented = {("GET", "/a"): {200, 404}}
    exchanges: list[dict[str, JSONValue]] = [
        {"method": "GET", "template": "/a", "status": 200, "content_type": "application/json"},
        {"method": "GET", "template": "/a", "status": 404, "content_type": "application/json"},
        {
            "method": "GET",
            "template": "/a",
            "status": 500,
            "content_type": "application/problem+json",
        },
        {
            "method": "GET",
            "template": "/a",
            "status": 500,
            "content_type": "application/problem+json",
        },
    ]
    violations, statuses = _judge(exchanges, documented)
    assert sorted(v.checker for v in violations) == ["documented-status", "no-5xx", "problem-json"]
    assert statuses == {"200": 1, "404": 1, "500": 2}
