"""The client distribution's version: `queue-server-client` in its metadata and User-Agent."""

__version__ = "0.1.0"
