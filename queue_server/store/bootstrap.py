"""The statements `queue-server serve` runs on the embedded PostgreSQL's maintenance database."""

from __future__ import annotations

from queue_server.store.sql import load

_SQL = load("bootstrap")

# The database the embedded PostgreSQL serves the queue from.
DATABASE_NAME = "queue_server"

DATABASE_EXISTS = _SQL["database_exists"]
CREATE_DATABASE = _SQL["create_database"]
