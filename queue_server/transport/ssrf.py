"""SSRF policy: which targets the broker may reach, checked before any lease or socket.

A target is resolved once; every address must be public or explicitly allowed, and
the broker connects to the checked address (the Host header and SNI keep the name),
so a DNS answer that changes after the check cannot redirect the connection.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import httpx

from queue_server.transport.errors import PolicyRefusedError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# Resolves (host, port) to address strings; injectable so tests can script DNS answers.
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

_SCHEMES = {"http": 80, "https": 443}
# inet_aton accepts 1 to 4 parts, each decimal, octal (leading 0) or hex (0x).
_LOOSE_PART = re.compile(r"^(0[xX][0-9a-fA-F]*|0[0-7]*|[1-9][0-9]*)$")


@dataclass(frozen=True, slots=True)
class AllowList:
    """Named hosts and networks that override the address checks (e.g. 127.0.0.1 in tests)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()
    # Ports an allowed host or network is never reached on: the server's own (its API, its
    # database), which the allowance would otherwise open to every watcher URL.
    closed_ports: frozenset[int] = frozenset()

    @classmethod
    def parse(cls, entries: Iterable[str], closed_ports: Iterable[int] = ()) -> AllowList:
        """Build from settings strings: a CIDR network, an IP address or a host name."""
        hosts: set[str] = set()
        networks: list[IPNetwork] = []
        for raw in entries:
            entry = raw.strip()
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
            except ValueError:
                hosts.add(_normalise_name(entry))
        return cls(frozenset(hosts), tuple(networks), frozenset(closed_ports))

    def allows_host(self, host: str) -> bool:
        """Whether the name itself was allowed."""
        return _normalise_name(host) in self.hosts

    def allows_address(self, addr: IPAddress) -> bool:
        """Whether the address (or the IPv4 address it maps) is in an allowed network."""
        candidates = [addr]
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            candidates.append(addr.ipv4_mapped)
        return any(
            c in net for c in candidates for net in self.networks if c.version == net.version
        )


AllowSpec = AllowList | Iterable[str] | None


@dataclass(frozen=True, slots=True)
class CheckedTarget:
    """A URL that passed the policy, with the address the connection must go to."""

    url: httpx.URL
    scheme: str
    host: str
    port: int
    address: str

    def pinned_url(self) -> httpx.URL:
        """The URL with its host replaced by the checked address."""
        return self.url.copy_with(host=self.address)

    def host_header(self) -> str:
        """The Host header the original URL would have sent."""
        default = _SCHEMES[self.scheme]
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"


def check_target(url: str | httpx.URL, allow: AllowSpec = None) -> CheckedTarget:
    """Check a URL at registration or dispatch time, resolving its host synchronously."""
    parsed, scheme, host, port = _parse(url)
    allow_list = _allow_list(allow)
    literal = _literal_address(host)
    if literal is not None:
        addresses: Sequence[str] = [str(literal)]
    else:
        addresses = _resolve_sync(host, port)
    return _decide(parsed, scheme, host, port, addresses, allow_list)


async def check_target_async(
    url: str | httpx.URL, allow: AllowSpec = None, resolver: Resolver | None = None
) -> CheckedTarget:
    """Check a URL without blocking the event loop; the resolver defaults to getaddrinfo."""
    parsed, scheme, host, port = _parse(url)
    allow_list = _allow_list(allow)
    literal = _literal_address(host)
    if literal is not None:
        addresses: Sequence[str] = [str(literal)]
    else:
        addresses = await (resolver or default_resolver)(host, port)
    return _decide(parsed, scheme, host, port, addresses, allow_list)


async def default_resolver(host: str, port: int) -> Sequence[str]:
    """Resolve with the system resolver in the loop's executor."""
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise PolicyRefusedError(f"cannot resolve host {host!r}") from exc
    return [str(info[4][0]) for info in infos]


# IANA special-purpose blocks that are not globally reachable and that this Python's
# `ipaddress` still calls global (its tables predate them): 192.0.0.0/24 but for the two
# anycast addresses in it, and IPv6's documentation block of 2024.
_NOT_GLOBAL = tuple(ipaddress.ip_network(n) for n in ("192.0.0.0/24", "3fff::/20"))
_GLOBAL_EXCEPTIONS = frozenset(ipaddress.ip_address(a) for a in ("192.0.0.9", "192.0.0.10"))


def _globally_reachable(addr: IPAddress) -> bool:
    if addr in _GLOBAL_EXCEPTIONS:
        return True
    listed = any(addr in net for net in _NOT_GLOBAL if net.version == addr.version)
    return addr.is_global and not listed


