"""Domain errors. Each knows its HTTP status and its stable problem code; the docstring is the default detail."""

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


class MalformedBodyError(QueueServerError):
    """The request body is not valid JSON."""

    status = 400
    code = "malformed-body"
    title = "Malformed body"


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


class IdempotencyKeyInFlightError(QueueServerError):
    """A request with this Idempotency-Key is still being processed; retry shortly."""

    status = 409
    code = "idempotency-key-in-flight"
    title = "Idempotency-Key in flight"


class BacklogCapReachedError(QueueServerError):
    """The tenant's backlog is at its cap; complete or cancel work before enqueuing more."""

    status = 429
    code = "backlog-cap-reached"
    title = "Backlog cap reached"


class LeaseRefusedError(QueueServerError):
    """The lease operation was refused."""

    status = 409


class StaleFenceError(LeaseRefusedError):
    """The fence is older than the item's current fence: a newer lease superseded this one."""

    code = "stale-fence"
    title = "Stale fence"


class NotLeaseHolderError(LeaseRefusedError):
    """Another worker holds the lease on this item."""

    code = "not-lease-holder"
    title = "Not the lease holder"


class LeaseExpiredError(LeaseRefusedError):
    """The lease has expired and grants no authority, even if nobody has taken the item yet."""

    code = "lease-expired"
    title = "Lease expired"


class ItemNotLeasedError(LeaseRefusedError):
    """The item is not leased."""

    code = "item-not-leased"
    title = "Item not leased"


class InvalidStateError(QueueServerError):
    """The item is not in a state that allows this operation."""

    status = 409
    code = "invalid-state"
    title = "Invalid state"


class DeadLetterClosedError(QueueServerError):
    """This dead letter was already replayed or discarded."""

    status = 409
    code = "dead-letter-closed"
    title = "Dead letter closed"


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
