"""The policy a process runs under: loaded once at start, from a file or built in.

Every process (`queue-server serve`, `deliver`, `work`, the SDK) calls
`runtime_policy()` once: `--policy FILE` wins, else QUEUE_SERVER_POLICY, else the
built-in `operation-reliability.v2`. The file is the JSON that `queue-server
policy new --version NAME` prints: a document that names its own version; it must
be total, obey the rules of docs/decisions/operation-class-policy.md and stay
inside the absolute bounds of durable-leased-work, or `PolicyError` names each
offending cell and the process stops (a changed document under the built-in's
version is refused: a change is a version). Then each enforcement point reads its value through the typed views
(`policy.leased_work.attempt_cap`, `policy.delivery.outbox_cap`, ...).

A setting or option may lower a value, never raise it: `at_most` returns the
value to use (the policy's when the setting is unset) and raises `PolicyError`
naming the setting and the cell when it is above the ceiling.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from queue_server.policy.errors import PolicyError, PolicyFileError
from queue_server.policy.loader import default_policy, load_policy
from queue_server.policy.values import ReliabilityPolicy

POLICY_ENV = "QUEUE_SERVER_POLICY"

N = TypeVar("N", int, float)


def load_policy_file(path: str | Path) -> ReliabilityPolicy:
    """The policy document in `path`, validated; `PolicyError` names what is wrong, and
    `PolicyFileError` (one line) a file that is not a document at all."""
    file = Path(path)
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise PolicyFileError(
            [("document", f"cannot read {file}: {exc.strerror or exc}")]
        ) from None
    return load_policy_text(data, source=str(file))


# JSON nested deeper than this is refused before it is parsed: a policy document is at most
# five levels deep (document, classes, class, cell, list), and the parser recurses per level.
MAX_DEPTH = 32


def load_policy_text(data: bytes, *, source: str) -> ReliabilityPolicy:
    """A policy document from the bytes of a file (UTF-8 JSON), validated; `PolicyFileError`
    when the bytes are not UTF-8, not JSON or nested deeper than any policy is."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PolicyFileError(
            [("document", f"{source} is not UTF-8 text (byte {exc.start}): a policy is UTF-8 JSON")]
        ) from None
    if _depth(text) > MAX_DEPTH:
        raise PolicyFileError(
            [("document", f"{source} nests deeper than {MAX_DEPTH} levels, deeper than any policy")]
        )
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise PolicyFileError([("document", f"{source} is not JSON: {exc}")]) from None
    return load_policy(raw, source=source)


_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _depth(text: str) -> int:
    """The deepest nesting of JSON arrays and objects in `text`, brackets in strings aside."""
    depth = deepest = 0
    for match in _TOKENS.finditer(text):
        token = match.group()
        if token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def runtime_policy(
    path: str | Path | None = None, *, environ: Mapping[str, str] | None = None
) -> ReliabilityPolicy:
    """The policy for this process: `path`, else $QUEUE_SERVER_POLICY, else the built-in v2."""
    env = os.environ if environ is None else environ
    chosen = path or env.get(POLICY_ENV) or None
    if chosen is None:
        return default_policy()
    return load_policy_file(chosen)


def at_most(value: N | None, ceiling: N, *, setting: str, cell: str) -> N:
    """`value` if it is within `ceiling`, the ceiling when `value` is None; above it, PolicyError.

    `setting` names what asked (a setting, an option, a request field) and `cell`
    the policy cell (`class/dimension`) it is bounded by.
    """
    if value is None:
        return ceiling
    if value > ceiling:
        raise PolicyError(
            [
                (
                    cell,
                    f"{setting}={value:g} exceeds the policy's {ceiling:g}:"
                    " a setting may lower a policy value, never raise it",
                )
            ]
        )
    return value
