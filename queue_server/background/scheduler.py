"""The scheduler loop: every API process runs one, and any number of them may run at once.

It sleeps until the next schedule is due (by the database clock), at most
`schedule_poll_interval`, then fires every due schedule (`Schedules.fire_due`). Loops of
other processes race for the same schedules; the row lock of each pass decides, and the
losers find the cursor already moved (see `queue_server.services.schedules`).
"""

from __future__ import annotations

import asyncio
import logging

from queue_server.services.schedules import Schedules

log = logging.getLogger(__name__)

# Never spin: a schedule held by another loop's pass stays due until that pass commits.
MIN_SLEEP = 0.05


async def run_schedules_forever(schedules: Schedules, *, poll_interval: float) -> None:
    """Fire due schedules until cancelled; a failure is logged and the loop goes on."""
    while True:
        try:
            wait = await schedules.fire_due()
        except Exception as exc:  # the database may be down: try again later
            log.warning("scheduler pass failed: %s", exc)
            wait = poll_interval
        if wait is None:
            wait = poll_interval
        await asyncio.sleep(min(poll_interval, max(MIN_SLEEP, wait)))
