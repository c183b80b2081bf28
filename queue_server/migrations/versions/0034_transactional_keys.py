"""the transactional enqueue takes the keys the REST enqueue takes: `unique_key` (with
`unique_for`), `ordering_key` and `partition_key`, in each item of queue_server.enqueue_many
and as arguments of queue_server.enqueue

The admission is the one the REST route uses (queue_server.admit, migrations 0030 to 0033),
which already knew the keys; what changes is what the SQL functions let through, and what
they answer: each item given has an id in the answer, the item made for it or, its unique
key held, the item holding it (as the REST route answers with the holder). A call without
keys has the fingerprint it had, so a retry of a call made before this migration replays.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-06
"""

import importlib
from collections.abc import Sequence
from types import ModuleType

from alembic import op

revision: str = "0034"
down_revision: str | Sequence[str] | None = "0033"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEYS = ("unique_key", "partition_key", "ordering_key")
KNOWN = ("payload", "priority", "delay", "max_acquisitions", "unique_key", "unique_for")
KNOWN += ("partition_key", "ordering_key")


def _key_checks() -> str:
    """A CASE branch per key: a string of 1 to 255 printable ASCII characters, as REST's."""
    return "".join(
        f"                  WHEN jsonb_typeof(e->'{k}') NOT IN ('string', 'null')\n"
        f"                    OR e->>'{k}' !~ '^[!-~]{{{{1,255}}}}$'\n"
        f"                      THEN '{k} must be 1 to 255 printable ASCII characters'\n"
        for k in KEYS
    )


# 0017's queue_server.enqueue_items, with the keys: let through, checked, part of the
# request's fingerprint only when given, and answered for.
EDITS = (
    ("    body jsonb;\n",
     "    body jsonb;\n    made work_items[];\n"),
    ("                               ('payload', 'priority', 'delay', 'max_acquisitions'))\n"
     "                      THEN 'only payload, priority, delay and max_acquisitions are known'\n",
     "                               (" + ", ".join(f"'{k}'" for k in KNOWN) + "))\n"
     "                      THEN 'only " + ", ".join(KNOWN[:-1]) + " and " + KNOWN[-1]
     + " are known'\n"),
    ("                  WHEN octet_length((e->'payload')::text) > 1048576\n",
     _key_checks()
     + "                  WHEN jsonb_typeof(e->'unique_for') NOT IN ('number', 'null')\n"
     "                      THEN 'unique_for must be a number of seconds'\n"
     "                  WHEN (e->>'unique_for')::numeric <= 0\n"
     "                    OR (e->>'unique_for')::numeric > 31622400\n"
     "                      THEN 'unique_for must be more than 0 and at most 31622400 seconds'\n"
     "                  WHEN e->>'unique_for' IS NOT NULL AND e->>'unique_key' IS NULL\n"
     "                      THEN 'unique_for is a period of a unique_key, and no unique_key is given'\n"
     "                  WHEN octet_length((e->'payload')::text) > 1048576\n"),
    ("               'max_acquisitions', (e->>'max_acquisitions')::int) ORDER BY i)\n",
     "               'max_acquisitions', (e->>'max_acquisitions')::int)\n"
     "           -- The keys (0034) only when given: a call without them keeps its fingerprint.\n"
     "           || jsonb_strip_nulls(jsonb_build_object(\n"
     "               'unique_key', e->>'unique_key',\n"
     "               'unique_for', (e->>'unique_for')::double precision,\n"
     "               'partition_key', e->>'partition_key',\n"
     "               'ordering_key', e->>'ordering_key')) ORDER BY i)\n"),
    ("    SELECT jsonb_build_object('items', jsonb_agg(item_json(a)\n"
     "                                                 ORDER BY array_position(ids, a.item_id)))\n"
     "        INTO body\n"
     "    FROM queue_server.admit(\n",
     "    made := ARRAY(SELECT a FROM queue_server.admit(\n"),
    ("        'role:' || session_user, env.attempt_cap, env.backlog_cap) AS a;\n",
     "        'role:' || session_user, env.attempt_cap, env.backlog_cap) AS a);\n"
     "    -- Each item given, in order: the one made for it, else (its unique key held) the\n"
     "    -- item holding the key, made before this call or for an earlier item of it.\n"
     "    SELECT array_agg((r.w).item_id ORDER BY x.i),\n"
     "           jsonb_build_object('items', jsonb_agg(item_json(r.w) ORDER BY x.i))\n"
     "        INTO ids, body\n"
     "    FROM jsonb_array_elements(specs) WITH ORDINALITY AS x(s, i)\n"
     "    CROSS JOIN LATERAL (\n"
     "        SELECT u FROM unnest(made) AS u\n"
     "        WHERE (u).item_id = ids[x.i] OR (u).unique_key = x.s->>'unique_key'\n"
     "        ORDER BY (u).item_id = ids[x.i] DESC, (u).item_id\n"
     "        LIMIT 1) AS r(w);\n"),
)  # fmt: skip

