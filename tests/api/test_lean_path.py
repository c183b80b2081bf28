"""The lease routes' lean path answers exactly what FastAPI's full path answers.

Two servers share one database: the app as built, and the same app without its lean
path (`LeasePath` taken out of its middleware). Each request below, on each lean
route, gets the same status, headers that matter and body from both: a body that is
not JSON or not valid, the wrong content type, a missing or malformed idempotency
key, path parameters outside their patterns, no key, an unknown key, another tenant's
key, a refusal of the endpoint itself. A well-formed request is served and counted
under its route.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from queue_server.api import routes
from queue_server.api.hot import HOT_ENDPOINTS, LeasePath
from queue_server.settings import Settings
from tests.helpers.api import Api, client_for, setup_tenant
from tests.helpers.server import InProcessServer

# Headers as pairs: a request may send one twice.
Case = tuple[str, dict[str, str] | list[tuple[str, str]], bytes]


@pytest.fixture
def plain(settings: Settings, database_url: str) -> Iterator[InProcessServer]:
    """The same app on the same database, every request through FastAPI's full path."""
    server = InProcessServer(settings, database_url)
    kept = [m for m in server.app.user_middleware if getattr(m, "cls", None) is not LeasePath]
    assert len(kept) == len(server.app.user_middleware) - 1
    server.app.user_middleware = kept
    server.start()
    yield server
    server.stop()


def _answer(response: httpx.Response) -> tuple[int, str, dict[str, str], Any]:
    headers = {
        name: response.headers[name]
        for name in ("www-authenticate", "retry-after", "allow")
        if name in response.headers
    }
    content_type = response.headers.get("content-type", "")
    body = response.json() if "json" in content_type else response.text
    return response.status_code, content_type, headers, body


def _cases(api: Api, other: Api) -> Iterator[tuple[str, str, Case]]:
    """(what, route, (path, headers, body)) for each malformed or refused request."""
    item = api.enqueue()
    lease = api.acquire()[0]
    item_id, fence = str(lease["item_id"]), int(str(lease["fence"]))
    assert item_id == item["item_id"]
    t = api.tenant
    worker = f"Bearer {api.keys['worker']}"
    json_type = "application/json"
    routes: dict[str, tuple[str, bytes, bool]] = {
        "acquire": (f"/v1/tenants/{t}/queues/q/leases", b'{"worker": "w1"}', False),
        "heartbeat": (
            f"/v1/tenants/{t}/items/{item_id}/heartbeat",
            b'{"worker": "w1", "fence": %d}' % fence,
            False,
        ),
        "complete": (
            f"/v1/tenants/{t}/items/{item_id}/complete",
            b'{"worker": "w1", "fence": %d, "result": 1}' % (fence + 5),
            True,
        ),
        "heartbeats": (
            f"/v1/tenants/{t}/leases:heartbeat",
            b'{"worker": "w1", "leases": [{"item_id": "%s", "fence": %d}]}'
            % (item_id.encode(), fence + 5),
            False,
        ),
        "completions": (
            f"/v1/tenants/{t}/completions",
            b'{"worker": "w1", "completions": [{"item_id": "%s", "fence": %d}]}'
            % (item_id.encode(), fence + 5),
            True,
        ),
    }
    for route, (path, body, keyed) in routes.items():

        def headers(extra: dict[str, str] | None = None, keyed: bool = keyed) -> dict[str, str]:
            base = {"authorization": worker, "content-type": json_type}
            if keyed:
                base["idempotency-key"] = uuid.uuid4().hex
            return {**base, **(extra or {})}

        yield "not JSON", route, (path, headers(), b'{"worker": ')
        yield "invalid body", route, (path, headers(), b'{"worker": 5, "fence": "x"}')
        yield "extra field", route, (path, headers(), body[:-1] + b', "surprise": 1}')
        yield "empty body", route, (path, headers(), b"")
        yield (
            "an integer past 64 bits",
            route,
            (
                path,
                headers(),
                body[:-1] + b', "result": -9223372036854775809}',  # complete's result: the last
            ),
        )
        yield "text/plain", route, (path, headers({"content-type": "text/plain"}), body)
        yield "no key", route, (path, {"content-type": json_type}, body)
        # Sent twice: FastAPI reads the first of each (an unknown key, a malformed key).
        yield (
            "a second key after an unknown one",
            route,
            (
                path,
                [("authorization", "Bearer qsk_0123456789abcdef_nope"), *headers().items()],
                body,
            ),
        )
        if keyed:
            yield (
                "a second idempotency key after a malformed one",
                route,
                (
                    path,
                    [("idempotency-key", "two words"), *headers().items()],
                    body,
                ),
            )
        yield (
            "unknown key",
            route,
            (
                path,
                headers({"authorization": "Bearer qsk_0123456789abcdef_nope"}),
                body,
            ),
        )
        yield (
            "another tenant's key",
            route,
            (
                path,
                headers({"authorization": f"Bearer {other.keys['worker']}"}),
                body,
            ),
        )
        yield (
            "tenant outside its pattern",
            route,
            (
                path.replace(f"/tenants/{t}/", "/tenants/Not%20A%20Name/"),
                headers(),
                body,
            ),
        )
        if "/queues/q/" in path:
            yield (
                "queue outside its pattern",
                route,
                (
                    path.replace("/queues/q/", "/queues/no%20such%20queue!/"),
                    headers(),
                    body,
                ),
            )
        if item_id in path:
            yield "item id too long", route, (path.replace(item_id, "x" * 65), headers(), body)
        if keyed:
            no_key = headers()
            del no_key["idempotency-key"]
            yield "no idempotency key", route, (path, no_key, body)
            yield (
                "malformed idempotency key",
                route,
                (
                    path,
                    headers({"idempotency-key": "two words"}),
                    body,
                ),
            )
        # Well-formed, refused by the endpoint: a fence ahead of the item's, a lease TTL
        # above the policy's attempt timeout. A batch answers 200 with the entry's problem.
        refused = re.sub(rb'"fence": \d+', b'"fence": %d' % (fence + 5), body)
        refused = refused.replace(b'{"worker": "w1"}', b'{"worker": "w1", "lease_ttl": 999999}')
        sent = headers()
        if keyed:
            sent["idempotency-key"] = "k1"  # the same key on each server, first use on each
        yield "refused by the endpoint", route, (path, sent, refused)


