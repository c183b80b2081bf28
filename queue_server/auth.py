"""API keys and who may do what: a key belongs to one tenant with a role, or is an admin key."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from queue_server import errors
from queue_server.models import Role

KEY_PREFIX = "qsk_"


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str
    tenant: str | None
    role: Role

    @property
    def actor(self) -> str:
        return f"key:{self.key_id}"

    def require_visible(self, tenant: str) -> None:
        """Another tenant's anything is 404, whatever else is wrong with the request."""
        if self.role is not Role.ADMIN and self.tenant != tenant:
            raise errors.TenantNotFoundError(tenant=tenant)

    def require(self, tenant: str, *roles: Role) -> None:
        """Tenant isolation first (another tenant's resources are 404), then the role (403)."""
        if self.role is Role.ADMIN:
            return
        if self.tenant != tenant:
            raise errors.TenantNotFoundError(tenant=tenant)
        if self.role not in roles:
            allowed = ", ".join(role.value for role in roles) or "admin"
            raise errors.ForbiddenRoleError(
                f"A {self.role.value} key may not do this; it needs: {allowed}.",
                role=self.role.value,
            )

    def require_admin(self, tenant: str | None = None) -> None:
        """Admin only; about another tenant, a tenant's key learns nothing (404, not 403)."""
        if self.role is Role.ADMIN:
            return
        if tenant is not None and self.tenant != tenant:
            raise errors.TenantNotFoundError(tenant=tenant)
        raise errors.ForbiddenRoleError("Only an admin key may do this.", role=self.role.value)


@dataclass(frozen=True, slots=True)
class NewKey:
    key_id: str
    secret: str
    secret_hash: str


def new_key() -> NewKey:
    """A key id and a secret; only the secret's hash is ever stored."""
    key_id = secrets.token_hex(8)
    secret = f"{KEY_PREFIX}{key_id}_{secrets.token_urlsafe(32)}"
    return NewKey(key_id=key_id, secret=secret, secret_hash=hash_secret(secret))


def is_key_id(value: str) -> bool:
    """Key ids are 16 lowercase hex digits (`new_key`); anything else names no key."""
    return len(value) == 16 and all(c in "0123456789abcdef" for c in value)


def hash_secret(secret: str) -> str:
    # The secret has 256 random bits: a fast hash is enough, a slow one would only cost latency.
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_bearer(header: str | None) -> str:
    """The key id inside `Authorization: Bearer qsk_<id>_<secret>`, or 401."""
    if not header:
        raise errors.UnauthorizedError()
    scheme, _, token = header.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token.startswith(KEY_PREFIX):
        raise errors.UnauthorizedError("The Authorization header must be `Bearer <api key>`.")
    key_id, sep, rest = token[len(KEY_PREFIX) :].partition("_")
    if not sep or not rest or len(key_id) != 16:
        raise errors.UnauthorizedError("The API key is malformed.")
    return key_id


def secret_matches(secret: str, secret_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), secret_hash)
