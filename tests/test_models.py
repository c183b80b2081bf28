"""Ids: time-ordered UUIDv7 strings."""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

from queue_server.models import is_uuid, uuid7
from queue_server.store.types import uuid_array

Db = psycopg.Connection[dict[str, object]]


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


def test_a_uuid_array_reads_back_as_its_ids_and_refuses_anything_else(db: Db) -> None:
    """The ids a batch statement probes are sent as one `uuid[]` literal: PostgreSQL reads
    it back as exactly those ids, in order; a string that is not one canonical UUID (two of
    them joined by a comma, a quote, upper case) is refused before it is sent."""
    ids = [uuid7() for _ in range(3)]
    [row] = db.execute("SELECT %(ids)s::uuid[] AS ids", {"ids": uuid_array(ids)}).fetchall()
    assert row["ids"] == [uuid.UUID(i) for i in ids]
    [empty] = db.execute("SELECT %(ids)s::uuid[] AS ids", {"ids": uuid_array([])}).fetchall()
    assert empty["ids"] == []
    for bad in (f"{ids[0]},{ids[1]}", f'{ids[0]}"', ids[0].upper(), "", "{}"):
        with pytest.raises(ValueError, match="not canonical UUIDs"):
            uuid_array([ids[2], bad])
