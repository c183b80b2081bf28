"""`operation-reliability.v2`: the reliability policy as data, and what enforces it.

Pure Python: no database and no HTTP. Every process loads one policy at start
with `runtime_policy()` (built-in v2, or --policy FILE / QUEUE_SERVER_POLICY) and
reads each value where it is enforced through the typed views:
`policy.leased_work.attempt_cap`, `policy.delivery.outbox_cap`, ... (`values.py`).
`at_most` bounds a setting by its cell. The server serves the loaded document at
GET /v1/policy and calls `admit_operation` before dispatch; the thin clients
(`queue_server.client`) build their retries, circuits and gates from the cells
through this package.

Each name below is imported from its module when it is first used, so a process
loads only what it uses: the server never loads the clients' breaker, permit gate
or mutation path. The proof that each cell is enforced (bindings, weakenings, the
negative control) is test code: `tests/policy_proof/`, run by `make contract`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from queue_server.policy.admission import Admission, admit_operation, run_key
    from queue_server.policy.breaker import CallTicket, CircuitBreaker, CircuitState
    from queue_server.policy.cancellation import DisconnectAuthority, DisconnectOutcome
    from queue_server.policy.errors import (
        AdmissionRefused,
        CircuitOpenError,
        OperationStoppedError,
        PermitUnavailableError,
        PolicyError,
        PolicyFileError,
        ReceiptConflictError,
    )
    from queue_server.policy.loader import default_policy, load_policy
    from queue_server.policy.model import (
        MAX_ATTEMPTS,
        POLICY_NAME,
        ClassPolicy,
        Dimension,
        FailureClass,
        NotApplicable,
        OperationClass,
        RefusalReason,
        ReliabilityPolicy,
        cell_name,
        describe_cell,
    )
    from queue_server.policy.mutation import (
        ConfirmedMutationPath,
        MutationReport,
        MutationStatus,
        Receipt,
        ReceiptStatus,
        ReceiptStore,
    )
    from queue_server.policy.permits import PermitGate
    from queue_server.policy.retry import (
        ClassifiedError,
        async_retrying_for,
        backoff_schedule,
        classify_failure,
        retrying_for,
        wait_for,
    )
    from queue_server.policy.runtime import POLICY_ENV, at_most, load_policy_file, runtime_policy
    from queue_server.policy.values import (
        Delivery,
        Dependency,
        LeasedWork,
        Mutation,
        Turn,
        Verification,
    )

# name -> the module of this package that defines it
_WHERE: dict[str, str] = {
    **dict.fromkeys(("Admission", "admit_operation", "run_key"), "admission"),
    **dict.fromkeys(("CallTicket", "CircuitBreaker", "CircuitState"), "breaker"),
    **dict.fromkeys(("DisconnectAuthority", "DisconnectOutcome"), "cancellation"),
    **dict.fromkeys(
        (
            "AdmissionRefused",
            "CircuitOpenError",
            "OperationStoppedError",
            "PermitUnavailableError",
            "PolicyError",
            "PolicyFileError",
            "ReceiptConflictError",
        ),
        "errors",
    ),
    **dict.fromkeys(("default_policy", "load_policy"), "loader"),
    **dict.fromkeys(
        (
            "MAX_ATTEMPTS",
            "POLICY_NAME",
            "ClassPolicy",
            "Dimension",
            "FailureClass",
            "NotApplicable",
            "OperationClass",
            "RefusalReason",
            "ReliabilityPolicy",
            "cell_name",
            "describe_cell",
        ),
        "model",
    ),
    **dict.fromkeys(
        (
            "ConfirmedMutationPath",
            "MutationReport",
            "MutationStatus",
            "Receipt",
            "ReceiptStatus",
            "ReceiptStore",
        ),
        "mutation",
    ),
    "PermitGate": "permits",
    **dict.fromkeys(
        (
            "ClassifiedError",
            "async_retrying_for",
            "backoff_schedule",
            "classify_failure",
            "retrying_for",
            "wait_for",
        ),
        "retry",
    ),
    **dict.fromkeys(("POLICY_ENV", "at_most", "load_policy_file", "runtime_policy"), "runtime"),
    **dict.fromkeys(
        ("Delivery", "Dependency", "LeasedWork", "Mutation", "Turn", "Verification"), "values"
    ),
}


def __getattr__(name: str) -> Any:
    """Import `name` from its module on first use (PEP 562) and keep it here."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "MAX_ATTEMPTS",
    "POLICY_ENV",
    "POLICY_NAME",
    "Admission",
    "AdmissionRefused",
    "CallTicket",
    "CircuitBreaker",
    "CircuitOpenError",
    "CircuitState",
    "ClassPolicy",
    "ClassifiedError",
    "ConfirmedMutationPath",
    "Delivery",
    "Dependency",
    "Dimension",
    "DisconnectAuthority",
    "DisconnectOutcome",
    "FailureClass",
    "LeasedWork",
    "Mutation",
    "MutationReport",
    "MutationStatus",
    "NotApplicable",
    "OperationClass",
    "OperationStoppedError",
    "PermitGate",
    "PermitUnavailableError",
    "PolicyError",
    "PolicyFileError",
    "Receipt",
    "ReceiptConflictError",
    "ReceiptStatus",
    "ReceiptStore",
    "RefusalReason",
    "ReliabilityPolicy",
    "Turn",
    "Verification",
    "admit_operation",
    "async_retrying_for",
    "at_most",
    "backoff_schedule",
    "cell_name",
    "classify_failure",
    "default_policy",
    "describe_cell",
    "load_policy",
    "load_policy_file",
    "retrying_for",
    "run_key",
    "runtime_policy",
    "wait_for",
]
