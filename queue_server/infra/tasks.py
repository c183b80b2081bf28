"""Waiting with a bound, and stopping background tasks, without losing a cancellation.

A process stops its background loops by cancelling them and waiting for their ends. Two
ways a cancellation gets lost, so that the loop lives on and the stop waits forever:

- Python 3.11's `asyncio.wait_for` returns the awaited result when its task is cancelled
  in the very turn of the loop that the result arrives (CPython gh-86296, fixed in 3.12):
  a loop that waits on an event that way, told to stop just as the event is set (the
  notification listener connecting, a policy published), goes on. `wait_event` waits
  with `asyncio.timeout`, which tells its own timeout from a cancellation.
- A loop that logs and retries every `Exception` goes on when a cancellation reaches it
  as another error (a statement cancelled under it fails its transaction's rollback).
  `stop_tasks` cancels whatever is still running again until it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

# How often a task that lives on past its cancellation is cancelled again.
AGAIN = 0.1


async def wait_event(event: asyncio.Event, seconds: float) -> bool:
    """Wait until `event` is set (True) or `seconds` have passed (False). A cancellation of
    the caller is raised whenever it comes, the turn the event is set included."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def stop_tasks(tasks: Iterable[asyncio.Task[Any] | None], *, again: float = AGAIN) -> None:
    """Cancel `tasks` and wait until every one has ended; one still running `again` seconds
    after a cancellation is cancelled anew. An error a task ended with (other than its
    cancellation) is logged: the stop goes on."""
    running = {task for task in tasks if task is not None}
    ended = list(running)
    while running:
        for task in running:
            task.cancel()
        _, running = await asyncio.wait(running, timeout=again)
    for task in ended:
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("%s ended with an error", task.get_name(), exc_info=error)
