"""The statements `queue-server serve` runs on the embedded PostgreSQL's maintenance database."""

from __future__ import annotations

from queue_server.store.sql import Statements

_SQL = Statements(__name__)

# The database the embedded PostgreSQL serves the queue from.
DATABASE_NAME = "queue_server"

DATABASE_EXISTS = _SQL("database_exists", "SELECT 1 FROM pg_database WHERE datname = %s")
CREATE_DATABASE = _SQL("create_database", f"CREATE DATABASE {DATABASE_NAME}")
