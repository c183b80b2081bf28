"""The console's queue settings page: each effective value with its source, and the form that
sets them through the same service as `PUT .../queues/{q}/settings` (refusals included)."""

from __future__ import annotations

import re
import uuid

from tests.helpers.api import Api
from tests.helpers.console import CSRF, KEY, form_value, sign_in
from tests.helpers.items import put_settings

PAGE = "/console/tenants/acme/queues/reports/settings"


def test_the_settings_page_shows_sources_and_saves_what_the_form_sets(api: Api) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    try:
        page = client.get(PAGE)
        assert page.status_code == 200, page.text
        assert "now 900.0 (policy)" in page.text  # the deadline
        assert "now 1.0 (default)" in page.text  # the backoff's first delay
        form = {
            "csrf": form_value(page.text, CSRF),
            "idempotency_key": form_value(page.text, KEY),
            "deadline": "600",
            "max_acquisitions": "4",
            "retry_cap": "",
            "retry_jitter": "on",
        }
        saved = client.post(PAGE, data=form, follow_redirects=True)
        assert saved.status_code == 200, saved.text
        assert "Saved the settings of reports" in saved.text
        assert "now 600.0 (queue)" in saved.text
    finally:
        client.close()
    shown = api.worker.get("/v1/tenants/acme/queues/reports/settings").json()
    assert shown["deadline"] == {"value": 600.0, "source": "queue"}
    assert shown["max_acquisitions"] == {"value": 4, "source": "queue"}
    assert shown["retry"]["jitter"] == {"value": True, "source": "queue"}
    assert shown["retry"]["cap"]["source"] == "policy"
    # The overview links each queue to its settings.
    api.enqueue("reports")
    again, _ = sign_in(api.url, api.keys["operator"])
    try:
        assert PAGE in again.get("/console/tenants/acme/queues").text
    finally:
        again.close()


def test_a_value_above_the_envelope_is_refused_naming_the_cell(api: Api) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    try:
        page = client.get(PAGE)
        form = {
            "csrf": form_value(page.text, CSRF),
            "idempotency_key": form_value(page.text, KEY),
            "deadline": "5000",
        }
        refused = client.post(PAGE, data=form, follow_redirects=True)
        assert "durable-leased-work/deadline" in refused.text
    finally:
        client.close()
    shown = api.worker.get("/v1/tenants/acme/queues/reports/settings").json()
    assert shown["deadline"]["source"] == "policy"


def test_the_form_sets_a_rate_limit_a_hold_on_ordering_keys_and_fairness_and_shows_them(
    api: Api,
) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    try:
        page = client.get(PAGE)
        assert "none: an empty limit removes it" in page.text
        assert "(now arrival)" in page.text
        form = {
            "csrf": form_value(page.text, CSRF),
            "idempotency_key": form_value(page.text, KEY),
            "rate_limit": "10",
            "rate_per": "60",
            "rate_partitioned": "on",
            "ordering_hold": "on",
            "fair": "on",
        }
        saved = client.post(PAGE, data=form, follow_redirects=True)
        assert saved.status_code == 200, saved.text
        assert "now 10 per 60.0 s per partition key" in saved.text
        assert "(now hold)" in saved.text
        assert "(now partition_key)" in saved.text
    finally:
        client.close()
    shown = api.worker.get("/v1/tenants/acme/queues/reports/settings").json()
    assert shown["rate_limit"]["value"] == {"limit": 10, "per": 60.0, "partitioned": True}
    assert shown["ordering_dead_letters"] == {"value": "hold", "source": "queue"}
    assert shown["fairness"] == {"value": "partition_key", "source": "queue"}


def test_the_queues_ledger_says_why_it_was_paused_and_which_settings_changed(api: Api) -> None:
    paused = api.operator.post(
        "/v1/tenants/acme/queues/reports/pause",
        json={"reason": "provider down"},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert paused.status_code == 200, paused.text
    assert put_settings(api, "reports", deadline=600).status_code == 200
    client, _ = sign_in(api.url, api.keys["operator"])
    try:
        page = client.get(PAGE).text
    finally:
        client.close()
    what = re.findall(r"<td>([^<]*)</td></tr>", page)
    assert "paused: provider down" in what
    (settings,) = [w for w in what if w.startswith("settings: ")]
    assert "deadline" in settings
    assert "max_acquisitions" not in settings  # not changed: not named
