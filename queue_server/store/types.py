"""The types every statement function takes and returns: a pooled connection and a row."""

from __future__ import annotations

from typing import Any

from psycopg import AsyncConnection

Row = dict[str, Any]
Conn = AsyncConnection[Row]
