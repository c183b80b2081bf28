"""Server settings, read from QUEUE_SERVER_* environment variables."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """Where the embedded PostgreSQL and the admin key live unless told otherwise."""
    return Path(platformdirs.user_data_dir("queue-server"))


class Settings(BaseSettings):
    """Everything the API process needs; built once and passed to `create_app`."""

    model_config = SettingsConfigDict(env_prefix="QUEUE_SERVER_", extra="ignore")

    # A libpq URL (postgresql://user@host/db?host=/socket/dir). Empty: embedded PostgreSQL.
    database_url: str = ""
    data_dir: Path = Field(default_factory=default_data_dir)
    host: str = "127.0.0.1"
    port: int = 8080
    pool_min_size: int = Field(default=4, ge=1)
    pool_max_size: int = Field(default=20, ge=1)
    # Idempotency receipts are kept at least this long (the API promises 24 hours).
    idempotency_retention: timedelta = timedelta(hours=24)
    problem_base_uri: str = "https://queue-server.dev/problems"
    # Upper bound on any one statement and on waiting for a row lock, so a
    # blocked request answers with a problem instead of hanging.
    statement_timeout_ms: int = Field(default=15_000, ge=100)
    lock_timeout_ms: int = Field(default=5_000, ge=50)
    max_body_bytes: int = 1024 * 1024
    # A long-poll acquire re-checks at least this often even without a notification
    # (expired leases and delayed items become due without one).
    poll_interval: float = Field(default=1.0, gt=0)
