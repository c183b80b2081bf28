"""The transport broker: the only owner of outbound HTTP to the outside world."""

from queue_server.transport.accounting import Accountant, Budget
from queue_server.transport.broker import DispatchRequest, DispatchResult, TransportBroker
from queue_server.transport.errors import (
    BudgetExhaustedError,
    PolicyRefusedError,
    RequestTimeoutError,
    RunFailedError,
    TransportError,
    TransportFailureError,
    WallDeadlineExceededError,
)
from queue_server.transport.receipts import BrokerSnapshot, DispatchReceipt, Outcome, Usage
from queue_server.transport.ssrf import (
    AllowList,
    CheckedTarget,
    check_target,
    check_target_async,
    refusal_reason,
)
from queue_server.transport.webhooks import webhook_request

__all__ = [
    "Accountant",
    "AllowList",
    "BrokerSnapshot",
    "Budget",
    "BudgetExhaustedError",
    "CheckedTarget",
    "DispatchReceipt",
    "DispatchRequest",
    "DispatchResult",
    "Outcome",
    "PolicyRefusedError",
    "RequestTimeoutError",
    "RunFailedError",
    "TransportBroker",
    "TransportError",
    "TransportFailureError",
    "Usage",
    "WallDeadlineExceededError",
    "check_target",
    "check_target_async",
    "refusal_reason",
    "webhook_request",
]
