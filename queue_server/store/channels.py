"""The notification channels statements notify on, and the LISTEN statements of the notifier."""

from __future__ import annotations

# Payload `tenant/queue`: the queue may have work due (enqueue, requeue, replay, release).
READY_CHANNEL = "queue_server_ready"
# Payload a key id: a key was revoked; every API process drops its cache of keys.
KEYS_CHANNEL = "queue_server_keys"

LISTEN_READY = f"LISTEN {READY_CHANNEL}"
LISTEN_KEYS = f"LISTEN {KEYS_CHANNEL}"