# queue_server.enqueue, with the keys as arguments after 0017's (all defaulted: a call that
# names none, or passes 0017's arguments by position, is what it was).
ENQUEUE_EDITS = (
    ("                                     tracestate text DEFAULT NULL)\n",
     "                                     tracestate text DEFAULT NULL,\n"
     "                                     unique_key text DEFAULT NULL,\n"
     "                                     unique_for interval DEFAULT NULL,\n"
     "                                     partition_key text DEFAULT NULL,\n"
     "                                     ordering_key text DEFAULT NULL)\n"),
    ("            'delay', extract(epoch FROM delay), 'max_acquisitions', max_acquisitions)),\n",
     "            'delay', extract(epoch FROM delay), 'max_acquisitions', max_acquisitions)\n"
     "            || jsonb_strip_nulls(jsonb_build_object(\n"
     "                'unique_key', unique_key, 'unique_for', extract(epoch FROM unique_for),\n"
     "                'partition_key', partition_key, 'ordering_key', ordering_key))),\n"),
)  # fmt: skip


def _edited(text: str, edits: tuple[tuple[str, str], ...]) -> str:
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


def enqueue() -> str:
    return _edited(_transactional().ENQUEUE, ENQUEUE_EDITS)


OLD_SIGNATURE = "queue_server.enqueue(text, text, jsonb, text, int, interval, int, text, text)"
SIGNATURE = OLD_SIGNATURE.removesuffix(")") + ", text, interval, text, text)"


def _transactional() -> ModuleType:
    return importlib.import_module("queue_server.migrations.versions.0017_transactional_enqueue")


def _home() -> str:
    shards = importlib.import_module("queue_server.migrations.versions.0028_admission_shards")
    home: str = shards._home()
    return home


def enqueue_items() -> str:
    text = _edited(_transactional().ENQUEUE_ITEMS, EDITS)
    return text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")


def _ddl(text: str, home: str) -> str:
    return text.replace("{home}", home).replace("{{", "{").replace("}}", "}")


def _enqueue(text: str, signature: str, home: str) -> None:
    op.execute(_ddl(text, home))
    op.execute(f"REVOKE EXECUTE ON FUNCTION {signature} FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION {signature} TO queue_server_enqueuer")


def upgrade() -> None:
    home = _home()
    op.execute(_ddl(enqueue_items(), home))
    op.execute(f"DROP FUNCTION {OLD_SIGNATURE}")
    _enqueue(enqueue(), SIGNATURE, home)


def downgrade() -> None:
    home = _home()
    previous = _transactional()
    op.execute(f"DROP FUNCTION {SIGNATURE}")
    _enqueue(previous.ENQUEUE, OLD_SIGNATURE, home)
    op.execute(
        _ddl(previous.ENQUEUE_ITEMS.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION"), home)
    )
