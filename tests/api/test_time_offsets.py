"""An instant whose time-zone offset PostgreSQL cannot read (beyond 15:59 either way, which
ISO 8601 and pydantic allow up to 23:59) is a 422 naming the field, on every route that
takes one in its query or body; offsets up to 15:59 are read as the instants they name."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest

from tests.helpers.api import Api
from tests.helpers.items import quarantine

# Beyond what PostgreSQL reads; each was a 500 where it reached SQL.
TOO_WIDE = ("+20:00", "-16:00", "+16:00", "+23:59")
# The widest PostgreSQL reads: accepted.
WIDEST = ("+15:59", "-15:59")


def _key() -> dict[str, str]:
    return {"Idempotency-Key": uuid.uuid4().hex}


def _at(offset: str, moment: datetime | None = None) -> str:
    """`moment` (default: 2026-01-01 UTC) written in the zone `offset`."""
    sign = -1 if offset[0] == "-" else 1
    hours, minutes = (int(part) for part in offset[1:].split(":"))
    zone = timezone(sign * timedelta(hours=hours, minutes=minutes))
    moment = moment or datetime(2026, 1, 1, tzinfo=UTC)
    return moment.astimezone(zone).isoformat()


# Each route that takes an instant: (its field's location as the problem names it, a call).
Call = Callable[[Api, str], httpx.Response]
ROUTES: dict[str, tuple[str, Call]] = {
    "GET items created_after": (
        "query.created_after",
        lambda api, at: api.operator.get("/v1/tenants/acme/items", params={"created_after": at}),
    ),
    "GET items created_before": (
        "query.created_before",
        lambda api, at: api.operator.get("/v1/tenants/acme/items", params={"created_before": at}),
    ),
    "POST items:cancel": (
        "body.filter.created_after",
        lambda api, at: api.operator.post(
            "/v1/tenants/acme/items:cancel", json={"filter": {"created_after": at}}, headers=_key()
        ),
    ),
    "POST items:retry": (
        "body.filter.created_before",
        lambda api, at: api.operator.post(
            "/v1/tenants/acme/items:retry",
            json={"filter": {"state": "quarantined", "created_before": at}},
            headers=_key(),
        ),
    ),
    "POST items:delete": (
        "body.filter.created_after",
        lambda api, at: api.operator.post(
            "/v1/tenants/acme/items:delete",
            json={"filter": {"state": "completed", "created_after": at}},
            headers=_key(),
        ),
    ),
    "POST spend-approvals": (
        "body.expires_at",
        lambda api, at: api.operator.post(
            "/v1/tenants/acme/queues/q/spend-approvals",
            json={"max_concurrency": 3, "expires_at": at, "reason": "launch week"},
            headers=_key(),
        ),
    ),
}


@pytest.mark.parametrize("route", ROUTES)
def test_an_offset_postgres_cannot_read_is_a_422_naming_the_field(api: Api, route: str) -> None:
    field, call = ROUTES[route]
    week = datetime.now(UTC) + timedelta(days=7)  # a valid expiry for spend-approvals
    for offset in TOO_WIDE:
        response = call(api, _at(offset, week))
        assert response.status_code == 422, (offset, response.text)
        assert response.headers["Content-Type"] == "application/problem+json"
        problem = response.json()
        assert problem["code"] == "invalid-request"
        assert field in problem["detail"], problem
        (error,) = problem["errors"]
        assert "15:59" in error["msg"], error
    for offset in WIDEST:
        response = call(api, _at(offset, week))
        assert response.status_code in (200, 201), (offset, response.text)
    # The server answers as before on the same connection.
    assert api.operator.get("/v1/tenants/acme/items").status_code == 200


def test_an_instant_at_the_widest_offsets_filters_as_the_instant_it_names(api: Api) -> None:
    before = api.enqueue("q", "before")
    cut = datetime.fromisoformat(str(before["created_at"]))
    after = api.enqueue("q", "after")
    for offset in WIDEST:
        page = api.operator.get(
            "/v1/tenants/acme/items", params={"created_after": _at(offset, cut)}
        ).json()
        assert [i["item_id"] for i in page["items"]] == [after["item_id"]], offset
    quarantine(api, "poisoned")
    answer = api.operator.post(
        "/v1/tenants/acme/items:retry",
        json={"filter": {"state": "quarantined", "created_after": _at("-15:59", cut)}},
        headers=_key(),
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["retried"] == 1
