"""The policy history: every version the server has started under, with its digest."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from queue_server import auth, views
from queue_server.db import Database
from queue_server.idempotency import Answer
from queue_server.policy import ReliabilityPolicy
from queue_server.store import policy_versions

log = logging.getLogger("queue_server")


class PolicyHistory:
    """Record the loaded version at each start; list every version (admin)."""

    def __init__(
        self,
        db: Database,
        policy: ReliabilityPolicy,
        *,
        receipt_retention: timedelta = timedelta(hours=24),
    ) -> None:
        self.db = db
        self.policy = policy
        self.receipt_retention = receipt_retention

    async def record_load(self) -> None:
        """One more start under the loaded policy: its first start is kept, its last is now;
        its ceilings become those of `queue_server.enqueue` (an application's transaction)."""
        policy = self.policy
        async with self.db.tx() as conn:
            await policy_versions.record_load(
                conn,
                version=policy.version,
                sha256=policy.sha256,
                source=policy.source,
                document=policy.as_document(),
            )
            await policy_versions.record_enqueue_envelope(
                conn,
                version=policy.version,
                attempt_cap=policy.leased_work.attempt_cap,
                backlog_cap=policy.leased_work.backlog_cap,
                retention=self.receipt_retention,
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
