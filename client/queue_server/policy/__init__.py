"""`operation-reliability.v2`: the reliability policy as data, and what enforces it.

Pure Python: no database and no HTTP. Every process loads one policy at start with
`runtime_policy()` (built-in v2, or --policy FILE / QUEUE_SERVER_POLICY) and reads each value
where it is enforced through the typed views: `policy.leased_work.attempt_cap`,
`policy.delivery.outbox_cap`, ... (`values.py`). `at_most` bounds a setting by its cell. The
server serves the loaded document at GET /v1/policy and calls `admit_operation` before
dispatch; the SDK (`queue_server.client`) builds its retries from the cells (`retry.py`).

The modules import in one direction, each only from those before it: `errors`, `v2`,
`model` (the cells), `values` (the loaded policy and its views), `loader`, `runtime`,
`admission`, `retry` (tests/policy/test_policy_imports.py). The proof that each cell is
enforced, and the thin clients of the other operation classes, are test code:
`tests/policy_proof/`, `tests/demonstrators/`.
"""

from queue_server.policy.admission import Admission, AdmissionRefused, admit_operation, run_key
from queue_server.policy.errors import PolicyError, PolicyFileError
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
    cell_name,
    describe_cell,
)
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
    LeasedWork,
    Mutation,
    ReliabilityPolicy,
    Verification,
)

__all__ = [
    "MAX_ATTEMPTS",
    "POLICY_ENV",
    "POLICY_NAME",
    "Admission",
    "AdmissionRefused",
    "ClassPolicy",
    "ClassifiedError",
    "Delivery",
    "Dimension",
    "FailureClass",
    "LeasedWork",
    "Mutation",
    "NotApplicable",
    "OperationClass",
    "PolicyError",
    "PolicyFileError",
    "RefusalReason",
    "ReliabilityPolicy",
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
