"""Request bodies as JSON, read strictly: UTF-8 only (RFC 8259, section 8.1) and every
object's member names unique (section 4 leaves duplicates to the parser).

Python's `json.loads`, FastAPI's parser, reads UTF-16 and UTF-32 bytes as well, and keeps
the last of two members of one name. A proxy, a firewall or an audit log that reads the
same bytes otherwise (the first member, or the body as UTF-8) would see another request
than the one the server acts on; such a body is refused (422 `invalid-request`), as any
other body that is not JSON.

Every API route reads its body through `JsonRoute`; the hot path (api/hot.py) through
`loads`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
from fastapi import Request, Response
from fastapi.routing import APIRoute

# A run of digits this long may be an integer beyond 64 bits, which orjson reads as a
# float where json (and so FastAPI) reads an int that the payload check then refuses.
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_UTF8 = frozenset({"utf-8", "utf8"})


def loads(body: bytes, content_type: str | None = None) -> Any:
    """The body's JSON value, as `json.loads` reads a UTF-8 text (orjson where the two
    agree); `json.JSONDecodeError` for anything else, a charset other than UTF-8 named in
    `content_type`, bytes that are not UTF-8 and an object naming a member twice."""
    charset = _charset(content_type)
    if charset is not None and charset not in _UTF8:
        raise json.JSONDecodeError(f"charset={charset} is refused: JSON is UTF-8", "", 0)
    if _LONG_DIGITS.search(body) is None:
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError:
            pass  # json decides, and says why (NaN, which orjson refuses, is read)
        else:
            if _every_member_kept(body, value):
                return value
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError("the body is not UTF-8", "", exc.start) from None
    return json.loads(text, object_pairs_hook=_unique_members)


def _charset(content_type: str | None) -> str | None:
    if content_type is None:
        return None
    for param in content_type.split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            return value.strip().strip('"').lower()
    return None


def _every_member_kept(body: bytes, value: Any) -> bool:
    """Whether a parse of `body` into `value` kept every object member: a cheap proof that
    no name was repeated, False when it cannot tell (then `_unique_members` decides).

    A colon of a JSON text is either a member's separator or inside a string. Written out
    again, `value` has one separator per member it kept, every raw colon of the strings it
    kept, and each escaped one (`\\u003a`) unescaped. With no member dropped, its colons
    are exactly the body's plus the escaped ones; a dropped member takes its separator
    away, and nothing can add one back: the escapes counted here are at least the real
    ones (a `\\\\u003a` counts though it is no colon, which only makes the sum too high)."""
    escaped = 0
    if b"\\u003" in body:
        escaped = body.count(b"\\u003a") + body.count(b"\\u003A")
    return orjson.dumps(value).count(b":") == body.count(b":") + escaped


def _unique_members(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    members = dict(pairs)
    if len(members) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise json.JSONDecodeError(f"the member name {name!r} is repeated", "", 0)
            seen.add(name)
    return members


class _JsonRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = loads(await self.body(), self.headers.get("content-type"))
        return self._json


class JsonRoute(APIRoute):
    """A route whose JSON body FastAPI gets from `loads`: strict, and read by orjson (a
    batch of 500 items parsed by `json.loads` cost more CPU than anything else its request
    did)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route_handler(request: Request) -> Response:
            return await handler(_JsonRequest(request.scope, request.receive))

        return route_handler
