"""What the demonstrators raise: an open circuit, a full gate, an operation stopped before
dispatch. Each is a `QueueServerError` with the status and code the SDK knows it by."""

from __future__ import annotations

from queue_server.errors import QueueServerError


class CircuitOpenError(QueueServerError):
    """The circuit is open after repeated dependency failures; the call was not attempted."""

    status = 503
    code = "circuit-open"
    title = "Circuit open"


class PermitUnavailableError(QueueServerError):
    """Every permit of this gate is held; the call is rejected rather than queued."""

    status = 429
    code = "permit-unavailable"
    title = "Permit unavailable"


class OperationStoppedError(QueueServerError):
    """The caller disconnected before dispatch; the operation was stopped and nothing was dispatched."""

    status = 409
    code = "operation-stopped"
    title = "Operation stopped"
