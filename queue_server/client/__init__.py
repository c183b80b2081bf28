"""The queue server's Python SDK: a typed httpx client and a worker helper."""

from queue_server.client import errors
from queue_server.client.client import DEFAULT_URL, QueueClient, is_transient, new_idempotency_key
from queue_server.client.errors import ProblemError, QueueClientError
from queue_server.client.models import NewItem
from queue_server.client.worker import (
    Job,
    Outcome,
    Quarantine,
    Requeue,
    Result,
    TransientError,
    Worker,
)

__all__ = [
    "DEFAULT_URL",
    "Job",
    "NewItem",
    "Outcome",
    "ProblemError",
    "Quarantine",
    "QueueClient",
    "QueueClientError",
    "Requeue",
    "Result",
    "TransientError",
    "Worker",
    "errors",
    "is_transient",
    "new_idempotency_key",
]
