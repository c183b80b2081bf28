"""API keys: who is calling (with a per-process cache), creating and revoking keys, and the
admin keys: the first one, more of them, their revocation and rotation.

Every revocation notifies the keys channel in its transaction, so each API process
drops its cache of keys when it commits: a revoked key is refused at once everywhere.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from queue_server import auth, errors, views
from queue_server.db import Database
from queue_server.idempotency import Answer
from queue_server.infra.keycache import TRUST_WINDOW, KeyCache
from queue_server.models import Role
from queue_server.services.common import require_tenant
from queue_server.store import console_sessions, tenants


class Keys:
    """Authenticates every request; creates and revokes the keys it checks."""

    def __init__(self, db: Database, *, trust_window: float = TRUST_WINDOW) -> None:
        self.db = db
        self.cache = KeyCache(trust_window)

    def keys_changed(self, listening: bool) -> None:
        """A key was revoked somewhere, or the notification listener (dis)connected.

        The cache is only used while the listener is connected (and lately heard
        from, see `listener_alive`): without it a revocation in another process
        could go unseen.
        """
        self.cache.clear()
        self.cache.enabled = listening
        if listening:
            self.cache.alive()

    def listener_alive(self) -> None:
        """The listener delivered a notification or answered a probe just now."""
        self.cache.alive()

    async def authenticate(self, authorization: str | None) -> auth.Principal:
        key_id = auth.parse_bearer(authorization)
        row = self.cache.get(key_id)
        if row is None:
            generation = self.cache.generation
            async with self.db.conn() as conn:
                row = await tenants.get_key(conn, key_id)
            if row is not None and row["revoked_at"] is None:
                self.cache.put(key_id, row, generation)
        secret = (authorization or "").partition(" ")[2].strip()
        if row is None or row["revoked_at"] is not None:
            raise errors.UnauthorizedError("The API key is unknown or revoked.")
        if not auth.secret_matches(secret, row["secret_hash"]):
            raise errors.UnauthorizedError("The API key is unknown or revoked.")
        return auth.Principal(key_id=key_id, tenant=row["tenant_id"], role=Role(row["role"]))

    # -- console sessions --------------------------------------------------------------

    async def open_session(self, principal: auth.Principal, *, ttl: float) -> str:
        """A console session of `principal`'s key for `ttl` seconds; its id (the cookie's
        value), of which only the sha256 is kept."""
        token = secrets.token_urlsafe(32)
        async with self.db.conn() as conn:
            await console_sessions.open_session(
                conn, session_hash=_digest(token), key_id=principal.key_id, ttl=ttl
            )
        return token

    async def session_principal(self, token: str) -> auth.Principal:
        """Who a live session is (its key not revoked); UnauthorizedError when it is not."""
        row = None
        if token:
            async with self.db.conn() as conn:
                row = await console_sessions.session_key(conn, _digest(token))
        if row is None:
            raise errors.UnauthorizedError("The console session ended or expired.")
        return auth.Principal(key_id=row["key_id"], tenant=row["tenant_id"], role=Role(row["role"]))

    async def end_session(self, token: str) -> None:
        """Ended at once, for every API process (each request reads the row)."""
        async with self.db.conn() as conn:
            await console_sessions.end_session(conn, _digest(token))

    @staticmethod
    def whoami(principal: auth.Principal) -> Answer:
        body: dict[str, Any] = {
            "key_id": principal.key_id,
            "tenant": principal.tenant,
            "role": principal.role,
        }
        return Answer.of(200, body)

    async def ensure_admin_key(self) -> str | None:
        """Create an admin key if none exists; returns its secret (shown once) or None."""
        async with self.db.tx() as conn:
            await tenants.lock_admin_keys(conn)
            if await tenants.count_admin_keys(conn) > 0:
                return None
            key = auth.new_key()
            await tenants.create_key(
                conn, key_id=key.key_id, tenant=None, role=Role.ADMIN, secret_hash=key.secret_hash
            )
            return key.secret

    async def create_admin_key(self, principal: auth.Principal) -> Answer:
        """Another admin key (admin); its secret is shown once."""
        principal.require_admin()
        key = auth.new_key()
        async with self.db.tx() as conn:
            await tenants.create_key(
                conn, key_id=key.key_id, tenant=None, role=Role.ADMIN, secret_hash=key.secret_hash
            )
        return Answer.of(
            201, {"key_id": key.key_id, "tenant": None, "role": Role.ADMIN, "secret": key.secret}
        )

    async def list_admin_keys(self, principal: auth.Principal) -> Answer:
        principal.require_admin()
        async with self.db.conn() as conn:
            rows = await tenants.list_admin_keys(conn)
        return Answer.of(200, {"admin_keys": rows})

    async def revoke_admin_key(self, principal: auth.Principal, key_id: str) -> None:
        """Revoke an admin key (admin; also one's own), unless it is the last active one."""
        principal.require_admin()
        if not auth.is_key_id(key_id):
            raise errors.KeyNotFoundError(key_id=key_id)
        async with self.db.tx() as conn:
            await tenants.lock_admin_keys(conn)
            row = await tenants.get_key(conn, key_id)
            if row is None or row["role"] != Role.ADMIN:
                raise errors.KeyNotFoundError("No such admin key.", key_id=key_id)
            if row["revoked_at"] is None and await tenants.count_admin_keys(conn) <= 1:
                raise errors.LastAdminKeyError(key_id=key_id)
            await tenants.revoke_admin_key(conn, key_id)
        self.cache.clear()

    async def rotate_admin_key(
        self, key: auth.NewKey, *, revoke: str | None, revoke_all: bool
    ) -> list[str]:
        """Add admin key `key` and revoke `revoke` (or, with `revoke_all`, every other admin
        key) in one transaction; returns the ids revoked. For the server's own machine: it
        needs the database, not a key."""
        async with self.db.tx() as conn:
            await tenants.lock_admin_keys(conn)
            await tenants.create_key(
                conn, key_id=key.key_id, tenant=None, role=Role.ADMIN, secret_hash=key.secret_hash
            )
            if revoke_all:
                return await tenants.revoke_other_admin_keys(conn, keep=key.key_id)
            if revoke is not None and await tenants.revoke_admin_key(conn, revoke):
                return [revoke]
            return []

    async def create_key(
        self, principal: auth.Principal, tenant: str, role: Role, name: str | None = None
    ) -> Answer:
        """A new key of the tenant (admin); `name` is shown beside its id in ledgers."""
        principal.require_admin(tenant)
        key = auth.new_key()
        async with self.db.tx() as conn:
            await require_tenant(conn, tenant)
            await tenants.create_key(
                conn,
                key_id=key.key_id,
                tenant=tenant,
                role=role,
                secret_hash=key.secret_hash,
                name=name,
            )
        created = {"key_id": key.key_id, "tenant": tenant, "role": role, "name": name}
        return Answer.of(201, {**created, "secret": key.secret})

    async def list_keys(self, principal: auth.Principal, tenant: str, *, revoked: bool) -> Answer:
        """The tenant's keys (admin): id, role, created, revoked; never a secret or its hash."""
        principal.require_admin(tenant)
        async with self.db.conn() as conn:
            await require_tenant(conn, tenant)
            rows = await tenants.list_keys(conn, tenant=tenant, revoked=revoked)
        return Answer.of(200, {"keys": [views.api_key(row) for row in rows]})

    async def revoke_key(self, principal: auth.Principal, tenant: str, key_id: str) -> None:
        principal.require_admin(tenant)
        if not auth.is_key_id(key_id):
            raise errors.KeyNotFoundError(key_id=key_id)
        async with self.db.tx() as conn:
            if not await tenants.revoke_key(conn, tenant=tenant, key_id=key_id):
                raise errors.KeyNotFoundError(key_id=key_id)
        # This process stops accepting the key now; the others when the notification arrives.
        self.cache.clear()


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
