"""queue-server: a durable work-queue and lease server on PostgreSQL."""

__version__ = "0.1.0"
