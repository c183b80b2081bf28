"""policy versions are content-addressed: a version names one document (its sha256), so a
name published or loaded with other content is refused; a version published by an admin
keeps who published it, why and when, and the one published last that is activated is what
a server without `--policy` runs under

Versions kept under one name with different content before this migration keep their
documents; every one but the last loaded is renamed `<version>+<first 12 hex of its
sha256>`, so that the name is unique from here on.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | Sequence[str] | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RENAME_REUSED = """
UPDATE policy_versions p
SET version = left(p.version, 87) || '+' || left(p.sha256, 12)
WHERE EXISTS (
    SELECT 1 FROM policy_versions q
    WHERE q.version = p.version AND (q.last_loaded_at, q.sha256) > (p.last_loaded_at, p.sha256)
)
"""


def _ts(name: str) -> sa.Column[object]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=True)  # type: ignore[arg-type]


def upgrade() -> None:
    op.execute(RENAME_REUSED)
    op.create_unique_constraint(op.f("uq_policy_versions_version"), "policy_versions", ["version"])
    op.add_column("policy_versions", sa.Column("published_by", sa.Text(), nullable=True))
    op.add_column("policy_versions", sa.Column("reason", sa.Text(), nullable=True))
    op.add_column("policy_versions", _ts("published_at"))
    op.add_column("policy_versions", _ts("activated_at"))
    op.create_check_constraint(
        op.f("ck_policy_versions_published_with_reason"),
        "policy_versions",
        "(published_at IS NULL) = (published_by IS NULL AND reason IS NULL)",
    )


def downgrade() -> None:
    op.drop_constraint(
        op.f("ck_policy_versions_published_with_reason"), "policy_versions", type_="check"
    )
    op.drop_column("policy_versions", "activated_at")
    op.drop_column("policy_versions", "published_at")
    op.drop_column("policy_versions", "reason")
    op.drop_column("policy_versions", "published_by")
    op.drop_constraint(op.f("uq_policy_versions_version"), "policy_versions", type_="unique")
