"""an item keeps its enqueue's W3C trace context; a schedule keeps its creator's

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The header as W3C Trace Context version 00 writes it; the API drops any other before
# it reaches a row, and the constraint keeps a row from holding one all the same.
_TRACEPARENT = "traceparent ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'"
_TRACESTATE = "length(tracestate) <= 512"


def upgrade() -> None:
    for table in ("work_items", "schedules"):
        op.add_column(table, sa.Column("traceparent", sa.Text(), nullable=True))
        op.add_column(table, sa.Column("tracestate", sa.Text(), nullable=True))
        op.create_check_constraint(op.f(f"ck_{table}_traceparent_w3c"), table, _TRACEPARENT)
        op.create_check_constraint(op.f(f"ck_{table}_tracestate_bounded"), table, _TRACESTATE)


def downgrade() -> None:
    for table in ("schedules", "work_items"):
        op.drop_constraint(op.f(f"ck_{table}_tracestate_bounded"), table, type_="check")
        op.drop_constraint(op.f(f"ck_{table}_traceparent_w3c"), table, type_="check")
        op.drop_column(table, "tracestate")
        op.drop_column(table, "traceparent")
