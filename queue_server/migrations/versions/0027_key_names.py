"""a key may carry a name (`billing-worker`), shown beside its id wherever the ledger
names the key that acted

Keys made before keep no name; the ledger's actor stays `key:<id>` (the name is looked up
when it is read, so renaming never rewrites history, and a revoked key keeps its name).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-05
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | Sequence[str] | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAMED = "name IS NULL OR (char_length(name) BETWEEN 1 AND 64 AND name !~ '[[:cntrl:]]')"


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("name", sa.Text(), nullable=True))
    op.create_check_constraint(op.f("ck_api_keys_name_printable"), "api_keys", NAMED)


def downgrade() -> None:
    op.drop_constraint(op.f("ck_api_keys_name_printable"), "api_keys", type_="check")
    op.drop_column("api_keys", "name")
