"""item_json: the item as the API shapes it, for the outbox rows every transition writes;
api_timestamp: a time as the API renders it

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Both are one expression, LANGUAGE sql and STABLE (to_char and jsonb_build_object
# are), neither STRICT nor with a SET clause: the planner inlines them into the statement
# that calls them, so a transition's plan is the one of the expression written out. The
# SQL-standard body (RETURN) is bound at creation: it names its columns and functions
# whatever the caller's search_path, and a migration cannot drop a column it reads.

# RFC 3339 in UTC with microseconds, as orjson renders the API's datetimes.
API_TIMESTAMP = """
CREATE FUNCTION api_timestamp(at timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN to_char(at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
"""

# The item exactly as `queue_server.views.item` shapes it, from a work_items row (the row
# a transition's RETURNING w.* gives): the `item` of every outbox body.
ITEM_JSON = """
CREATE FUNCTION item_json(s work_items) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
RETURN jsonb_build_object(
    'item_id', s.item_id::text, 'tenant', s.tenant_id, 'queue', s.queue,
    'state', s.state::text, 'payload', s.payload, 'priority', s.priority,
    'available_at', api_timestamp(s.available_at), 'fence', s.fence,
    'acquisition_count', s.acquisition_count, 'max_acquisitions', s.max_acquisitions,
    'lease_holder', s.lease_holder, 'lease_expires_at', api_timestamp(s.lease_expires_at),
    'lease_deadline_at', CASE WHEN s.state = 'leased'
                              THEN api_timestamp(s.lease_deadline_at) END,
    'result', s.result, 'last_failure', s.last_failure,
    'created_at', api_timestamp(s.created_at), 'updated_at', api_timestamp(s.updated_at))
"""


def upgrade() -> None:
    op.execute(API_TIMESTAMP)
    op.execute(ITEM_JSON)


def downgrade() -> None:
    op.execute("DROP FUNCTION item_json(work_items)")
    op.execute("DROP FUNCTION api_timestamp(timestamptz)")
