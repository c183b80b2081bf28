"""Errors raised by the reliability policy: invalid policy data, refused admission, open circuits, full gates."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from queue_server.errors import QueueServerError

if TYPE_CHECKING:
    from queue_server.policy.model import RefusalReason


class PolicyError(ValueError):
    """The reliability policy data is invalid; each problem names its cell as `class/dimension`."""

    def __init__(self, problems: Sequence[tuple[str, str]]) -> None:
        self.problems: tuple[tuple[str, str], ...] = tuple(problems)
        super().__init__("; ".join(f"{cell}: {reason}" for cell, reason in self.problems))

    @property
    def cells(self) -> tuple[str, ...]:
        """The cells (`class/dimension`) named by the problems, in order."""
        return tuple(cell for cell, _ in self.problems)

    @classmethod
    def single(cls, cell: str, reason: str) -> PolicyError:
        return cls([(cell, reason)])


class PolicyFileError(PolicyError):
    """The policy file cannot be read as a document at all (missing, not UTF-8, not JSON,
    nested too deeply): a usage error, answered in one line."""


# Named after the refusal of admission (docs/decisions/operation-class-policy.md, Decision
# 6), as the API's problem is; it is an error nonetheless.
class AdmissionRefused(QueueServerError):  # noqa: N818
    """The operation was refused before dispatch: it lacks what its reliability class requires."""

    status = 422
    code = "admission-refused"
    title = "Admission refused"

    def __init__(self, reason: RefusalReason, operation_class: str, detail: str) -> None:
        self.reason = reason
        self.operation_class = operation_class
        super().__init__(
            f"{operation_class}: {reason.value}: {detail}",
            reason=reason.value,
            operation_class=operation_class,
        )


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


class ReceiptConflictError(QueueServerError):
    """The outcome reference is already claimed under a different idempotency key, or was settled differently."""

    status = 409
    code = "receipt-conflict"
    title = "Receipt conflict"
