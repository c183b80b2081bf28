"""The policy versions: every version the server has run under, with its digest; the versions
an admin publishes (who, why), the last of which a server without --policy runs under."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.idempotency import Answer
from queue_server.policy import OperationClass, PolicyError, ReliabilityPolicy, load_policy
from queue_server.store import policy_versions

log = logging.getLogger("queue_server")

# Where a published version is loaded from (`ReliabilityPolicy.source`).
PUBLISHED = "published"

Adopt = Callable[[ReliabilityPolicy], Awaitable[None]]


def published_policy(document: Mapping[str, Any]) -> ReliabilityPolicy:
    """A published document, validated as `policy verify` validates a file."""
    return load_policy(document, source=PUBLISHED)


class PolicyHistory:
    """Record each version a process loads; publish a version (admin) and have this process
    run it; list every version (admin)."""

    def __init__(
        self,
        db: Database,
        policy: ReliabilityPolicy,
        *,
        receipt_retention: timedelta = timedelta(hours=24),
        pinned: bool = False,
        adopt: Adopt | None = None,
    ) -> None:
        self.db = db
        self.policy = policy
        self.receipt_retention = receipt_retention
        # Under a policy file (--policy, QUEUE_SERVER_POLICY) the file wins over published
        # versions; else this process runs the published version activated last.
        self.pinned = pinned
        self.adopt = adopt

    async def record_load(self) -> None:
        """One more load of the loaded policy: its first load is kept, its last is now; its
        ceilings become those of `queue_server.enqueue` (an application's transaction). A
        version kept with other content is refused: a version names one document."""
        policy = self.policy
        async with self.db.tx() as conn:
            row = await policy_versions.record_load(
                conn,
                version=policy.version,
                sha256=policy.sha256,
                source=policy.source,
                document=policy.as_document(),
            )
            if row is None:
                kept = await policy_versions.kept_sha256(conn, policy.version)
                raise _conflict(policy, kept)
            await policy_versions.record_enqueue_envelope(
                conn,
                version=policy.version,
                attempt_cap=policy.leased_work.attempt_cap,
                backlog_cap=policy.leased_work.backlog_cap,
                retention=self.receipt_retention,
            )

    async def record_load_until_done(self, retry_every: float = 5.0) -> None:
        """`record_load`, again every `retry_every` seconds while the database refuses: the
        server starts without its database, and its start is recorded once it is back. A
        version kept with other content is not retried: the server does not start under it."""
        while True:
            try:
                await self.record_load()
            except errors.PolicyVersionConflictError:
                log.error("policy %s refused", self.policy.describe())
                raise
            except Exception as exc:  # a start is never stopped by its own record
                log.warning("could not record policy %s: %s", self.policy.describe(), exc)
                await asyncio.sleep(retry_every)
            else:
                return

    async def active(self) -> ReliabilityPolicy | None:
        """The published version activated last, when this process should run it instead of
        the one it runs (never under a policy file)."""
        if self.pinned:
            return None
        async with self.db.conn() as conn:
            row = await policy_versions.active(conn)
        if row is None or (row["version"], row["sha256"]) == self._current():
            return None
        return published_policy(row["document"])

    async def publish(
        self, principal: auth.Principal, version: str, document: Mapping[str, Any], reason: str
    ) -> Answer:
        """Publish a version (admin) and run it: checked as `policy verify` checks a file,
        kept with its sha256, who published it and why, and activated; this process runs it
        at once, every other one without --policy when the policy channel tells it (within its
        poll interval if that notification is lost). The same document
        again activates it again; other content under a kept version is refused (409)."""
        principal.require_admin()
        if not reason.strip():
            raise errors.InvalidRequestError("A published version says why: give a reason.")
        if self.pinned or self.adopt is None:
            raise errors.PolicyPinnedError(source=self.policy.source)
        try:
            policy = published_policy(document)
        except PolicyError as error:
            raise errors.InvalidRequestError(
                f"The policy document is refused: {error}",
                errors=[
                    {"loc": ["body", "document"], "msg": problem, "cell": cell}
                    for cell, problem in error.problems
                ],
            ) from None
        if policy.version != version:
            raise errors.InvalidRequestError(
                f"The document names itself {policy.version!r}, published as {version!r}."
            )
        _only_leased_work(policy, self.policy)
        async with self.db.tx() as conn:
            row = await policy_versions.publish(
                conn,
                version=policy.version,
                sha256=policy.sha256,
                document=policy.as_document(),
                actor=principal.actor,
                reason=reason.strip(),
            )
            if row is None:
                raise _conflict(policy, await policy_versions.kept_sha256(conn, policy.version))
        await self.adopt(policy)
        log.info(
            "policy %s published by %s (%s) and loaded", policy.describe(), principal.actor, reason
        )
        body = {**views.policy_version(row, current=(policy.version, policy.sha256))}
        return Answer.of(201 if row["created"] else 200, body)

    async def history(self, principal: auth.Principal) -> Answer:
        """Every version the server has run under or an admin has published, newest first
        (admin); the one this process loaded is `current`."""
        principal.require_admin()
        async with self.db.conn() as conn:
            rows = await policy_versions.list_versions(conn)
        return Answer.of(
            200,
            {"versions": [views.policy_version(row, current=self._current()) for row in rows]},
        )

    def _current(self) -> tuple[str, str]:
        return (self.policy.version, self.policy.sha256)


def _conflict(policy: ReliabilityPolicy, kept: str | None) -> errors.PolicyVersionConflictError:
    return errors.PolicyVersionConflictError(
        f"Version {policy.version} is kept with other content (sha256 {(kept or '?')[:12]}),"
        f" this document's is {policy.sha256[:12]}: a version names one document, so publish"
        " this one under a version of its own.",
        version=policy.version,
        kept_sha256=kept,
        sha256=policy.sha256,
    )


def _only_leased_work(new: ReliabilityPolicy, loaded: ReliabilityPolicy) -> None:
    """A running server takes durable-leased-work's cells from a published version; the
    other classes are enforced by processes that load their policy at start (deliver, work,
    the SDK), so a published version keeps them as loaded."""
    changed = [
        cls.value
        for cls in OperationClass
        if cls is not OperationClass.DURABLE_LEASED_WORK
        and new.for_class(cls).model_dump(mode="json")
        != loaded.for_class(cls).model_dump(mode="json")
    ]
    if changed:
        raise errors.InvalidRequestError(
            "A published version changes durable-leased-work's cells only; "
            + ", ".join(changed)
            + " differ from the loaded policy: those are loaded at each process's start"
            " (--policy FILE)."
        )
