"""Problem responses as typed exceptions. Each carries the problem's `code`, `title` and `detail`.

Every problem code the server answers with has its class here (`BY_CODE`; a test
fails when the server gains a code this map lacks), under the class of its HTTP
status family, so `except errors.ConflictError` also catches every 409 the SDK
knows by name. An answer with a code this version does not know is still typed
by its status (`BY_STATUS`), else a plain `ProblemError`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from queue_server.client.connection import Response


class QueueClientError(Exception):
    """The queue server could not be asked, or said no."""

    code: str = "client-error"
    title: str = "Request failed"
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.title}: {self.detail}" if self.detail else self.title


class NoTenantError(QueueClientError, ValueError):
    """The call needs a tenant: this is an admin key, so pass `tenant=` (or QUEUE_SERVER_TENANT)."""

    code = "no-tenant"
    title = "No tenant"

    def __init__(self) -> None:
        self.detail = "this is an admin key: pass tenant= or set QUEUE_SERVER_TENANT"
        super().__init__(self.detail)


class ConnectionFailedError(QueueClientError):
    """The server could not be reached (after retrying)."""

    code = "connection-failed"
    title = "Cannot reach the queue server"

    def __init__(self, url: str, cause: BaseException) -> None:
        self.url = url
        self.detail = f"{url}: {cause or type(cause).__name__}"
        super().__init__(self.detail)


class ProblemError(QueueClientError):
    """An RFC 9457 problem answer from the server."""

    status_default: ClassVar[int] = 0
    # Raised by `enqueue_in` from a refusal of queue_server.enqueue: its SQLSTATE.
    sqlstate: str | None = None

    def __init__(self, status: int, body: dict[str, Any], *, retry_after: float | None = None):
        self.status = status
        self.body = body
        self.code = str(body.get("code") or f"http-{status}")
        self.title = str(body.get("title") or f"HTTP {status}")
        self.detail = str(body.get("detail") or "")
        self.retry_after = retry_after
        super().__init__(str(self))


class InternalServerError(ProblemError):
    """The server failed on the request (500); the details are in its log only."""


class BadRequestError(ProblemError):
    pass


class UnauthorizedError(ProblemError):
    pass


class ForbiddenError(ProblemError):
    pass


class NotFoundError(ProblemError):
    pass


class ConflictError(ProblemError):
    pass


class PayloadTooLargeError(ProblemError):
    pass


class HeadersTooLargeError(ProblemError):
    """The request's headers are larger than the server accepts (431)."""


class InvalidRequestError(ProblemError):
    pass


class TooManyRequestsError(ProblemError):
    pass


class ClientDisconnectedError(ProblemError):
    """The server saw the client leave before it answered (499: its access log's word)."""


class ServiceUnavailableError(ProblemError):
    pass


# -- 400 --------------------------------------------------------------------------


class IdempotencyKeyRequiredError(BadRequestError):
    pass


class MalformedRequestError(BadRequestError):
    """The request could not be parsed (a URL too long, broken framing, a form not UTF-8)."""


# -- 403 --------------------------------------------------------------------------


class ForbiddenRoleError(ForbiddenError):
    """The key's role may not do this."""


class CsrfRefusedError(ForbiddenError):
    """The console refused a form without this session's CSRF token."""


# -- 404 --------------------------------------------------------------------------


class TenantNotFoundError(NotFoundError):
    pass


class ItemNotFoundError(NotFoundError):
    pass


class DeadLetterNotFoundError(NotFoundError):
    pass


class KeyNotFoundError(NotFoundError):
    pass


class WatcherNotFoundError(NotFoundError):
    pass


class DeliveryNotFoundError(NotFoundError):
    pass


class ReceiptNotFoundError(NotFoundError):
    pass


class VerificationRunNotFoundError(NotFoundError):
    pass


class ScheduleNotFoundError(NotFoundError):
    pass


