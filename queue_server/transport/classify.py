"""Which transport failures are timeouts and which are other transport errors.

Lives here because only this package (and the SDK) may know the HTTP client's types.
"""

from __future__ import annotations

from typing import Literal

import httpx

from queue_server.transport.errors import RequestTimeoutError, TransportFailureError


def transport_failure_kind(exc: BaseException) -> Literal["timeout", "transport"] | None:
    """`timeout` for request timeouts, `transport` for other connection-level failures."""
    if isinstance(exc, RequestTimeoutError | httpx.TimeoutException | TimeoutError):
        return "timeout"
    if isinstance(exc, TransportFailureError | httpx.TransportError | ConnectionError):
        return "transport"
    return None
