"""The tests' own HTTP calls (a readiness poll, a scrape, a one-off request) and clients,
on the one TLS context the SDK's clients share.

httpx's module functions (`httpx.get`) make a client per call, and every new client loads
the CA bundle again: about 20 ms of CPU, even for a plain http:// URL. A loop polling a
starting server's /readyz ten times a second spent a fifth of a core on it, competing with
the server it waited for. `tests/test_suite_layout.py` keeps the tests on these.
"""

from __future__ import annotations

from typing import Any

import httpx

from queue_server.client.connection import tls_context


def client(**options: Any) -> httpx.Client:
    """`httpx.Client(**options)` on the shared TLS context."""
    return httpx.Client(verify=tls_context(), **options)


def get(url: str, **options: Any) -> httpx.Response:
    return httpx.get(url, verify=tls_context(), **options)


def post(url: str, **options: Any) -> httpx.Response:
    return httpx.post(url, verify=tls_context(), **options)


def put(url: str, **options: Any) -> httpx.Response:
    return httpx.put(url, verify=tls_context(), **options)