class SpendApprovalNotFoundError(NotFoundError):
    pass


# -- 409 --------------------------------------------------------------------------


class LeaseLostError(ConflictError):
    """The lease no longer grants authority: whatever the holder did must not be submitted."""


class StaleFenceError(LeaseLostError):
    pass


class FenceAheadError(LeaseLostError):
    """The fence given is higher than the item's: no lease with it was ever handed out."""


class NotLeaseHolderError(LeaseLostError):
    pass


class LeaseExpiredError(LeaseLostError):
    pass


class ItemNotLeasedError(LeaseLostError):
    pass


class LeaseDeadlineExceededError(LeaseLostError):
    pass


class ItemCancelledError(LeaseLostError):
    pass


class IdempotencyKeyInFlightError(ConflictError):
    pass


class DeadLetterClosedError(ConflictError):
    pass


class InvalidStateError(ConflictError):
    pass


class AmbiguousIdError(ConflictError):
    """An id prefix names more than one item."""


class LastAdminKeyError(ConflictError):
    """The last active admin key cannot be revoked."""


class VerificationRunBusyError(ConflictError):
    pass


class RunKeyConflictError(ConflictError):
    pass


class CheckpointConflictError(ConflictError):
    pass


class VerificationRunEndedError(ConflictError):
    pass


class VerificationIncompleteError(ConflictError):
    pass


class ReceiptNotStaleError(ConflictError):
    pass


class ReceiptConflictError(ConflictError):
    pass


class PolicyVersionConflictError(ConflictError):
    pass


class PolicyPinnedError(ConflictError):
    pass


# -- 422 --------------------------------------------------------------------------


class IdempotencyKeyReuseError(InvalidRequestError):
    pass


class TargetRefusedError(InvalidRequestError):
    pass


class ItemNotDeclaredError(InvalidRequestError):
    pass


class AdmissionRefusedError(InvalidRequestError):
    """The server refused the operation before dispatch: it lacks what its class requires."""


# -- 429 and 503 ------------------------------------------------------------------


class BacklogCapReachedError(TooManyRequestsError):
    pass


class TimeoutExceededError(ServiceUnavailableError):
    """A statement or lock wait of the server timed out."""


BY_CODE: dict[str, type[ProblemError]] = {
    "internal-error": InternalServerError,
    "invalid-request": InvalidRequestError,
    "payload-too-large": PayloadTooLargeError,
    "headers-too-large": HeadersTooLargeError,
    "unauthorized": UnauthorizedError,
    "client-disconnected": ClientDisconnectedError,
    "service-unavailable": ServiceUnavailableError,
    "not-found": NotFoundError,
    "conflict": ConflictError,
    "idempotency-key-required": IdempotencyKeyRequiredError,
    "malformed-request": MalformedRequestError,
    "forbidden-role": ForbiddenRoleError,
    "csrf-refused": CsrfRefusedError,
    "tenant-not-found": TenantNotFoundError,
    "item-not-found": ItemNotFoundError,
    "dead-letter-not-found": DeadLetterNotFoundError,
    "key-not-found": KeyNotFoundError,
    "watcher-not-found": WatcherNotFoundError,
    "delivery-not-found": DeliveryNotFoundError,
    "receipt-not-found": ReceiptNotFoundError,
    "verification-run-not-found": VerificationRunNotFoundError,
    "schedule-not-found": ScheduleNotFoundError,
    "spend-approval-not-found": SpendApprovalNotFoundError,
    "stale-fence": StaleFenceError,
    "fence-ahead": FenceAheadError,
    "not-lease-holder": NotLeaseHolderError,
    "lease-expired": LeaseExpiredError,
    "item-not-leased": ItemNotLeasedError,
    "lease-deadline-exceeded": LeaseDeadlineExceededError,
    "item-cancelled": ItemCancelledError,
    "idempotency-key-in-flight": IdempotencyKeyInFlightError,
    "dead-letter-closed": DeadLetterClosedError,
    "invalid-state": InvalidStateError,
    "ambiguous-id": AmbiguousIdError,
    "last-admin-key": LastAdminKeyError,
    "verification-run-busy": VerificationRunBusyError,
    "run-key-conflict": RunKeyConflictError,
    "checkpoint-conflict": CheckpointConflictError,
    "verification-run-ended": VerificationRunEndedError,
    "verification-incomplete": VerificationIncompleteError,
    "receipt-not-stale": ReceiptNotStaleError,
    "receipt-conflict": ReceiptConflictError,
    "policy-version-conflict": PolicyVersionConflictError,
    "policy-pinned": PolicyPinnedError,
    "idempotency-key-reuse": IdempotencyKeyReuseError,
    "target-refused": TargetRefusedError,
    "item-not-declared": ItemNotDeclaredError,
    "admission-refused": AdmissionRefusedError,
    "backlog-cap-reached": BacklogCapReachedError,
    "timeout": TimeoutExceededError,
}

