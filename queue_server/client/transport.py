"""The SDK's one transport: the only SDK module that opens connections, and only to the
queue server's own API at the client's base URL.

The clients (`QueueClient`, `AsyncQueueClient`) get their connection pool from
`connect` / `connect_async` and name the HTTP library's types through this module;
no other module of the SDK imports it. Outbound HTTP to anything else (webhooks,
dependencies) goes through the transport broker, `queue_server.transport`.
"""

from __future__ import annotations

import functools
import ssl

import httpx

#: A response of the queue server.
Response = httpx.Response
#: A connection pool to the queue server (the caller may pass one of their own).
HttpClient = httpx.Client
AsyncHttpClient = httpx.AsyncClient
#: The queue server could not be reached, or the connection failed mid-request.
TransportFailure = httpx.TransportError


def connect(url: str, *, timeout: float) -> HttpClient:
    """A connection pool to the queue server whose base URL is `url`."""
    return httpx.Client(base_url=url, timeout=timeout, verify=tls_context())


def connect_async(url: str, *, timeout: float) -> AsyncHttpClient:
    """The asyncio connection pool to the queue server whose base URL is `url`."""
    return httpx.AsyncClient(base_url=url, timeout=timeout, verify=tls_context())


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The verifying TLS context every client of this process shares (it is read-only).

    httpx would otherwise load the CA bundle for each new client (about 20 ms each); the
    environment's SSL_CERT_FILE and SSL_CERT_DIR are honoured as httpx's default does.
    """
    return httpx.create_ssl_context(trust_env=True)
