"""`operation-reliability.v2` as data: six operation classes by ten dimensions.

This literal is the canonical policy (docs/decisions/operation-class-policy.md, Decision 1).
`load_policy` validates it for totality and the decision's rules; a new class or a changed
cell is a versioned edit of this file. Durations are seconds. The policy is a maximum
envelope: callers may ask for less, never for more.
"""

from __future__ import annotations

from typing import Any

OPERATION_RELIABILITY_V2: dict[str, Any] = {
    "version": "operation-reliability.v2",
    "classes": {
        "interactive-turn": {
            "deadline": {"seconds": 120, "note": "bounds the whole assistant turn"},
            "attempt-timeout": {"seconds": 60, "on-timeout": "fail-attempt"},
            "retry": {
                "kind": "attempts",
                "max-attempts": 1,
                "retryable": [],
                "note": "a turn is not re-run automatically; its model and tool calls are "
                "classified read-only-dependency or confirmed-mutation and retry by their own cells",
            },
            "backoff-and-jitter": {"not-applicable": "single attempt: there is no retry to delay"},
            "circuit-breaking": {
                "kind": "circuit-breaker",
                "failure-threshold": 5,
                "reset-timeout-seconds": 30,
                "half-open-max-calls": 1,
            },
            "backpressure": {
                "mechanism": "reject-at-capacity",
                "max-queued": 0,
                "note": "the turn capacity gate rejects instead of queueing",
            },
            "concurrency": {"limit": 4, "scope": "local"},
            "idempotency-and-fencing": {
                "effects": "optional",
                "requires-idempotency-key": True,
                "requires-outcome-reference": True,
                "fencing": "not-applicable",
                "note": "the turn id is the idempotency key of its writes; a turn writing "
                "nothing is admitted with effecting=False",
            },
            "cancellation": {
                "before-dispatch": "stop",
                "after-dispatch": "continue-to-outcome-receipt",
                "disconnect-authority": True,
                "note": "after disconnect no later model, tool, confirmation or turn write is committed",
            },
            "resumability": {
                "not-applicable": "a disconnected turn is not resumed; writes it dispatched settle "
                "under their own confirmed-mutation receipts"
            },
        },
        "read-only-dependency": {
            "deadline": {"seconds": 10},
            "attempt-timeout": {"seconds": 2, "on-timeout": "fail-attempt"},
            "retry": {
                "kind": "attempts",
                "max-attempts": 3,
                "retryable": [
                    "attempt-timeout",
                    "transport-error",
                    "dependency-unavailable",
                    "rate-limited",
                ],
            },
            "backoff-and-jitter": {
                "initial-seconds": 0.1,
                "multiplier": 2,
                "max-seconds": 1,
                "jitter": "full",
            },
            "circuit-breaking": {
                "kind": "circuit-breaker",
                "failure-threshold": 5,
                "reset-timeout-seconds": 10,
                "half-open-max-calls": 1,
            },
            "backpressure": {"mechanism": "reject-at-capacity", "max-queued": 0},
            "concurrency": {"limit": 16, "scope": "local"},
            "idempotency-and-fencing": {
                "effects": "never",
                "requires-idempotency-key": False,
                "requires-outcome-reference": False,
                "fencing": "not-applicable",
                "note": "a read has no side effect to identify; effecting calls are refused",
            },
            "cancellation": {"before-dispatch": "stop", "after-dispatch": "discard-read"},
            "resumability": {
                "not-applicable": "a read holds no state to resume; a new read is a new operation"
            },
        },
        "confirmed-mutation": {
            "deadline": {"seconds": 30},
            "attempt-timeout": {
                "seconds": 10,
                "on-timeout": "return-pending-receipt",
                "note": "the dispatched effect runs on and settles the same receipt",
            },
            "retry": {
                "kind": "attempts",
                "max-attempts": 1,
                "retryable": [],
                "note": "single attempt: the confirmation owns a durable outcome receipt, so a "
                "same-identity replay returns the retained outcome instead of re-dispatching; "
                "a timeout is not permission to retry a write",
            },
            "backoff-and-jitter": {"not-applicable": "single attempt: there is no retry to delay"},
            "circuit-breaking": {
                "kind": "circuit-breaker",
                "failure-threshold": 3,
                "reset-timeout-seconds": 30,
                "half-open-max-calls": 1,
                "note": "isolates repeated adapter failure",
            },
            "backpressure": {
                "mechanism": "reject-at-capacity",
                "max-queued": 0,
                "note": "the permit gate rejects the ninth concurrent local mutation",
            },
            "concurrency": {"limit": 8, "scope": "local", "note": "the permit gate of 8"},
            "idempotency-and-fencing": {
                "effects": "always",
                "requires-idempotency-key": True,
                "requires-outcome-reference": True,
                "fencing": "exclusive-grant",
                "exclusive-grant": "the one-shot receipt claim",
                "durable-receipt": True,
            },
            "cancellation": {
                "before-dispatch": "stop",
                "after-dispatch": "continue-to-outcome-receipt",
            },
            "resumability": {
                "mechanism": "durable-receipt-replay",
                "identity": "idempotency key + outcome reference",
            },
        },
        "durable-leased-work": {
            "deadline": {
                "seconds": 900,
                "note": "the longest a lease may be held by heartbeats of the current fence",
            },
            "attempt-timeout": {
                "seconds": 30,
                "on-timeout": "lease-expires",
                "note": "the lease TTL; an expired lease grants no authority",
            },
            "retry": {
                "kind": "queue-reacquisition",
                "max-acquisitions": 5,
                "delay-seconds": 0,
                "advances-fence": True,
                "advances-acquisition-count": True,
                "on-exhausted": "quarantine",
                "note": "no automatic retry loop: each re-acquisition is a queue decision",
            },
            "backoff-and-jitter": {
                "kind": "requeue-delay",
                "max-seconds": 300,
                "jitter": "none",
                "note": "a holder may ask requeue or triage(requeue) for a delay up to this cap "
                "(default 0); re-acquisition stays a queue decision that raises the fence",
            },
            "circuit-breaking": {
                "kind": "isolation-boundary",
                "mechanisms": ["lease-expiry", "acquisition-budget", "quarantine"],
                "on-exhausted": "quarantine",
                "note": "remote calls made by leased work are classified read-only-dependency",
            },
            "backpressure": {
                "mechanism": "durable-backlog-cap",
                "max-queued": 10000,
                "reserve-for-active": True,
                "note": "a tenant-scoped admission lock refuses new ready work at the cap while "
                "reserving requeue capacity for active leases",
            },
            "concurrency": {
                "limit": 1,
                "scope": "local",
                "max-approved": 1000,
                "note": "a spend approval by an operator key raises a queue's limit, at most to "
                "max-approved, for at most a year",
            },
            "idempotency-and-fencing": {
                "effects": "always",
                "requires-idempotency-key": True,
                "requires-outcome-reference": True,
                "fencing": "monotonic-fence",
                "durable-receipt": True,
            },
            "cancellation": {
                "before-dispatch": "stop",
                "after-dispatch": "return-to-checkpoint",
                "note": "the item returns to ready under the same identity; the next acquire "
                "raises the fence",
            },
            "resumability": {
                "mechanism": "lease-expiry-and-ledger-replay",
                "identity": "item id + fence",
            },
        },
        "watcher-delivery": {
            "deadline": {"seconds": 86400, "note": "after this the delivery is dead-lettered"},
            "attempt-timeout": {"seconds": 10, "on-timeout": "fail-attempt"},
            "retry": {
                "kind": "attempts",
                "max-attempts": 5,
                "retryable": [
                    "attempt-timeout",
                    "transport-error",
                    "dependency-unavailable",
                    "rate-limited",
                ],
            },
            "backoff-and-jitter": {
                "initial-seconds": 30,
                "multiplier": 4,
                "max-seconds": 3600,
                "jitter": "none",
                "persisted-schedule": True,
                "note": "no jitter so the persisted retry instant is replay-stable",
            },
            "circuit-breaking": {
                "kind": "isolation-boundary",
                "mechanisms": ["durable-outbox", "capped-retry-budget", "dead-letter"],
                "budget": 5,
                "on-exhausted": "dead-letter",
            },
            "backpressure": {"mechanism": "outbox-cap", "max-queued": 1000},
            "concurrency": {"limit": 4, "scope": "local"},
            "idempotency-and-fencing": {
                "effects": "always",
                "requires-idempotency-key": True,
                "requires-outcome-reference": True,
                "fencing": "not-applicable",
                "durable-receipt": True,
                "note": "the stable delivery key lets the receiver deduplicate",
            },
            "cancellation": {
                "before-dispatch": "stop",
                "after-dispatch": "return-to-outbox",
                "note": "pause/resume/cancel act on undelivered outbox rows only",
            },
            "resumability": {"mechanism": "durable-outbox-replay", "identity": "delivery key"},
        },
        "artifact-verification": {
            "deadline": {"seconds": 1800},
            "attempt-timeout": {
                "seconds": 300,
                "on-timeout": "stop-at-checkpoint",
                "note": "a persistence boundary is observed before the timeout is honoured",
            },
            "retry": {"kind": "attempts", "max-attempts": 3, "retryable": ["transient-io"]},
            "backoff-and-jitter": {
                "initial-seconds": 1,
                "multiplier": 2,
                "max-seconds": 10,
                "jitter": "none",
            },
            "circuit-breaking": {
                "not-applicable": "local deterministic verification has no remote circuit"
            },
            "backpressure": {
                "mechanism": "reject-at-capacity",
                "max-queued": 0,
                "note": "at most one running run per tenant",
            },
            "concurrency": {"limit": 1, "scope": "local"},
            "idempotency-and-fencing": {
                "effects": "always",
                "requires-idempotency-key": True,
                "requires-outcome-reference": True,
                "fencing": "exclusive-grant",
                "exclusive-grant": "the immutable artifact-version + verifier-version run key",
                "durable-receipt": True,
            },
            "cancellation": {"before-dispatch": "stop", "after-dispatch": "return-to-checkpoint"},
            "resumability": {
                "mechanism": "per-item-checkpoints",
                "identity": "artifact version + verifier version",
            },
        },
    },
}
