"""A minimal HTTP/1.1 keep-alive client on asyncio streams.

The load generator must not be the bottleneck: httpx spends more CPU per
request than the server's routing does, so requests are written as bytes and
responses parsed just enough (status line, Content-Length or chunked body).
Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from typing import Any

import orjson

LOOPBACK = ("127.0.0.1", "::1", "localhost")


class HttpError(RuntimeError):
    """The server answered in a way the load generator cannot parse."""


class HttpConnection:
    """One keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int, auth: str) -> None:
        if host not in LOOPBACK:
            raise ValueError(f"the benchmark talks to loopback addresses only, not {host!r}")
        self.host = host
        self.port = port
        self._prefix = f"Host: {host}:{port}\r\nAuthorization: Bearer {auth}\r\n".encode()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._reader is None or self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        return self._reader, self._writer

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None

    async def request(
        self, method: str, path: str, body: Any = None, *, idempotency_key: str | None = None
    ) -> tuple[int, bytes]:
        reader, writer = await self._open()
        head = bytearray(f"{method} {path} HTTP/1.1\r\n".encode())
        head += self._prefix
        if idempotency_key is not None:
            head += f"Idempotency-Key: {idempotency_key}\r\n".encode()
        payload = b"" if body is None else orjson.dumps(body)
        if body is not None:
            head += b"Content-Type: application/json\r\n"
        head += f"Content-Length: {len(payload)}\r\n\r\n".encode()
        writer.write(bytes(head) + payload)
        try:
            header_block = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            await self.close()
            raise HttpError(f"connection lost during {method} {path}") from exc
        lines = header_block.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = -1
        chunked = False
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            lname = name.strip().lower()
            if lname == b"content-length":
                length = int(value)
            elif lname == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif lname == b"connection" and b"close" in value.lower():
                close = True
        if chunked:
            data = bytearray()
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                data += await reader.readexactly(size + 2)
                del data[-2:]
            content = bytes(data)
        elif length >= 0:
            content = await reader.readexactly(length)
        else:
            raise HttpError(f"{method} {path}: a response without a length")
        if close:
            await self.close()
        return status, content


class KeyMaker:
    """Idempotency keys unique across processes and runs, cheap to make."""

    def __init__(self) -> None:
        self._prefix = os.urandom(8).hex()
        self._counter = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"