BY_STATUS: dict[int, type[ProblemError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
    429: TooManyRequestsError,
    431: HeadersTooLargeError,
    499: ClientDisconnectedError,
    500: InternalServerError,
    503: ServiceUnavailableError,
}


def _retry_after(response: Response) -> float | None:
    value = response.headers.get("retry-after")  # httpx's headers: any case
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def problem_error(
    status: int, body: dict[str, Any], *, retry_after: float | None = None
) -> ProblemError:
    """The typed exception for a problem document with its status."""
    code = body.get("code")
    cls = BY_CODE.get(code) if isinstance(code, str) else None
    if cls is None:
        cls = BY_STATUS.get(status, ProblemError)
    return cls(status, body, retry_after=retry_after)


def from_response(response: Response) -> ProblemError:
    """The typed exception for an error answer (problem+json or not)."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {
            "title": response.reason_phrase or f"HTTP {response.status_code}",
            "detail": response.text[:500],
        }
    return problem_error(response.status_code, body, retry_after=_retry_after(response))


# -- enqueue inside an application's transaction (queue_server.client.transactional) -------
#
# `queue_server.enqueue` refuses with a SQLSTATE of its own; `enqueue_in` raises the class
# the REST route's problem has (so `except BacklogCapReachedError` covers both ways in),
# or one of these, each keeping the driver's error as its cause and its SQLSTATE.


class EnqueueNotGrantedError(ForbiddenError):
    """The database role may not enqueue for this tenant (SQLSTATE 42501): an operator
    grants it with `queue-server db grant-enqueue ROLE --tenant TENANT`."""


class PolicyEnvelopeError(InvalidRequestError):
    """A value above the loaded policy's envelope (SQLSTATE QS422); `detail` names the cell."""


# SQLSTATE -> (class, HTTP status of the same refusal over REST, problem code).
BY_SQLSTATE: dict[str, tuple[type[ProblemError], int, str]] = {
    "QS429": (BacklogCapReachedError, 429, "backlog-cap-reached"),
    "QS409": (IdempotencyKeyReuseError, 422, "idempotency-key-reuse"),
    "QS422": (PolicyEnvelopeError, 422, "invalid-request"),
    "QS400": (InvalidRequestError, 422, "invalid-request"),
    "QS404": (TenantNotFoundError, 404, "tenant-not-found"),
    "42501": (EnqueueNotGrantedError, 403, "forbidden"),
}


def from_sqlstate(sqlstate: str | None, message: str, detail: str | None) -> ProblemError | None:
    """The typed error of a refusal of `queue_server.enqueue`, or None for another error."""
    found = BY_SQLSTATE.get(sqlstate or "")
    if found is None:
        return None
    cls, status, code = found
    error = cls(status, {"code": code, "title": message, "detail": detail or message})
    error.sqlstate = sqlstate
    return error
