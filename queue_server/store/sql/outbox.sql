-- The statements of queue_server/store/outbox.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: delivery_counts
SELECT watcher_id::text AS watcher_id, state, count(*) AS n FROM outbox_deliveries
WHERE tenant_id = %(tenant)s GROUP BY watcher_id, state;

-- name: list_deliveries
SELECT tenant_id, delivery_id, seq, watcher_id, delivery_key, event, item_id, queue, state,
    attempts, next_attempt_at, due_at, last_attempt_at, last_outcome, receipts, receipts_omitted,
    created_at, updated_at, delivered_at, deadline_from FROM outbox_deliveries
WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s
  AND (%(state)s::text IS NULL OR state = %(state)s)
  AND (%(after)s::bigint IS NULL OR seq > %(after)s)
ORDER BY seq
LIMIT %(limit)s;

-- name: get_delivery
SELECT tenant_id, delivery_id, seq, watcher_id, delivery_key, event, item_id, queue, state,
    attempts, next_attempt_at, due_at, last_attempt_at, last_outcome, receipts, receipts_omitted,
    created_at, updated_at, delivered_at, deadline_from FROM outbox_deliveries
WHERE tenant_id = %(tenant)s AND delivery_id = %(delivery_id)s;

-- name: lock_claims
-- Claims are taken one deliverer at a time (this lock, held to the claim's commit), so
-- the claim statement's count of the deliveries in flight includes every other claim.
SELECT pg_advisory_xact_lock(hashtext('queue-server-deliveries-in-flight'));

-- name: claim
-- The attempt's number and the instant of the next one are committed before the
-- request is sent: a deliverer that dies mid-attempt leaves the row due again at the
-- persisted instant (or at its claim's expiry, whichever is later), never earlier.
-- One watcher's claimed rows go out one at a time, and a watcher with a claimed row gets
-- no other claim until it is recorded; so the requests in flight are the watchers with
-- claimed rows (claim not expired), of every deliverer: a claim keeps them at most
-- `concurrency`, taking the due rows of the first watchers in due order.
WITH in_flight AS MATERIALIZED (
    SELECT DISTINCT tenant_id, watcher_id FROM outbox_deliveries
    WHERE state = 'pending' AND claim_token IS NOT NULL
      AND claimed_until > statement_timestamp()
), candidates AS (
    SELECT o.tenant_id, o.delivery_id, o.watcher_id,
           row_number() OVER (ORDER BY o.due_at, o.seq) AS pos
    FROM outbox_deliveries o
    WHERE o.state = 'pending' AND o.due_at <= statement_timestamp()
      AND o.deadline_from > statement_timestamp() - make_interval(secs => %(deadline)s)
      AND EXISTS (SELECT 1 FROM watchers w
                  WHERE w.tenant_id = o.tenant_id AND w.watcher_id = o.watcher_id
                    AND w.state = 'active')
      AND NOT EXISTS (SELECT 1 FROM in_flight f
                      WHERE f.tenant_id = o.tenant_id AND f.watcher_id = o.watcher_id)
      AND o.delivery_id <> ALL(%(exclude)s::uuid[])
    ORDER BY o.due_at, o.seq
    LIMIT %(limit)s
), ranked AS (
    -- watcher_rank: the watcher's rank among the claim's watchers, in due order.
    SELECT r.tenant_id, r.delivery_id, dense_rank() OVER (ORDER BY r.first_pos) AS watcher_rank
    FROM (SELECT c.*, min(c.pos) OVER (PARTITION BY c.tenant_id, c.watcher_id) AS first_pos
          FROM candidates c) r
), due AS (
    -- SKIP LOCKED: a row being recorded or cancelled right now is not ours.
    SELECT o.tenant_id, o.delivery_id, o.next_attempt_at, o.due_at, o.last_attempt_at
    FROM outbox_deliveries o
    JOIN ranked r ON r.tenant_id = o.tenant_id AND r.delivery_id = o.delivery_id
    WHERE r.watcher_rank <= %(concurrency)s - (SELECT count(*) FROM in_flight)
      AND o.state = 'pending' AND o.due_at <= statement_timestamp()
    FOR UPDATE OF o SKIP LOCKED
), claimed AS (
    UPDATE outbox_deliveries o
    SET attempts = o.attempts + 1,
        -- A watcher's rows go out one after another: recording one renews the next ones'.
        claim_token = %(token)s, claimed_until = statement_timestamp() + %(lease)s,
        last_attempt_at = statement_timestamp(),
        next_attempt_at = statement_timestamp()
            + make_interval(secs => (%(delays)s::float8[])[o.attempts + 1]),
        due_at = greatest(statement_timestamp()
                              + make_interval(secs => (%(delays)s::float8[])[o.attempts + 1]),
                          statement_timestamp() + %(lease)s),
        updated_at = statement_timestamp()
    FROM due
    WHERE o.tenant_id = due.tenant_id AND o.delivery_id = due.delivery_id
    RETURNING o.*, due.next_attempt_at AS prev_next_attempt_at, due.due_at AS prev_due_at,
              due.last_attempt_at AS prev_last_attempt_at
)
SELECT c.*, w.url, w.secret,
       CASE WHEN w.previous_secret_expires_at > statement_timestamp()
            THEN w.previous_secret END AS previous_secret,
       statement_timestamp() AS claimed_at,
       -- The wall deadline of this attempt's broker run: what is left of the delivery's.
       extract(epoch FROM c.deadline_from + make_interval(secs => %(deadline)s)
                          - statement_timestamp())::float8 AS deadline_in
FROM claimed c
JOIN watchers w ON w.tenant_id = c.tenant_id AND w.watcher_id = c.watcher_id
ORDER BY c.seq;

-- name: release
UPDATE outbox_deliveries
SET attempts = attempts - 1, next_attempt_at = %(next_attempt_at)s, due_at = %(due_at)s,
    last_attempt_at = %(last_attempt_at)s, claim_token = NULL, claimed_until = NULL,
    updated_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND delivery_id = %(delivery_id)s AND claim_token = %(token)s
RETURNING delivery_id;

-- name: return_to_outbox
UPDATE outbox_deliveries
SET last_outcome = %(outcome)s, receipts = %(receipts)s, receipts_omitted = %(omitted)s,
    claim_token = NULL, claimed_until = NULL, due_at = statement_timestamp(),
    updated_at = statement_timestamp()
WHERE tenant_id = %(tenant)s AND delivery_id = %(delivery_id)s AND claim_token = %(token)s
  AND state = 'pending'
RETURNING delivery_id;

-- name: record
WITH upd AS (
    UPDATE outbox_deliveries
    SET state = %(state)s, last_outcome = %(outcome)s, receipts = %(receipts)s,
        receipts_omitted = %(omitted)s, claim_token = NULL, claimed_until = NULL,
        delivered_at = CASE WHEN %(state)s = 'delivered' THEN statement_timestamp() END,
        next_attempt_at = CASE WHEN %(state)s = 'pending' THEN next_attempt_at END,
        due_at = CASE WHEN %(state)s = 'pending' THEN coalesce(next_attempt_at, due_at)
                      ELSE due_at END,
        updated_at = statement_timestamp()
    WHERE tenant_id = %(tenant)s AND delivery_id = %(delivery_id)s
      AND claim_token = %(token)s AND state = 'pending'
    RETURNING *
), dead AS (
    INSERT INTO dead_letters (tenant_id, kind, item_id, delivery_id, queue, reason,
                              last_failure, created_at)
    SELECT tenant_id, 'delivery', item_id, delivery_id, queue, %(reason)s, last_outcome,
           statement_timestamp()
    FROM upd WHERE state = 'dead'
), renewed AS (
    -- The watcher's next rows of this claim go out after this one: their claims run on.
    UPDATE outbox_deliveries o
    SET claimed_until = statement_timestamp() + %(lease)s,
        due_at = greatest(o.due_at, statement_timestamp() + %(lease)s)
    FROM upd
    WHERE o.tenant_id = upd.tenant_id AND o.watcher_id = upd.watcher_id
      AND o.claim_token = %(token)s AND o.state = 'pending'
      AND o.delivery_id <> upd.delivery_id
)
SELECT * FROM upd;

-- name: expire
WITH overdue AS (
    -- Only an active watcher's deadlines run (a paused one's wait), and a row in flight
    -- ends by its own broker's wall deadline instead.
    SELECT o.tenant_id, o.delivery_id
    FROM outbox_deliveries o
    JOIN watchers w ON w.tenant_id = o.tenant_id AND w.watcher_id = o.watcher_id
     AND w.state = 'active'
    WHERE o.state = 'pending'
      AND o.deadline_from <= statement_timestamp() - make_interval(secs => %(deadline)s)
      AND (o.claim_token IS NULL OR o.claimed_until <= statement_timestamp())
    ORDER BY o.deadline_from
    LIMIT %(limit)s
    FOR UPDATE OF o SKIP LOCKED
), upd AS (
    UPDATE outbox_deliveries o
    SET state = 'dead', claim_token = NULL, claimed_until = NULL, next_attempt_at = NULL,
        last_outcome = jsonb_build_object(
            'attempt', o.attempts, 'outcome', 'deadline_exceeded', 'status', NULL,
            'detail', 'not delivered within ' || %(deadline)s || ' s of its event'),
        updated_at = statement_timestamp()
    FROM overdue d
    WHERE o.tenant_id = d.tenant_id AND o.delivery_id = d.delivery_id AND o.state = 'pending'
    RETURNING o.*
), dead AS (
    INSERT INTO dead_letters (tenant_id, kind, item_id, delivery_id, queue, reason,
                              last_failure, created_at)
    SELECT tenant_id, 'delivery', item_id, delivery_id, queue,
           'deadline-exceeded: not delivered within ' || %(deadline)s || ' s of its event',
           last_outcome, statement_timestamp()
    FROM upd
)
SELECT count(*) AS expired FROM upd;

-- name: resolve_dead_letter
WITH dl AS (
    UPDATE dead_letters d SET closed_at = statement_timestamp(), resolution = %(resolution)s
    FROM outbox_deliveries o
    WHERE d.tenant_id = %(tenant)s AND d.dead_letter_id = %(dead_letter_id)s
      AND d.kind = 'delivery' AND d.closed_at IS NULL
      AND o.tenant_id = d.tenant_id AND o.delivery_id = d.delivery_id AND o.state = 'dead'
    RETURNING d.delivery_id
)
UPDATE outbox_deliveries o
SET state = %(state)s, attempts = CASE WHEN %(state)s = 'pending' THEN 0 ELSE o.attempts END,
    next_attempt_at = CASE WHEN %(state)s = 'pending' THEN statement_timestamp() END,
    deadline_from = CASE WHEN %(state)s = 'pending' THEN statement_timestamp()
                         ELSE o.deadline_from END,
    due_at = statement_timestamp(), updated_at = statement_timestamp()
FROM dl
WHERE o.tenant_id = %(tenant)s AND o.delivery_id = dl.delivery_id AND o.state = 'dead'
RETURNING o.*;

-- name: delivery_watcher_state
SELECT o.state, w.state AS watcher_state, o.watcher_id::text AS watcher_id
FROM outbox_deliveries o
JOIN watchers w ON w.tenant_id = o.tenant_id AND w.watcher_id = o.watcher_id
WHERE o.tenant_id = %(tenant)s AND o.delivery_id = %(delivery_id)s
FOR UPDATE OF o, w;

-- name: lock_backlogged
-- Backlogged watchers, oldest mark first, each locked until the backfill commits. Every
-- transition that skipped one of its events held this lock to its commit (the
-- outbox_admit trigger), so once it is ours every skipped event is in the ledger, and a
-- transition that skips one later lowers `backlog_from` to it. SKIP LOCKED: a watcher
-- another deliverer is backfilling, or whose events a transition is writing now, waits
-- for the next run.
SELECT tenant_id, watcher_id, backlog_from FROM watchers
WHERE backlogged_at IS NOT NULL AND state = 'active'
ORDER BY backlogged_at, tenant_id, watcher_id
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED;

-- name: backfill
-- The watcher's missed events, from the ledger in its order (instant, item, seq), as many
-- as its outbox has room for under the cap; each under the key its transition would have
-- given it, so an event that has its row already (written before the mark, or by an
-- earlier backfill) is not written again. The body's item is the item as it is now.
-- Caught up: the mark is cleared; else `backlog_from` moves on to the first event left.
WITH w AS (
    SELECT * FROM watchers
    WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s AND backlogged_at IS NOT NULL
), room AS (
    SELECT greatest(%(cap)s - count(*), 0) AS n FROM outbox_deliveries
    WHERE tenant_id = %(tenant)s AND watcher_id = %(watcher_id)s AND state = 'pending'
), ledger AS (
    SELECT e.at, e.item_id, e.seq, i AS item,
           CASE e.kind WHEN 'enqueued' THEN 'item.enqueued'
                       WHEN 'completed' THEN 'item.completed'
                       WHEN 'requeued' THEN 'item.requeued'
                       WHEN 'quarantined' THEN 'item.quarantined'
                       WHEN 'replayed' THEN 'item.replayed'
                       WHEN 'cancelled' THEN 'item.cancelled'
                       WHEN 'triaged' THEN CASE e.data->>'decision'
                                               WHEN 'requeue' THEN 'item.requeued'
                                               WHEN 'quarantine' THEN 'item.quarantined' END
           END AS event
    FROM item_events e
    JOIN work_items i ON i.tenant_id = e.tenant_id AND i.item_id = e.item_id
    WHERE e.tenant_id = %(tenant)s AND e.at >= %(from)s
), missed AS (
    SELECT l.*, delivery_key(w.watcher_id, l.item_id, l.seq) AS delivery_key,
           row_number() OVER (ORDER BY l.at, l.item_id, l.seq) AS pos
    FROM ledger l, w
    WHERE l.event = ANY(w.events) AND (w.queues IS NULL OR (l.item).queue = ANY(w.queues))
      AND NOT EXISTS (SELECT 1 FROM outbox_deliveries o
                      WHERE o.tenant_id = w.tenant_id
                        AND o.delivery_key = delivery_key(w.watcher_id, l.item_id, l.seq))
), written AS (
    INSERT INTO outbox_deliveries (tenant_id, watcher_id, delivery_key, event, item_id, queue,
                                   body, state, next_attempt_at, due_at, created_at, updated_at,
                                   backfilled)
    SELECT %(tenant)s, %(watcher_id)s, m.delivery_key, m.event, m.item_id, (m.item).queue,
           jsonb_build_object('event', m.event, 'occurred_at', api_timestamp(m.at),
                              'item', item_json(m.item)),
           'pending', statement_timestamp(), statement_timestamp(), statement_timestamp(),
           statement_timestamp(), true
    FROM missed m
    WHERE m.pos <= (SELECT n FROM room)
    -- The rows' seq, the order they are sent in, is the ledger's.
    ORDER BY m.pos
    ON CONFLICT (tenant_id, delivery_key) DO NOTHING
    RETURNING delivery_id
), marked AS (
    UPDATE watchers v
    SET backlogged_at = CASE WHEN left_at.at IS NULL THEN NULL ELSE v.backlogged_at END,
        backlog_from = left_at.at, updated_at = statement_timestamp()
    FROM (SELECT (SELECT m.at FROM missed m WHERE m.pos = (SELECT n FROM room) + 1) AS at)
         AS left_at
    WHERE v.tenant_id = %(tenant)s AND v.watcher_id = %(watcher_id)s
    RETURNING v.backlogged_at
)
SELECT (SELECT count(*) FROM written) AS written,
       (SELECT backlogged_at FROM marked) IS NOT NULL AS backlogged;
