"""The console's spend page: an approval about to expire is said above the table, and an
operator sets a queue's concurrency there, live, below the approved limit."""

from __future__ import annotations

import html

from tests.helpers.api import Api
from tests.helpers.console import CSRF, KEY, form_value, sign_in

CONCURRENCY = "/v1/tenants/acme/queues/q/concurrency"


def test_an_expiring_approval_is_warned_of_and_the_concurrency_is_set_from_the_page(
    api: Api,
) -> None:
    api.enqueue()
    api.approve("q", 4, days=1 / 24)  # an hour: within the server's warning window
    client, _ = sign_in(api.url, api.keys["operator"])
    page = html.unescape(client.get("/console/tenants/acme/spend").text)
    assert "The spend approval raising q's limit to 4 expires at" in page
    assert "expires soon" in page

    def post(concurrency: str) -> str:
        page = client.get("/console/tenants/acme/spend").text
        answer = client.post(
            "/console/tenants/acme/spend/concurrency",
            data={
                "csrf": form_value(page, CSRF),
                "idempotency_key": form_value(page, KEY),
                "queue": "q",
                "concurrency": concurrency,
                "reason": "throttled",
            },
            follow_redirects=True,
        )
        assert answer.status_code == 200, answer.text
        return html.unescape(answer.text)

    assert "q now leases at most 2 at a time." in post("2")
    assert api.worker.get(CONCURRENCY).json()["concurrency"] == 2
    # Above the approved limit: the page says why, nothing changes.
    refused = post("9")
    assert "above the queue's approved limit, 4" in refused, refused[refused.find("<main") :][:1500]
    assert api.worker.get(CONCURRENCY).json()["limit"] == 2
    # Empty: the approved limit again.
    assert "q now leases at most 4 at a time." in post("")
    assert api.worker.get(CONCURRENCY).json()["concurrency"] is None


def test_an_approval_far_from_expiry_shows_no_warning(api: Api) -> None:
    api.enqueue()
    api.approve("q", 4, days=30)
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/spend").text
    assert "expires soon" not in page
    assert "raising q&#39;s limit" not in page
    assert "raising q's limit" not in page
