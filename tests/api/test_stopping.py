"""A stopping server process ends its background loops: a cancellation is never lost.

A test's server once hung in its shutdown for good (the suite's run waited on it): one of
its loops lived on past the cancellation meant to stop it. The server waits with
`wait_event` and stops its loops with `stop_tasks` (queue_server/infra/tasks.py); these
tests hold both to what they promise, on a real event loop, and hold the server's code to
using them.
"""

from __future__ import annotations

import ast
import asyncio
import logging
import time
from pathlib import Path

import pytest

from queue_server.infra.tasks import stop_tasks, wait_event

PACKAGE = Path(__file__).resolve().parents[2] / "queue_server"


def test_a_wait_cancelled_in_the_turn_its_event_is_set_ends_cancelled() -> None:
    async def main() -> None:
        event = asyncio.Event()
        waiting = asyncio.create_task(wait_event(event, 30))
        await asyncio.sleep(0)  # the task waits on the event now
        # Told to stop in the very turn the event is set (a listener connecting, a policy
        # published): Python 3.11's wait_for would return True and the loop would go on.
        event.set()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())


def test_a_wait_says_whether_its_event_came_or_its_time_ran_out() -> None:
    async def main() -> tuple[bool, bool, float]:
        event = asyncio.Event()
        began = time.monotonic()
        timed_out = await wait_event(event, 0.05)
        waited = time.monotonic() - began
        asyncio.get_running_loop().call_later(0.01, event.set)
        return timed_out, await wait_event(event, 30), waited

    timed_out, came, waited = asyncio.run(main())
    assert (timed_out, came) == (False, True)
    assert 0.04 < waited < 1


def test_a_loop_that_lives_on_past_its_cancellation_is_stopped_all_the_same() -> None:
    lost: list[float] = []

    async def loop_losing_one_cancellation() -> None:
        while True:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                if lost:
                    raise
                # As when a cancellation reaches a loop as another error (a statement
                # cancelled under it fails its rollback) and the loop logs it and goes on.
                lost.append(time.monotonic())

    async def main() -> tuple[asyncio.Task[None], float]:
        task = asyncio.create_task(loop_losing_one_cancellation())
        await asyncio.sleep(0)
        began = time.monotonic()
        async with asyncio.timeout(10):  # a stop that waited forever fails here
            await stop_tasks([task])
        return task, time.monotonic() - began

    task, took = asyncio.run(main())
    assert task.cancelled()
    assert len(lost) == 1
    assert took < 2


def test_a_loop_that_failed_before_the_stop_is_logged_and_the_stop_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def failed() -> None:
        raise RuntimeError("the sweep's database went away")

    async def main() -> tuple[asyncio.Task[None], asyncio.Task[None]]:
        broken = asyncio.create_task(failed(), name="sweeper")
        running = asyncio.create_task(asyncio.sleep(30))
        await asyncio.sleep(0.01)
        await stop_tasks([broken, running, None])
        return broken, running

    with caplog.at_level(logging.ERROR, logger="queue_server.infra.tasks"):
        broken, running = asyncio.run(main())
    assert running.cancelled()
    assert broken.done()
    assert [r.getMessage() for r in caplog.records] == ["sweeper ended with an error"]


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(name)
    ]


def test_the_server_waits_and_stops_through_the_helpers_that_keep_a_cancellation() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "tasks.py" and path.parent.name == "infra":
            continue
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(PACKAGE.parent)
        found += [f"{where}:{c.lineno} asyncio.wait_for" for c in _calls(tree, "wait_for")]
        found += [
            f"{where}:{c.lineno} suppresses CancelledError"
            for c in _calls(tree, "suppress")
            if any(ast.unparse(arg).endswith("CancelledError") for arg in c.args)
        ]
    assert found == [], "wait with wait_event, stop with stop_tasks:\n" + "\n".join(found)
