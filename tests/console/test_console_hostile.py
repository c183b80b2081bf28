"""Hostile form input in the console gets a page that says what is wrong, never a 500."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest

from queue_server.cli.common import CommandError
from queue_server.cli.spend import parse_expiry
from tests.helpers.api import Api, setup_tenant
from tests.helpers.console import CSRF, KEY, form_value, sign_in
from tests.helpers.items import quarantine


@pytest.mark.parametrize("digits", ["\u00b2", "\u0663"])
def test_non_ascii_digits_in_the_spend_form_are_refused_not_a_500(api: Api, digits: str) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/spend").text
    answer = client.post(
        "/console/tenants/acme/spend",
        data={
            "csrf": form_value(page, CSRF),
            "idempotency_key": form_value(page, KEY),
            "queue": "q",
            "max_concurrency": digits,
            "expires_at": "2999-01-01T00:00",
            "approved_by": "ops@example.com",
            "reason": "r",
        },
    )
    assert 400 <= answer.status_code < 500, answer.text
    assert api.operator.get("/v1/tenants/acme/queues/q/concurrency").json()["limit"] == 1


def test_non_ascii_digits_in_a_cli_expiry_are_a_clear_error() -> None:
    with pytest.raises(CommandError):
        parse_expiry("\u00b2h")


def _spend_form(page: str, **fields: str) -> dict[str, str]:
    return {
        "csrf": form_value(page, CSRF),
        "idempotency_key": form_value(page, KEY),
        "queue": "q",
        "max_concurrency": "2",
        "expires_at": "2999-01-01T00:00",
        "reason": "r",
        **fields,
    }


def test_a_number_too_long_for_python_in_the_spend_form_is_a_422_page(api: Api) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/spend").text
    answer = client.post(
        "/console/tenants/acme/spend", data=_spend_form(page, max_concurrency="9" * 4301)
    )
    assert answer.status_code == 422, answer.text
    assert api.operator.get("/v1/tenants/acme/queues/q/concurrency").json()["limit"] == 1


def test_a_form_that_is_not_utf8_is_refused_not_stored_with_replacement_characters(
    api: Api,
) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/spend").text
    body = urlencode(_spend_form(page, reason="PLACEHOLDER")).replace("PLACEHOLDER", "bad%FF%FE")
    answer = client.post(
        "/console/tenants/acme/spend",
        content=body,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert answer.status_code == 400, answer.text
    approvals = api.operator.get("/v1/tenants/acme/queues/q/spend-approvals").json()
    assert "\ufffd" not in str(approvals)
    assert api.operator.get("/v1/tenants/acme/queues/q/concurrency").json()["limit"] == 1


def test_the_pause_confirmation_of_another_tenants_queue_is_a_404_page(api: Api) -> None:
    setup_tenant(api.url, api.admin, "globex")
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/queues").text
    answer = client.post(
        "/console/tenants/globex/queues/q/pause/confirm", data={"csrf": form_value(page, CSRF)}
    )
    assert answer.status_code == 404, answer.text
    assert "globex" not in answer.text.replace("/console/tenants/globex", "")


def test_an_offset_postgres_cannot_read_is_said_on_the_items_and_spend_pages(api: Api) -> None:
    """Beyond 15:59 from UTC (ISO 8601 allows 23:59): the page's own 422, never a 500."""
    quarantine(api)
    client, _ = sign_in(api.url, api.keys["operator"])
    wide = "2026-01-01T00:00:00+20:00"
    page = client.get(
        "/console/tenants/acme/items", params={"state": "quarantined", "created_after": wide}
    )
    assert page.status_code == 422, page.text
    (alert,) = re.findall(r'<p class="flash error" role="alert">([^<]*)</p>', page.text)
    assert alert.startswith("Created after must have a time-zone offset between -15:59 and +15:59.")
    assert "<h1>Items</h1>" in page.text
    widest = client.get(
        "/console/tenants/acme/items",
        params={"state": "quarantined", "created_after": "2000-01-01T00:00:00+15:59"},
    )
    assert widest.status_code == 200, widest.text
    # The retry-all form of a page that filtered, posted with the offset typed in.
    confirm = client.post(
        "/console/tenants/acme/items/bulk/confirm",
        data={
            "csrf": form_value(widest.text, CSRF),
            "action": "retry",
            "state": "quarantined",
            "created_before": "2999-01-01T00:00:00-16:00",
        },
    )
    assert confirm.status_code == 422, confirm.text
    assert "Created before must have a time-zone offset" in confirm.text
    spend = client.get("/console/tenants/acme/spend").text
    expires = (datetime.now(UTC) + timedelta(days=7)).strftime("%Y-%m-%dT%H:%M+20:00")
    answer = client.post("/console/tenants/acme/spend", data=_spend_form(spend, expires_at=expires))
    assert answer.status_code == 422, answer.text
    assert "expires_at" in answer.text
    assert api.operator.get("/v1/tenants/acme/queues/q/concurrency").json()["limit"] == 1