def refusal_reason(addr: IPAddress) -> str | None:
    """Why an address may not be reached by default, or None when it is public."""
    if isinstance(addr, ipaddress.IPv6Address):
        embedded = addr.ipv4_mapped or addr.sixtofour
        if embedded is not None:
            # A mapped or 6to4 address reaches the IPv4 host it embeds.
            reason = refusal_reason(embedded)
            if reason is not None or addr.ipv4_mapped is not None:
                return reason
        if addr.is_site_local:
            return "site-local"
    checks = (
        ("unspecified", addr.is_unspecified),
        ("loopback", addr.is_loopback),
        ("link-local", addr.is_link_local),
        ("multicast", addr.is_multicast),
        ("private", addr.is_private),
        ("reserved", addr.is_reserved),
        ("non-global", not _globally_reachable(addr)),
    )
    return next((name for name, hit in checks if hit), None)


def _parse(url: str | httpx.URL) -> tuple[httpx.URL, str, str, int]:
    """Parse and check the URL's shape: scheme, host, no credentials."""
    try:
        parsed = url if isinstance(url, httpx.URL) else httpx.URL(url)
        # `host` decodes IDNA: a malformed A-label ("xn--") raises here, not above.
        host = parsed.host.lower().rstrip(".")
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise PolicyRefusedError("the URL is not valid") from exc
    scheme = parsed.scheme
    if scheme not in _SCHEMES:
        raise PolicyRefusedError(f"scheme {scheme!r} is not allowed; use http or https")
    if parsed.userinfo:
        # Credentials in a URL are a classic parser-confusion vector and would leak into logs.
        raise PolicyRefusedError("URLs with credentials are not allowed")
    if not host:
        raise PolicyRefusedError("the URL has no host")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise PolicyRefusedError(f"port {parsed.port} is not a TCP port (1 to 65535)")
    return parsed, scheme, host, parsed.port or _SCHEMES[scheme]


def _allow_list(allow: AllowSpec) -> AllowList:
    """Accept a ready AllowList or raw settings strings."""
    if isinstance(allow, AllowList):
        return allow
    return AllowList.parse(allow or ())


def _literal_address(host: str) -> IPAddress | None:
    """The address a literal host denotes, including inet_aton spellings (2130706433, 0x7f.1)."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        pass
    parts = host.split(".")
    if not 1 <= len(parts) <= 4 or not all(_LOOSE_PART.match(p) for p in parts):
        return None
    values = [_loose_int(p) for p in parts]
    # The last part fills all remaining bytes, as inet_aton does.
    head, last = values[:-1], values[-1]
    if any(v > 255 for v in head) or last >= 256 ** (4 - len(head)):
        raise PolicyRefusedError(f"host {host!r} is a malformed IPv4 address")
    number = last
    for i, v in enumerate(head):
        number += v << (8 * (3 - i))
    return ipaddress.IPv4Address(number)


def _loose_int(part: str) -> int:
    """One inet_aton component."""
    if part[:2].lower() == "0x":
        return int(part[2:] or "0", 16)
    if len(part) > 1 and part.startswith("0"):
        return int(part, 8)
    return int(part)


def _resolve_sync(host: str, port: int) -> Sequence[str]:
    """Resolve with the blocking system resolver."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise PolicyRefusedError(f"cannot resolve host {host!r}") from exc
    return [str(info[4][0]) for info in infos]


def _decide(
    url: httpx.URL,
    scheme: str,
    host: str,
    port: int,
    addresses: Sequence[str],
    allow: AllowList,
) -> CheckedTarget:
    """Refuse unless every resolved address may be reached; pin the first one."""
    parsed = [_address(a) for a in addresses]
    if not parsed:
        raise PolicyRefusedError(f"host {host!r} resolved to no address")
    allowed = allow.allows_host(host)
    for addr in parsed:
        reason = refusal_reason(addr)
        if reason is None:
            continue
        # One forbidden answer refuses the whole name, so mixed answers cannot slip through.
        if not allowed and not allow.allows_address(addr):
            raise PolicyRefusedError(f"host {host!r} resolves to {addr}, which is {reason}")
        if port in allow.closed_ports:
            raise PolicyRefusedError(
                f"port {port} of {host!r} is one of the server's own (its API or its database):"
                " the transport allowance does not open it"
            )
    first = parsed[0]
    # Connect to a mapped address over IPv4: it is the same host, and v4-only hosts exist.
    pinned = first.ipv4_mapped if isinstance(first, ipaddress.IPv6Address) else None
    return CheckedTarget(url=url, scheme=scheme, host=host, port=port, address=str(pinned or first))


def _address(text: str) -> IPAddress:
    """Parse a resolver answer, dropping an IPv6 zone id."""
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError as exc:
        raise PolicyRefusedError("the resolver returned an invalid address") from exc


def _normalise_name(name: str) -> str:
    """Lowercase and drop a trailing dot and IPv6 brackets."""
    return name.strip().strip("[]").lower().rstrip(".")
