"""`operation-reliability.v2`: the reliability policy as data, its enforcement, and its verifier.

Pure Python: no database and no HTTP. Every process loads one policy at start
with `runtime_policy()` (built-in v2, or --policy FILE / QUEUE_SERVER_POLICY) and
reads each value where it is enforced through the typed views:
`policy.leased_work.attempt_cap`, `policy.delivery.outbox_cap`, ... (`values.py`).
`at_most` bounds a setting by its cell. The server serves the loaded document at
GET /v1/policy and calls `admit_operation` before dispatch; the clients build
their retries, circuits and gates from the cells through this package.
"""

from queue_server.policy.admission import Admission, admit_operation, run_key
from queue_server.policy.bindings import (
    BINDINGS,
    DECLARED,
    NEGATIVE_CONTROLS,
    Binding,
    NegativeControl,
)
from queue_server.policy.breaker import CallTicket, CircuitBreaker, CircuitState
from queue_server.policy.cancellation import DisconnectAuthority, DisconnectOutcome
from queue_server.policy.errors import (
    AdmissionRefused,
    CircuitOpenError,
    OperationStoppedError,
    PermitUnavailableError,
    PolicyError,
    ReceiptConflictError,
)
from queue_server.policy.loader import default_policy, load_policy, policy_document
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
    CancelAfterDispatchMutationPath,
    ConfirmedMutationPath,
    InMemoryReceiptStore,
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
from queue_server.policy.verifier import (
    CancellationVerdict,
    ContractFailure,
    ContractReport,
    verify_cancellation_rule,
    verify_contract,
)

__all__ = [
    "BINDINGS",
    "DECLARED",
    "MAX_ATTEMPTS",
    "NEGATIVE_CONTROLS",
    "POLICY_ENV",
    "POLICY_NAME",
    "Admission",
    "AdmissionRefused",
    "Binding",
    "CallTicket",
    "CancelAfterDispatchMutationPath",
    "CancellationVerdict",
    "CircuitBreaker",
    "CircuitOpenError",
    "CircuitState",
    "ClassPolicy",
    "ClassifiedError",
    "ConfirmedMutationPath",
    "ContractFailure",
    "ContractReport",
    "Delivery",
    "Dependency",
    "Dimension",
    "DisconnectAuthority",
    "DisconnectOutcome",
    "FailureClass",
    "InMemoryReceiptStore",
    "LeasedWork",
    "Mutation",
    "MutationReport",
    "MutationStatus",
    "NegativeControl",
    "NotApplicable",
    "OperationClass",
    "OperationStoppedError",
    "PermitGate",
    "PermitUnavailableError",
    "PolicyError",
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
    "policy_document",
    "retrying_for",
    "run_key",
    "runtime_policy",
    "verify_cancellation_rule",
    "verify_contract",
    "wait_for",
]
