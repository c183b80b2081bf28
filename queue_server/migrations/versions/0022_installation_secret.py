"""the installation's secret, which only the tables' owner reads, and the tag of a queue
made with it (queue_server.ready_tag): what the ready channel's NOTIFY carries instead of
`tenant/queue`, so that a role that LISTENs learns no tenant's queue names

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

import importlib
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# PostgreSQL has no LISTEN privilege: any role may listen on any channel. The payload of
# the ready channel is the hex SHA-256 of `secret/tenant/queue`; the server computes the
# same for the queues it waits on (queue_server/store/channels.py). gen_random_uuid() draws
# from the strong random source: two of them, 244 random bits.
READY_TAG = """
CREATE FUNCTION queue_server.ready_tag(p_tenant text, p_queue text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = {home}, pg_temp
RETURN (SELECT encode(sha256(convert_to(s.secret || '/' || p_tenant || '/' || p_queue,
                                        'UTF8')), 'hex')
        FROM installation_secret s)
"""


def _home() -> str:
    found = op.get_bind().execute(
        sa.text(
            "SELECT relnamespace::regnamespace::text FROM pg_class"
            " WHERE oid = 'work_items'::regclass"
        )
    )
    return str(found.scalar_one())


def _admission() -> object:
    return importlib.import_module("queue_server.migrations.versions.0020_admission_lock_last")


def upgrade() -> None:
    home = _home()
    op.create_table(
        "installation_secret",
        sa.Column("singleton", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column(
            "secret",
            sa.Text(),
            server_default=sa.text("gen_random_uuid()::text || gen_random_uuid()::text"),
            nullable=False,
        ),
        sa.CheckConstraint("singleton", name=op.f("ck_installation_secret_one_row")),
        sa.PrimaryKeyConstraint("singleton", name=op.f("pk_installation_secret")),
        schema=home,
    )
    op.execute(f"INSERT INTO {home}.installation_secret DEFAULT VALUES")
    op.execute(f"REVOKE ALL ON {home}.installation_secret FROM PUBLIC")
    op.execute(READY_TAG.replace("{home}", home))
    op.execute("REVOKE EXECUTE ON FUNCTION queue_server.ready_tag(text, text) FROM PUBLIC")
    seal: str = _admission().ADMIT_SEAL  # type: ignore[attr-defined]
    notify = "PERFORM pg_notify('queue_server_ready', p_tenant || '/' || p_queue);"
    assert notify in seal
    seal = seal.replace(
        notify,
        "PERFORM pg_notify('queue_server_ready', queue_server.ready_tag(p_tenant, p_queue));",
    ).replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    op.execute(seal.replace("{home}", home).replace("{{", "{").replace("}}", "}"))


def downgrade() -> None:
    home = _home()
    seal: str = _admission().ADMIT_SEAL  # type: ignore[attr-defined]
    seal = seal.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
    op.execute(seal.replace("{home}", home).replace("{{", "{").replace("}}", "}"))
    op.execute("DROP FUNCTION queue_server.ready_tag(text, text)")
    op.drop_table("installation_secret", schema=home)
