"""An item's ledger as a person reads it: each event a sentence (who, what, under which
fence), a tone that makes failures stand out, and the time since the event before."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

# The tone of each kind: the colour of its dot and its line.
TONES = {
    "enqueued": "info",
    "scheduled": "info",
    "acquired": "info",
    "heartbeat": "quiet",
    "completed": "good",
    "requeued": "warn",
    "released": "warn",
    "replayed": "info",
    "retried": "info",
    "triaged": "bad",
    "triage_rejected": "bad",
    "quarantined": "bad",
    "deadline_exceeded": "bad",
    "cancelled": "warn",
    "unblocked": "info",
    "held": "quiet",
}


@dataclass(frozen=True, slots=True)
class Line:
    """One event of the timeline."""

    event: dict[str, Any]
    sentence: str
    tone: str
    since_previous: float | None  # seconds after the event before it; None for the first


def _actor(event: dict[str, Any]) -> str:
    actor = event.get("actor")
    if actor in (None, "", "server"):
        return "The server"
    name = event.get("actor_name")
    return f"{name} ({actor})" if name else str(actor)


def _failure(data: dict[str, Any]) -> str:
    failure = data.get("failure") or {}
    kind = failure.get("class") or "a failure"
    message = failure.get("message")
    return f"{kind}: {message}" if message else str(kind)


def sentence(event: dict[str, Any]) -> str:
    """What happened, in a sentence: who did what, under which fence."""
    kind = event.get("kind", "")
    data: dict[str, Any] = event.get("data") or {}
    who = _actor(event)
    fence = event.get("fence")
    match kind:
        case "enqueued":
            queue = f" on {data['queue']}" if data.get("queue") else ""
            waits = ""
            if data.get("state") == "waiting" and data.get("depends_on"):
                n = len(data["depends_on"])
                waits = f", waiting for {n} {'item' if n == 1 else 'items'} to complete"
            elif data.get("state") == "waiting":
                waits = f", waiting behind the items before it with ordering key {data.get('ordering_key')}"
            return f"{who} enqueued it{queue}, priority {data.get('priority', 0)}{waits}."
        case "scheduled":
            return f"Schedule {data.get('schedule', '')} enqueued it.".replace("  ", " ")
        case "acquired":
            return f"{who} leased it, fence {fence}."
        case "heartbeat":
            return f"{who} extended its lease, fence {fence}."
        case "completed":
            return f"{who} completed it, fence {fence}."
        case "requeued":
            reason = f": {data['reason']}" if data.get("reason") else ""
            if data.get("failure"):
                return f"{who} gave it back after {_failure(data)}, fence {fence}."
            return f"{who} gave it back, fence {fence}{reason}."
        case "triaged":
            then = "quarantined it" if data.get("decision") == "quarantine" else "requeued it"
            return f"{who} reported {_failure(data)}, fence {fence}, and {then}."
        case "triage_rejected":
            presented = data.get("presented_fence", fence)
            reason = data.get("reason") or "refused"
            return f"{who} reported {_failure(data)} with fence {presented}: refused ({reason})."
        case "quarantined":
            return f"{who} quarantined it: {data.get('reason', 'no reason given')}."
        case "deadline_exceeded":
            holder = data.get("lease_holder") or "its holder"
            return f"The lease of {holder}, fence {fence}, ran past its deadline."
        case "released":
            return f"{who} released its lease, fence {fence}: {data.get('reason', '')}.".replace(
                ": .", "."
            )
        case "replayed":
            return f"{who} replayed it from its dead letter."
        case "retried":
            return f"{who} retried it: it was {data.get('from', 'finished')}, and is due now."
        case "cancelled":
            reason = f": {data['reason']}" if data.get("reason") else ""
            return f"{who} cancelled it{reason}."
        case "unblocked" if "dependency" in data:
            return (
                f"Ready: {data['dependency']}, the last item it waited for, is"
                f" {data.get('dependency_state')}."
            )
        case "unblocked":
            before = data.get("after", "the item before it")
            return (
                f"Ready: {before}, before it with its ordering key, is {data.get('after_state')}."
            )
        case "held":
            return (
                f"Waiting behind {data.get('behind', 'an item')} with its ordering key"
                f" {data.get('ordering_key', '')}."
            )
    return f"{who}: {kind}, fence {fence}."


def _at(event: dict[str, Any]) -> datetime | None:
    try:
        return datetime.fromisoformat(str(event.get("at")).replace("Z", "+00:00"))
    except ValueError:
        return None


def timeline(events: list[dict[str, Any]]) -> list[Line]:
    """The events in order, each with its sentence, tone and time since the one before."""
    lines: list[Line] = []
    previous: datetime | None = None
    for event in events:
        at = _at(event)
        since = (at - previous).total_seconds() if at and previous else None
        tone = TONES.get(str(event.get("kind")), "info")
        lines.append(Line(event=event, sentence=sentence(event), tone=tone, since_previous=since))
        previous = at or previous
    return lines


def gap(seconds: float | None) -> str:
    """`+0.4 s`, `+12 s`, `+3 min`, `+2 h 5 min`: the time since the event before."""
    if seconds is None:
        return ""
    if seconds < 10:
        return f"+{seconds:.1f} s"
    if seconds < 120:
        return f"+{seconds:.0f} s"
    if seconds < 7200:
        return f"+{seconds / 60:.0f} min"
    hours, minutes = divmod(int(seconds) // 60, 60)
    if hours < 48:
        return f"+{hours} h {minutes} min"
    return f"+{hours // 24} d {hours % 24} h"
