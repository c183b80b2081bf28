"""A long-poll acquire parked on its queue's notification, in a thread of its own: what the
wake-up tests measure from the enqueue (or the application's commit) to the lease."""

from __future__ import annotations

import threading
import time

from tests.helpers.api import Api


class ParkedAcquire:
    """Starts the acquire (`wait` seconds) and returns once it is parked; `join` waits for
    its answer and gives how many leases it got and when (time.monotonic())."""

    def __init__(self, api: Api, queue: str, *, wait: float = 10) -> None:
        self.leased_at: float | None = None
        self.count = 0

        def acquire() -> None:
            with api.client(api.keys["worker"]) as client:
                response = client.post(
                    f"/v1/tenants/acme/queues/{queue}/leases",
                    json={"worker": "w1", "lease_ttl": 30, "wait": wait},
                )
                self.count = len(response.json()["leases"])
                self.leased_at = time.monotonic()

        self._thread = threading.Thread(target=acquire)
        self._thread.start()
        time.sleep(0.5)  # the acquire is now parked on its notification

    @property
    def answered(self) -> bool:
        return self.leased_at is not None

    def join(self, timeout: float = 15) -> tuple[int, float]:
        self._thread.join(timeout=timeout)
        assert self.leased_at is not None, "the parked acquire never answered"
        return self.count, self.leased_at
