"""Ids: time-ordered UUIDv7 strings."""

from __future__ import annotations

import time
import uuid

from queue_server.models import is_uuid, uuid7


def test_uuid7_is_a_valid_version_7_uuid() -> None:
    for _ in range(1000):
        value = uuid7()
        parsed = uuid.UUID(value)
        assert parsed.version == 7
        assert parsed.variant == uuid.RFC_4122
        assert is_uuid(value)


def test_uuid7_sorts_by_creation_time_across_milliseconds() -> None:
    first = uuid7()
    time.sleep(0.002)
    second = uuid7()
    assert first < second


def test_is_uuid_refuses_other_strings() -> None:
    assert not is_uuid("not-a-uuid")
    assert not is_uuid(str(uuid.uuid4()).upper())
