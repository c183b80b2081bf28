"""The notification channels statements notify on, and the LISTEN statements of the notifier."""

from __future__ import annotations

from queue_server.store.sql import load

_SQL = load("channels")

# Payload `tenant/queue`: the queue may have work due (enqueue, requeue, replay, release).
READY_CHANNEL = "queue_server_ready"
# Payload a key id: a key was revoked; every API process drops its cache of keys.
KEYS_CHANNEL = "queue_server_keys"

LISTEN_READY = _SQL["listen_ready"]
LISTEN_KEYS = _SQL["listen_keys"]

LISTENER_PROBE = _SQL["listener_probe"]
