"""HTTPS to a pinned address: the name still drives SNI and certificate verification."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from queue_server.transport import DispatchRequest, TransportBroker, TransportFailureError
from tests.helpers.receiver import Receiver

NAME = "hooks.example.test"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for NAME only (not for 127.0.0.1)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-nodes", "-days", "1",
            "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-keyout", str(key), "-out", str(cert),
            "-subj", f"/CN={NAME}", "-addext", f"subjectAltName=DNS:{NAME}",
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_receiver(certificate: tuple[Path, Path]) -> Iterator[tuple[Receiver, list[str | None]]]:
    """A receiver speaking TLS that records the SNI name each client sent."""
    cert, key = certificate
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    names: list[str | None] = []
    ctx.sni_callback = lambda _sock, name, _ctx: names.append(name)
    r = Receiver(tls=ctx)
    yield r, names
    r.close()


async def local(host: str, port: int) -> Sequence[str]:
    """Every name resolves to the loopback receiver."""
    return ["127.0.0.1"]


def tls_broker(certificate: tuple[Path, Path]) -> TransportBroker:
    """A broker that trusts the test certificate and may reach 127.0.0.1."""
    client = ssl.create_default_context(cafile=str(certificate[0]))
    return TransportBroker(allow=["127.0.0.1"], resolver=local, verify=client, request_timeout=2)


def test_https_to_the_pinned_address_sends_the_name_as_sni_and_host(
    certificate: tuple[Path, Path], tls_receiver: tuple[Receiver, list[str | None]]
) -> None:
    receiver, names = tls_receiver
    url = f"https://{NAME}:{receiver.port}/ok"
    result = asyncio.run(tls_broker(certificate).dispatch(DispatchRequest("GET", url)))
    assert result.ok
    assert names == [NAME]
    assert receiver.requests[0].headers["host"] == f"{NAME}:{receiver.port}"
    assert (result.receipt.scheme, result.receipt.address) == ("https", "127.0.0.1")


def test_certificate_is_verified_against_the_name_not_the_pinned_address(
    certificate: tuple[Path, Path], tls_receiver: tuple[Receiver, list[str | None]]
) -> None:
    receiver, _ = tls_receiver
    broker = tls_broker(certificate)
    url = f"https://other.example.test:{receiver.port}/ok"
    with pytest.raises(TransportFailureError) as info:
        asyncio.run(broker.dispatch(DispatchRequest("GET", url)))
    assert info.value.receipt is not None
    assert broker.usage().requests == 1
    assert receiver.requests == []
