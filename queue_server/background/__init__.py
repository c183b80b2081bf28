"""The server's background loops, each run by `serve` beside the API: the webhook deliverer,
the LISTEN notifier that wakes waiting acquires, the sweeper (samples, retention, counter folds)
and the scheduler. (The SDK's worker, which leases items, is `queue_server.client.worker`.)"""
