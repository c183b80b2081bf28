"""SSRF policy: the refusal matrix, the allow-list override, and a canary that sees nothing."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Sequence

import pytest

from queue_server.settings import Settings
from queue_server.transport import (
    AllowList,
    PolicyRefusedError,
    TransportBroker,
    check_target,
    check_target_async,
    refusal_reason,
)
from queue_server.transport.broker import DispatchRequest
from tests.helpers.receiver import Receiver

# Every spelling here reaches the canary on 127.0.0.1 (or the local host) if let through.
LOCAL_SPELLINGS = [
    "127.0.0.1",
    "127.1",
    "2130706433",
    "0x7f.1",
    "0x7f000001",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "017700000001",
    "127.255.255.254",
    "localhost",
    "LOCALHOST.",
    "[::1]",
    "[::ffff:127.0.0.1]",
    "[::ffff:7f00:1]",
    "[0:0:0:0:0:ffff:127.0.0.1]",
    "0.0.0.0",
    "0",
    "[::]",
]

FORBIDDEN_LITERALS = [
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "169.254.169.254",
    "100.64.0.1",
    "192.0.2.10",
    "198.18.0.1",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
    "0x0a000001",
    "[fe80::1]",
    "[fc00::1]",
    "[fd12:3456::1]",
    "[fec0::1]",
    "[ff02::1]",
    "[::ffff:10.0.0.1]",
    "[::ffff:169.254.169.254]",
    "[2002:7f00:1::]",
    "[2002:a00:1::]",
    "[2001:db8::1]",
    "[64:ff9b::a00:1]",
    "192.0.0.8",  # IETF protocol assignments: not globally reachable
    "192.0.0.170",
    "[3fff::1]",  # IPv6 documentation (2024)
]


@pytest.mark.parametrize("host", LOCAL_SPELLINGS)
def test_local_spellings_are_refused_and_the_canary_sees_no_connection(
    canary: Receiver, host: str
) -> None:
    broker = TransportBroker(request_timeout=1.0)
    url = f"http://{host}:{canary.port}/hook?x=1"
    with pytest.raises(PolicyRefusedError) as info:
        asyncio.run(broker.dispatch(DispatchRequest("POST", url, content=b"{}")))
    assert info.value.receipt is None
    assert broker.usage().requests == 0
    assert broker.snapshot().receipts == ()
    assert canary.connections == 0


@pytest.mark.parametrize("host", LOCAL_SPELLINGS)
def test_local_spellings_are_refused_at_registration(host: str) -> None:
    with pytest.raises(PolicyRefusedError):
        check_target(f"http://{host}:8080/hook")


@pytest.mark.parametrize("host", FORBIDDEN_LITERALS)
def test_non_public_addresses_are_refused(host: str) -> None:
    with pytest.raises(PolicyRefusedError):
        check_target(f"https://{host}/hook")


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://8.8.8.8/hook", "8.8.8.8"),
        ("https://[2606:4700::1111]/hook", "2606:4700::1111"),
        ("http://[::ffff:8.8.8.8]/hook", "8.8.8.8"),
        ("http://134744072/hook", "8.8.8.8"),
        ("http://0x08.0x08.0x08.0x08:81/hook", "8.8.8.8"),
        ("http://8.8.8.8:65535/hook", "8.8.8.8"),  # the highest TCP port
    ],
)
def test_public_addresses_pass_and_are_pinned(url: str, address: str) -> None:
    target = check_target(url)
    assert target.address == address


@pytest.mark.parametrize(
    "url",
    [
        "ftp://8.8.8.8/",
        "file:///etc/passwd",
        "http://user:pw@8.8.8.8/",
        "http://0x100.1.1.1/",
        "http://1.2.3.256/",
        "http://1.2.65536/",  # a last part one past what its bytes hold
        "http://127.16777216/",
        "http://4294967296/",
        "http:///nohost",
        "not a url",
        "http://8.8.8.8:0/",
        "http://8.8.8.8:65536/",
        "http://8.8.8.8:99999/",
    ],
)
def test_malformed_or_foreign_urls_are_refused(url: str) -> None:
    with pytest.raises(PolicyRefusedError):
        check_target(url)


def test_a_host_of_five_numbers_is_a_name_and_its_answers_are_checked() -> None:
    async def private(host: str, port: int) -> Sequence[str]:
        return ["10.0.0.1"]

    with pytest.raises(PolicyRefusedError, match="which is private"):
        asyncio.run(check_target_async("http://1.2.3.4.5/", None, private))


@pytest.mark.parametrize(
    ("url", "host"),
    [
        ("http://8.8.8.8/hook", "8.8.8.8"),
        ("https://8.8.8.8/hook", "8.8.8.8"),
        ("https://8.8.8.8:80/hook", "8.8.8.8:80"),
        ("http://8.8.8.8:8443/hook", "8.8.8.8:8443"),
        ("https://[2606:4700::1111]/hook", "[2606:4700::1111]"),
        ("http://[2606:4700::1111]:81/hook", "[2606:4700::1111]:81"),
    ],
)
def test_the_host_header_names_the_port_only_when_it_is_not_the_schemes(
    url: str, host: str
) -> None:
    assert check_target(url).host_header() == host


def test_allow_list_network_overrides_for_odd_spellings(canary: Receiver) -> None:
    for host in ("127.0.0.1", "2130706433", "0x7f.1", "[::ffff:127.0.0.1]"):
        target = check_target(f"http://{host}:{canary.port}/", allow=["127.0.0.1"])
        assert target.address == "127.0.0.1"
    assert check_target("http://10.1.2.3/", allow=["10.0.0.0/8"]).address == "10.1.2.3"
    with pytest.raises(PolicyRefusedError):
        check_target("http://10.1.2.3/", allow=["10.0.0.0/24"])
    assert canary.connections == 0


def test_allow_list_host_name_overrides_its_resolved_address() -> None:
    async def resolver(host: str, port: int) -> Sequence[str]:
        return ["10.0.0.7"]

    allow = AllowList.parse(["Internal.Example.", "192.168.0.0/16"])
    target = asyncio.run(check_target_async("http://internal.example/x", allow, resolver))
    assert target.address == "10.0.0.7"
    with pytest.raises(PolicyRefusedError):
        asyncio.run(check_target_async("http://other.example/x", allow, resolver))


def test_one_forbidden_answer_among_public_ones_refuses_the_name() -> None:
    async def mixed(host: str, port: int) -> Sequence[str]:
        return ["8.8.8.8", "127.0.0.1"]

    with pytest.raises(PolicyRefusedError):
        asyncio.run(check_target_async("http://rebind.example/", None, mixed))


def test_allowed_broker_reaches_receiver_through_an_odd_spelling(canary: Receiver) -> None:
    broker = TransportBroker(allow=["127.0.0.0/8"], request_timeout=2.0)
    result = asyncio.run(broker.dispatch(DispatchRequest("GET", f"http://0x7f.1:{canary.port}/ok")))
    assert result.ok
    assert canary.requests[0].headers["host"] == f"0x7f.1:{canary.port}"


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("127.0.0.1", "loopback"),
        ("::", "unspecified"),
        ("fe80::1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("::ffff:10.0.0.1", "private"),
        ("fec0::1", "site-local"),
        ("100.64.0.1", "non-global"),
        ("192.0.0.8", "non-global"),
        ("192.0.0.9", None),  # the PCP anycast address is global
        ("1.1.1.1", None),
    ],
)
def test_refusal_reason_names_the_category(address: str, reason: str | None) -> None:
    assert refusal_reason(ipaddress.ip_address(address)) == reason


def test_the_allowance_never_opens_the_servers_own_ports() -> None:
    allow = AllowList.parse(["127.0.0.1", "10.0.0.0/8"], closed_ports=[5432, 8080])
    for url in ("http://127.0.0.1:5432/", "http://127.0.0.1:8080/x", "http://10.1.2.3:5432/"):
        with pytest.raises(PolicyRefusedError, match="one of the server's own"):
            check_target(url, allow)
    assert check_target("http://127.0.0.1:9000/", allow).port == 9000
    # A public address is not opened by the allowance: its ports are its own business.
    assert check_target("http://8.8.8.8:5432/", allow).port == 5432


def test_a_host_allowed_by_name_is_not_opened_on_the_servers_own_ports() -> None:
    async def resolver(host: str, port: int) -> Sequence[str]:
        return ["10.0.0.7"]

    allow = AllowList.parse(["internal.example"], closed_ports=[5432])
    with pytest.raises(PolicyRefusedError, match="one of the server's own"):
        asyncio.run(check_target_async("http://internal.example:5432/", allow, resolver))
    target = asyncio.run(check_target_async("http://internal.example:9000/", allow, resolver))
    assert (target.address, target.port) == ("10.0.0.7", 9000)


def test_the_servers_own_ports_are_its_api_and_its_databases() -> None:
    settings = Settings(
        port=9000,
        database_url="postgresql://u:p@db.internal:6543/queue",
        listen_database_url="postgresql://u:p@db.internal:5433/queue",
    )
    assert {9000, 6543, 5433, 5432, 6432} <= settings.own_ports()
