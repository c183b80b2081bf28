-- The statements of queue_server/store/channels.py, run by name. Each `-- name:`
-- block is loaded at import (queue_server/store/sql/__init__.py); the text here is
-- the text sent.

-- name: listen_ready
LISTEN queue_server_ready;

-- name: listen_keys
LISTEN queue_server_keys;

-- name: listener_probe
-- The notifier's check on a session that has been quiet for a while.
SELECT 1;

-- name: installation_secret
-- What the ready channel's payloads are made with (queue_server.ready_tag): the listener
-- computes the tags of the queues it waits on. Only the tables' owner may read it.
SELECT secret FROM installation_secret;
