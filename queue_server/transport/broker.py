"""The transport broker: the one owner of outbound HTTP, with leases, byte charging and receipts.

policy check + request construction (free, no receipt)
  -> lease (non-refundable; refused when a budget is exhausted: free, no receipt)
  -> socket to the checked address -> body chunks charged, then a bounded prefix kept
  -> receipt committed (always, whatever happened after the lease)

The decision this implements: docs/decisions/transport-accounting.md; its sixteen
checkable rules, each with the code and the test that hold it: docs/transport.md.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import ssl
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx

from queue_server.transport.accounting import Accountant, Budget
from queue_server.transport.errors import (
    BudgetExhaustedError,
    PolicyRefusedError,
    RequestTimeoutError,
    RunFailedError,
    TransportError,
    TransportFailureError,
    WallDeadlineExceededError,
)
from queue_server.transport.receipts import (
    BrokerSnapshot,
    DispatchReceipt,
    Outcome,
    ReceiptLog,
    Usage,
)
from queue_server.transport.ssrf import (
    AllowList,
    AllowSpec,
    CheckedTarget,
    Resolver,
    check_target_async,
)

_METHOD = re.compile(r"^[A-Z]{1,16}$")
_UNSAFE = re.compile(r"[\r\n\x00]")
# The broker owns framing and the target: a caller may not steer them through headers.
_RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "upgrade",
        "te",
        "trailer",
        "proxy-connection",
        "proxy-authorization",
    }
)


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """One HTTP request to send through the broker."""

    method: str
    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes = b""
    # A short purpose for the receipt, e.g. "webhook"; never the URL.
    label: str = "dispatch"
    # Active-verification dispatches also consume the separate active budget.
    active: bool = False
    # Overrides the broker's request timeout for this dispatch (seconds).
    timeout: float | None = None


@dataclass(frozen=True, slots=True)
class DispatchResult:
    """A dispatch that got a response; 3xx and error statuses are failed outcomes, not raised."""

    status: int
    outcome: Outcome
    headers: tuple[tuple[str, str], ...]
    body: bytes
    body_truncated: bool
    receipt: DispatchReceipt

    @property
    def ok(self) -> bool:
        """Whether the receiver answered 2xx."""
        return self.outcome is Outcome.SUCCEEDED

    def header(self, name: str) -> str | None:
        """The first response header with this name, case-insensitively."""
        wanted = name.lower()
        return next((v for k, v in self.headers if k.lower() == wanted), None)


@dataclass(slots=True)
class _Attempt:
    """Mutable state of one leased dispatch until its receipt is committed."""

    seq: int
    request: DispatchRequest
    target: CheckedTarget
    started_at: datetime
    started: float
    status: int | None = None
    headers_at: float | None = None
    response_bytes: int = 0
    outcome: Outcome | None = None
    error: str | None = None
    receipt: DispatchReceipt | None = None


class TransportBroker:
    """Owns every outbound dispatch of one run: one accountant, one receipt log."""

    def __init__(
        self,
        *,
        budget: Budget | None = None,
        allow: AllowSpec = None,
        request_timeout: float = 10.0,
        wall_deadline: float | None = None,
        max_receipts: int = 256,
        retain_bytes: int = 4096,
        max_body_bytes: int = 64 * 1024,
        resolver: Resolver | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        """Start a run; `wall_deadline` is seconds from now for the whole run."""
        if request_timeout <= 0 or retain_bytes < 0 or max_body_bytes < 1 or max_receipts < 0:
            raise ValueError("timeouts and sizes must be positive")
        self._accountant = Accountant(budget or Budget())
        self._log = ReceiptLog(max_receipts)
        self._allow = allow if isinstance(allow, AllowList) else AllowList.parse(allow or ())
        self._request_timeout = request_timeout
        self._deadline = None if wall_deadline is None else time.monotonic() + wall_deadline
        self._retain = retain_bytes
        self._max_body = max_body_bytes
        self._resolver = resolver
        # Built once per process: loading the CA bundle per run would cost more than the
        # dispatch (a deliverer starts a run per attempt).
        self._ssl = verify if isinstance(verify, ssl.SSLContext) else _ssl_context(verify)

    def usage(self) -> Usage:
        """What the run has consumed so far."""
        return self._accountant.usage()

    def snapshot(self) -> BrokerSnapshot:
        """The committed receipts in lease order, the omitted count and usage."""
        receipts, omitted = self._log.contents()
        return BrokerSnapshot(receipts=receipts, omitted=omitted, usage=self.usage())

    def remaining(self) -> float | None:
        """Seconds left before the wall deadline, or None without one."""
        return None if self._deadline is None else self._deadline - time.monotonic()

    async def check(self, url: str) -> CheckedTarget:
        """Apply the broker's SSRF policy to a URL without dispatching (free, no receipt)."""
        try:
            return await check_target_async(url, self._allow, self._resolver)
        except PolicyRefusedError as exc:
            self._attach(exc)
            raise

    @contextmanager
    def guard(self, *expected: type[Exception]) -> Iterator[None]:
        """Turn an unexpected error of the run into RunFailedError carrying the receipts.

        Transport errors (which carry their receipts already) and the caller's `expected`
        cause-specific errors pass through unchanged.
        """
        try:
            yield
        except TransportError:
            raise
        except expected:
            raise
        except Exception as exc:
            raise RunFailedError(
                f"the run failed after transport work started: {type(exc).__name__}",
                snapshot=self.snapshot(),
            ) from exc

    def dispatch_sync(self, request: DispatchRequest) -> DispatchResult:
        """Blocking facade for threads without a running event loop."""
        return asyncio.run(self.dispatch(request))

    async def dispatch(self, request: DispatchRequest) -> DispatchResult:
        """Check, lease, send once (no redirects, no retries), charge and record the dispatch."""
        self._check_wall()
        target = await self._resolve(request)
        built = self._build(request, target)
        # DNS may have taken a while; a run already past its deadline must not lease.
        self._check_wall()
        try:
            seq = self._accountant.acquire(active=request.active)
        except BudgetExhaustedError as exc:
            raise self._attach(exc) from None
        attempt = _Attempt(
            seq=seq,
            request=request,
            target=target,
            started_at=datetime.now(UTC),
            started=time.monotonic(),
        )
        try:
            return await self._send(built, attempt)
        finally:
            if attempt.outcome is None:
                # An unclassified drop (task cancelled, interpreter exit) still closes the lease.
                attempt.outcome = Outcome.CANCELLED
            self._close(attempt)

    async def _resolve(self, request: DispatchRequest) -> CheckedTarget:
        """Run the policy check under the dispatch's time limit; a timeout here is free."""
        limit, wall_bound = self._limit(request)
        try:
            async with asyncio.timeout(limit):
                return await self.check(request.url)
        except TimeoutError:
            # No lease was taken, so the refusal carries no receipt and costs nothing.
            error: TransportError = (
                WallDeadlineExceededError() if wall_bound else RequestTimeoutError()
            )
            raise self._attach(error) from None

    def _check_wall(self) -> None:
        """Refuse before the lease when the run's wall deadline has passed."""
        left = self.remaining()
        if left is not None and left <= 0:
            raise self._attach(WallDeadlineExceededError())

    def _build(self, request: DispatchRequest, target: CheckedTarget) -> httpx.Request:
        """Construct the pinned request; a malformed one is a free policy refusal."""
        if not _METHOD.match(request.method):
            raise self._attach(PolicyRefusedError(f"method {request.method!r} is not allowed"))
        bad = sorted(k for k in request.headers if k.lower() in _RESERVED_HEADERS)
        if bad:
            raise self._attach(PolicyRefusedError(f"headers {bad} are set by the broker"))
        if any(_UNSAFE.search(k + v) for k, v in request.headers.items()):
            # Caught here, a header injection is a free refusal instead of a charged failure.
            raise self._attach(PolicyRefusedError("header names and values must be one line"))
        headers = {"Accept-Encoding": "identity", "User-Agent": "queue-server-transport"}
        headers.update(request.headers)
        # Connect to the checked address while the receiver still sees the original name.
        headers["Host"] = target.host_header()
        extensions = {"sni_hostname": target.host} if target.scheme == "https" else {}
        try:
            return httpx.Request(
                request.method,
                target.pinned_url(),
                headers=headers,
                content=request.content,
                extensions=extensions,
            )
        except (httpx.InvalidURL, ValueError, TypeError) as exc:
            raise self._attach(PolicyRefusedError("the request could not be built")) from exc

    async def _send(self, request: httpx.Request, attempt: _Attempt) -> DispatchResult:
        """Send once and collect the response, classifying every failure."""
        limit, wall_bound = self._limit(attempt.request)
        try:
            async with asyncio.timeout(limit), self._client(limit) as client:
                response = await client.send(request, stream=True, follow_redirects=False)
                try:
                    attempt.status = response.status_code
                    attempt.headers_at = time.monotonic()
                    body, truncated = await self._collect(response, attempt)
                finally:
                    await response.aclose()
        except BudgetExhaustedError as exc:
            raise self._fail(attempt, Outcome.RESPONSE_BUDGET_EXHAUSTED, exc, exc) from None
        except (TimeoutError, httpx.TimeoutException) as exc:
            if wall_bound:
                error: TransportError = WallDeadlineExceededError()
                raise self._fail(attempt, Outcome.WALL_DEADLINE, error, exc) from exc
            raise self._fail(attempt, Outcome.TIMEOUT, RequestTimeoutError(), exc) from exc
        except (httpx.HTTPError, OSError) as exc:
            error = TransportFailureError()
            raise self._fail(attempt, Outcome.TRANSPORT_ERROR, error, exc) from exc
        attempt.outcome = _classify(response.status_code)
        return DispatchResult(
            status=response.status_code,
            outcome=attempt.outcome,
            headers=tuple(response.headers.multi_items()),
            body=body,
            body_truncated=truncated,
            receipt=self._close(attempt),
        )

    async def _collect(self, response: httpx.Response, attempt: _Attempt) -> tuple[bytes, bool]:
        """Charge each delivered chunk, then keep only a bounded prefix."""
        kept = bytearray()
        async for chunk in response.aiter_raw():
            # Charged before kept: a later timeout or cancel cannot un-deliver these bytes.
            within = self._accountant.charge(len(chunk))
            attempt.response_bytes += len(chunk)
            room = self._retain - len(kept)
            if room > 0:
                kept += chunk[:room]
            if not within:
                raise BudgetExhaustedError(
                    "the response-byte budget is exhausted", resource="response_bytes"
                )
            if attempt.response_bytes >= self._max_body:
                # Collection stops here; unread bytes are not delivered and not charged.
                return bytes(kept), True
        return bytes(kept), False

    def _limit(self, request: DispatchRequest) -> tuple[float, bool]:
        """This dispatch's time limit and whether the wall deadline is what binds it."""
        own = request.timeout if request.timeout is not None else self._request_timeout
        left = self.remaining()
        if left is not None and left < own:
            return max(left, 0.0), True
        return own, False

    def _client(self, limit: float) -> httpx.AsyncClient:
        """A one-dispatch client: no pooling across targets, no proxies, no retries."""
        transport = httpx.AsyncHTTPTransport(
            verify=self._ssl,
            retries=0,
            trust_env=False,
            limits=httpx.Limits(max_connections=1, max_keepalive_connections=0),
        )
        return httpx.AsyncClient(
            transport=transport,
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(limit),
        )

    def _fail(
        self, attempt: _Attempt, outcome: Outcome, error: TransportError, cause: BaseException
    ) -> TransportError:
        """Close the lease with a failed outcome and return the typed error to raise."""
        attempt.outcome = outcome
        attempt.error = type(cause).__name__
        error.receipt = self._close(attempt)
        error.snapshot = self.snapshot()
        return error

    def _close(self, attempt: _Attempt) -> DispatchReceipt:
        """Commit the attempt's receipt exactly once and return it."""
        if attempt.receipt is None:
            attempt.receipt = _receipt(attempt)
            self._log.commit(attempt.receipt)
        return attempt.receipt

    def _attach(self, error: TransportError) -> TransportError:
        """Give an error the committed receipts so a failure cannot erase them."""
        error.snapshot = self.snapshot()
        return error


