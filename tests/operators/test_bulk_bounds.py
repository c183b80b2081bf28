"""A bulk action's page is checked by the service, whoever calls it: the REST bodies are
checked by their schemas first, but the console calls the services directly, so the
services hold the bounds themselves, before the database is reached (these services have
none to reach)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from queue_server import errors
from queue_server.app import create_app
from queue_server.auth import Principal
from queue_server.idempotency import Idempotency
from queue_server.models import Role
from queue_server.services.items import BulkPage, ItemFilter, Items
from queue_server.settings import Settings

OPERATOR = Principal("k1", "acme", Role.OPERATOR)
KEY = Idempotency(key="bulk-1", fingerprint="f", caller="k1")


@pytest.fixture(scope="module")
def items(tmp_path_factory: pytest.TempPathFactory) -> Items:
    data = tmp_path_factory.mktemp("bulk")
    app = create_app(Settings(data_dir=Path(data)), "postgresql://nobody@127.0.0.1:1/none")
    service: Items = app.state.services.items
    return service


def _refusal(items: Items, action: str, state: str | None, limit: int) -> str | None:
    """What `action` says of a page of `state` items, `limit` long: the refusal's detail,
    or None when the page got past the checks (and on to the database, which is not
    there)."""
    page = BulkPage("/v1/tenants/acme/items:x", ItemFilter(state=state), limit)
    extra: dict[str, Any] = {"reason": "why"} if action == "cancel_many" else {}
    try:
        asyncio.run(getattr(items, action)(OPERATOR, "acme", KEY, page, **extra))
    except errors.InvalidRequestError as exc:
        return str(exc.detail)
    except errors.QueueServerError:
        return None  # past the checks: the database is away
    raise AssertionError("a page was acted on with no database")


@pytest.mark.parametrize(
    ("action", "state", "refused"),
    [
        ("retry_many", "ready", "Only quarantined or cancelled items can be retried"),
        ("retry_many", "completed", "Only quarantined or cancelled items can be retried"),
        ("delete_many", "quarantined", "Only completed or cancelled items can be deleted"),
        ("delete_many", None, "Only completed or cancelled items can be deleted"),
        ("cancel_many", "completed", "completed items cannot be cancelled"),
    ],
)
def test_a_bulk_action_refuses_a_state_it_does_not_act_on(
    items: Items, action: str, state: str | None, refused: str
) -> None:
    detail = _refusal(items, action, state, 100)
    assert detail is not None
    assert detail.startswith(refused)


@pytest.mark.parametrize("action", ["retry_many", "delete_many", "cancel_many"])
@pytest.mark.parametrize("limit", [0, 1001])
def test_a_bulk_page_holds_1_to_1000_items(items: Items, action: str, limit: int) -> None:
    state = {"retry_many": "quarantined", "delete_many": "completed"}.get(action)
    assert _refusal(items, action, state, limit) == "limit must be 1 to 1000."


@pytest.mark.parametrize(
    ("action", "state"),
    [
        ("retry_many", "quarantined"),
        ("retry_many", "cancelled"),
        ("delete_many", "completed"),
        ("delete_many", "cancelled"),
        ("cancel_many", "ready"),
        ("cancel_many", None),
    ],
)
@pytest.mark.parametrize("limit", [1, 1000])
def test_a_page_within_the_bounds_goes_on_to_the_database(
    items: Items, action: str, state: str | None, limit: int
) -> None:
    assert _refusal(items, action, state, limit) is None
