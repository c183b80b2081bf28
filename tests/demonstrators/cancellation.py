"""The cancellation rule (docs/decisions/operation-class-policy.md, Decision 6) as a
per-operation authority.

A disconnect before dispatch stops the work. Disconnect and dispatch race under
one lock, so exactly one wins: either nothing was dispatched, or the effect was
dispatched and continues to its outcome (receipt, checkpoint or outbox). After
a disconnect no later write of the operation is authorized, which is the
interactive turn's disconnect authority.
"""

from __future__ import annotations

import threading
from typing import Literal

from queue_server.policy.loader import default_policy
from queue_server.policy.model import OperationClass, as_operation_class
from queue_server.policy.values import ReliabilityPolicy
from tests.demonstrators.errors import OperationStoppedError

DisconnectOutcome = Literal[
    "stopped",
    "discard-read",
    "continue-to-outcome-receipt",
    "return-to-checkpoint",
    "return-to-outbox",
]


class DisconnectAuthority:
    """Tracks dispatch and disconnect for one operation; never reports a dispatched effect cancelled."""

    def __init__(
        self, operation_class: OperationClass | str, *, policy: ReliabilityPolicy | None = None
    ) -> None:
        self.operation_class = as_operation_class(operation_class)
        self._cell = (policy or default_policy()).for_class(self.operation_class).cancellation
        self._lock = threading.Lock()
        self._dispatched = False
        self._disconnected = False

    @property
    def dispatched(self) -> bool:
        with self._lock:
            return self._dispatched

    @property
    def disconnected(self) -> bool:
        with self._lock:
            return self._disconnected

    def disconnect(self) -> DisconnectOutcome:
        """Record the caller's disconnect; returns what happens to the operation now."""
        with self._lock:
            self._disconnected = True
            return self._outcome()

    def dispatch(self) -> None:
        """Mark the effect dispatched, or raise `OperationStoppedError` if the caller already left."""
        with self._lock:
            if self._disconnected:
                raise OperationStoppedError()
            self._dispatched = True

    def outcome(self) -> DisconnectOutcome:
        """What a disconnect means at this point: stop before dispatch, the class's rule after."""
        with self._lock:
            return self._outcome()

    def _outcome(self) -> DisconnectOutcome:
        if not self._dispatched:
            return "stopped"
        return self._cell.after_dispatch
