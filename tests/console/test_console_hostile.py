"""Hostile form input in the console gets a page that says what is wrong, never a 500."""

from __future__ import annotations

import pytest

from queue_server.cli.common import CommandError
from queue_server.cli.spend import parse_expiry
from tests.helpers.api import Api
from tests.helpers.console import CSRF, KEY, form_value, sign_in


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
