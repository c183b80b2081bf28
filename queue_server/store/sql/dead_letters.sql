-- The statements of queue_server/store/dead_letters.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: list_page_open
-- Open dead letters read the partial index ix_dead_letters_open in this order.
SELECT dead_letter_id, kind, item_id, delivery_id, queue, reason, last_failure, created_at,
    closed_at, resolution FROM dead_letters
WHERE tenant_id = %(tenant)s AND closed_at IS NULL
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, dead_letter_id) > (%(after_at)s, %(after_id)s::uuid))
ORDER BY created_at, dead_letter_id
LIMIT %(limit)s;

-- name: list_page_closed
SELECT dead_letter_id, kind, item_id, delivery_id, queue, reason, last_failure, created_at,
    closed_at, resolution FROM dead_letters
WHERE tenant_id = %(tenant)s AND closed_at IS NOT NULL
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, dead_letter_id) > (%(after_at)s, %(after_id)s::uuid))
ORDER BY created_at, dead_letter_id
LIMIT %(limit)s;

-- name: list_page_all
SELECT dead_letter_id, kind, item_id, delivery_id, queue, reason, last_failure, created_at,
    closed_at, resolution FROM dead_letters
WHERE tenant_id = %(tenant)s AND true
  AND (%(queue)s::text IS NULL OR queue = %(queue)s)
  AND (%(kind)s::text IS NULL OR kind = %(kind)s)
  AND (%(after_at)s::timestamptz IS NULL
       OR (created_at, dead_letter_id) > (%(after_at)s, %(after_id)s::uuid))
ORDER BY created_at, dead_letter_id
LIMIT %(limit)s;

-- name: latest_for_delivery
SELECT dead_letter_id, kind, item_id, delivery_id, queue, reason, last_failure, created_at,
    closed_at, resolution FROM dead_letters WHERE tenant_id = %s AND delivery_id = %s
ORDER BY closed_at IS NULL DESC, created_at DESC LIMIT 1;

-- name: open_for_item
-- An item's open dead letter (at most one: uq_dead_letters_open_item).
SELECT dead_letter_id FROM dead_letters
WHERE tenant_id = %s AND item_id = %s AND kind = 'item' AND closed_at IS NULL;

-- name: get
SELECT dead_letter_id, kind, item_id, delivery_id, queue, reason, last_failure, created_at,
    closed_at, resolution FROM dead_letters WHERE tenant_id = %s AND dead_letter_id = %s;

-- name: lock_for_resolution
SELECT d.dead_letter_id, d.kind, d.item_id, d.delivery_id, d.queue, d.reason, d.last_failure,
    d.created_at, d.closed_at, d.resolution,
       w.state::text AS item_state
FROM dead_letters d
LEFT JOIN work_items w ON w.tenant_id = d.tenant_id AND w.item_id = d.item_id
WHERE d.tenant_id = %(tenant)s AND d.dead_letter_id = %(dead_letter_id)s
FOR UPDATE OF d;

-- name: lock_item
SELECT state::text AS state FROM work_items
WHERE tenant_id = %(tenant)s AND item_id = %(item_id)s
FOR UPDATE;

-- name: open_for_queue
SELECT dead_letter_id, kind, item_id, delivery_id, queue, reason, last_failure, created_at,
    closed_at, resolution FROM dead_letters
WHERE tenant_id = %(tenant)s AND queue = %(queue)s AND kind = 'item' AND closed_at IS NULL
ORDER BY created_at, dead_letter_id
LIMIT %(limit)s
-- SKIP LOCKED: a dead letter another operator is resolving right now is theirs.
FOR UPDATE SKIP LOCKED;

-- name: count_open
SELECT count(*) AS n FROM dead_letters WHERE tenant_id = %s AND closed_at IS NULL
  AND (%s::text IS NULL OR queue = %s);
