"""The queue server's Python SDK: typed httpx clients and worker helpers, sync and asyncio.

Every module of the SDK is reached from here: the clients (`client`, `async_client`, on the
one transport of `connection`), the workers (`worker`, `async_worker`, on `worker_core`,
`working`, `core`, `classes` and `tracing`), `schedules`, `watchers`, `transactional`,
`processes`, the typed `errors` and `models`, and `testing`, the in-memory server for a
user's own tests of a handler."""

from queue_server.client import errors, testing
from queue_server.client.async_client import AsyncQueueClient
from queue_server.client.async_worker import AsyncHandler, AsyncJob, AsyncWorker
from queue_server.client.client import DEFAULT_URL, QueueClient, is_transient, new_idempotency_key
from queue_server.client.errors import ProblemError, QueueClientError
from queue_server.client.models import BatchEntry, Completion, NewItem
from queue_server.client.processes import run_in_processes
from queue_server.client.schedules import ScheduleClient
from queue_server.client.transactional import enqueue_in, enqueue_many_in
from queue_server.client.watchers import WatcherClient
from queue_server.client.worker import (
    Job,
    Outcome,
    Quarantine,
    Requeue,
    Result,
    TransientError,
    Worker,
)
from queue_server.client.worker_core import WorkerOptions

__all__ = [
    "DEFAULT_URL",
    "AsyncHandler",
    "AsyncJob",
    "AsyncQueueClient",
    "AsyncWorker",
    "BatchEntry",
    "Completion",
    "Job",
    "NewItem",
    "Outcome",
    "ProblemError",
    "Quarantine",
    "QueueClient",
    "QueueClientError",
    "Requeue",
    "Result",
    "ScheduleClient",
    "TransientError",
    "WatcherClient",
    "Worker",
    "WorkerOptions",
    "enqueue_in",
    "enqueue_many_in",
    "errors",
    "is_transient",
    "new_idempotency_key",
    "run_in_processes",
    "testing",
]
