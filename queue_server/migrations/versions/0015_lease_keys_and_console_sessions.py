"""a lease belongs to the key that took it; console sessions are rows of their own

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _ts(name: str, **kw: object) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), **kw)  # type: ignore[arg-type]


def upgrade() -> None:
    # The API key that acquired the item's latest lease: only that key acts as its holder.
    # A lease taken before this revision has none, and any key of the tenant that names its
    # holder and fence may still act on it until it ends.
    op.add_column("work_items", sa.Column("lease_key_id", sa.Text(), nullable=True))
    # A signed-in console: the browser's cookie carries a random id whose sha256 is kept
    # here, never the key. Sign-out ends it (`ended_at`) for every API process at once.
    op.create_table(
        "console_sessions",
        sa.Column("session_hash", sa.Text(), nullable=False),
        sa.Column("key_id", sa.Text(), nullable=False),
        _ts("created_at", server_default=sa.text("now()"), nullable=False),
        _ts("expires_at", nullable=False),
        _ts("ended_at", nullable=True),
        sa.CheckConstraint(
            "expires_at > created_at", name=op.f("ck_console_sessions_expire_later")
        ),
        sa.ForeignKeyConstraint(
            ["key_id"],
            ["api_keys.key_id"],
            name=op.f("fk_console_sessions_key_id_api_keys"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("session_hash", name=op.f("pk_console_sessions")),
    )
    op.create_index(op.f("ix_console_sessions_key_id"), "console_sessions", ["key_id"])


def downgrade() -> None:
    op.drop_index("ix_console_sessions_key_id", table_name="console_sessions")
    op.drop_table("console_sessions")
    op.drop_column("work_items", "lease_key_id")
