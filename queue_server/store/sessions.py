"""The statements about sessions themselves: the role's defaults behind a transaction
pooler, and a commit that waits for the synchronous standby."""

from __future__ import annotations

from queue_server.store.sql import load

_SQL = load("sessions")

WANT_ROLE_DEFAULTS = _SQL["want_role_defaults"]

APPLY_ROLE_DEFAULTS = _SQL["apply_role_defaults"]

WAIT_FOR_STANDBY = _SQL["wait_for_standby"]