@functools.cache
def _ssl_context(verify: bool) -> ssl.SSLContext:
    """The TLS context of every run that does not bring its own (shared: it is read-only)."""
    return httpx.create_ssl_context(verify)


def _classify(status: int) -> Outcome:
    """2xx succeeded; a 3xx is never followed and counts as failed, like 4xx and 5xx."""
    if 200 <= status < 300:
        return Outcome.SUCCEEDED
    if 300 <= status < 400:
        return Outcome.REDIRECT_REFUSED
    return Outcome.HTTP_ERROR


def _receipt(attempt: _Attempt) -> DispatchReceipt:
    """Freeze an attempt into its receipt: host and URL hash only, never the path or query."""
    target = attempt.target
    now = time.monotonic()
    return DispatchReceipt(
        seq=attempt.seq,
        label=attempt.request.label,
        active=attempt.request.active,
        method=attempt.request.method,
        scheme=target.scheme,
        host=target.host,
        port=target.port,
        address=target.address,
        url_sha256=hashlib.sha256(str(target.url).encode()).hexdigest(),
        outcome=attempt.outcome or Outcome.CANCELLED,
        status=attempt.status,
        error=attempt.error,
        request_bytes=len(attempt.request.content),
        response_bytes=attempt.response_bytes,
        started_at=attempt.started_at,
        duration_ms=(now - attempt.started) * 1000,
        headers_ms=None
        if attempt.headers_at is None
        else (attempt.headers_at - attempt.started) * 1000,
    )