def test_every_malformed_or_refused_lease_request_gets_the_full_paths_answer(
    server: InProcessServer, plain: InProcessServer, admin: httpx.Client
) -> None:
    api = setup_tenant(server.url, admin, "acme")
    other = setup_tenant(server.url, admin, "globex")
    differences = []
    seen = 0
    for what, route, (path, headers, body) in _cases(api, other):
        answers = []
        for url in (server.url, plain.url):
            pairs = list(headers.items()) if isinstance(headers, dict) else headers
            sent = [
                # The first use of the same key on each server: a key of its own on each.
                (
                    name,
                    f"{route}-{url[7:]}" if (name, value) == ("idempotency-key", "k1") else value,
                )
                for name, value in pairs
            ]
            with client_for(url, None) as client:
                answers.append(_answer(client.post(path, content=body, headers=sent)))
        lean, full = answers
        seen += 1
        if lean != full:
            differences.append((what, route, lean, full))
    assert seen >= 65
    assert differences == []


def test_a_well_formed_lease_request_is_served_and_counted_under_its_route(
    api: Api, server: InProcessServer, admin: httpx.Client
) -> None:
    item = api.enqueue()
    lease = api.acquire(max_items=1)[0]
    assert lease["item_id"] == item["item_id"]
    done = api.holder("complete", lease["item_id"], worker="w1", fence=lease["fence"], result=7)
    assert done.status_code == 200, done.text
    assert done.json()["state"] == "completed"
    assert done.json()["result"] == 7
    metrics = admin.get("/metrics").text
    for template in (
        "/v1/tenants/{tenant}/queues/{queue}/leases",
        "/v1/tenants/{tenant}/items/{item_id}/complete",
    ):
        assert f'method="POST",route="{template}",status="200"' in metrics, template


def test_the_routes_on_the_lean_path_say_so_and_no_other_route_does() -> None:
    """A reader of a route learns from the route itself that a second way in serves it."""
    text = Path(routes.__file__).read_text()
    marked = re.findall(
        r"# Served on the lean path as well[^\n]*\n@router\.\w+\([^@]*?\)\nasync def (\w+)\(", text
    )
    assert sorted(marked) == sorted(endpoint.__name__ for endpoint, _, _ in HOT_ENDPOINTS)
