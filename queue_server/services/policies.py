"""The policy history: every version the server has started under, with its digest."""

from __future__ import annotations

import asyncio
import logging

from queue_server import auth, views
from queue_server.db import Database
from queue_server.idempotency import Answer
from queue_server.policy import ReliabilityPolicy
from queue_server.store import policy_versions

log = logging.getLogger("queue_server")


class PolicyHistory:
    """Record the loaded version at each start; list every version (admin)."""

    def __init__(self, db: Database, policy: ReliabilityPolicy) -> None:
        self.db = db
        self.policy = policy

    async def record_load(self) -> None:
        """One more start under the loaded policy: its first start is kept, its last is now."""
        policy = self.policy
        async with self.db.tx() as conn:
            await policy_versions.record_load(
                conn,
                version=policy.version,
                sha256=policy.sha256,
                source=policy.source,
                document=policy.as_document(),
            )

    async def record_load_until_done(self, retry_every: float = 5.0) -> None:
        """`record_load`, again every `retry_every` seconds while the database refuses: the
        server starts without its database, and its start is recorded once it is back."""
        while True:
            try:
                await self.record_load()
            except Exception as exc:  # a start is never stopped by its own record
                log.warning("could not record policy %s: %s", self.policy.describe(), exc)
                await asyncio.sleep(retry_every)
            else:
                return

    async def history(self, principal: auth.Principal) -> Answer:
        """Every version the server has run under, newest last start first (admin); the one
        this process loaded is `current`."""
        principal.require_admin()
        async with self.db.conn() as conn:
            rows = await policy_versions.list_versions(conn)
        current = (self.policy.version, self.policy.sha256)
        return Answer.of(
            200,
            {"versions": [views.policy_version(row, current=current) for row in rows]},
        )
