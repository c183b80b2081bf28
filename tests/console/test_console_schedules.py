"""The console's schedules page: next fire times, pause, resume and trigger, in a real
browser (Debian's Chromium) and as plain HTTP for the CSRF refusal."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest
from playwright.sync_api import Page, expect

from tests.helpers.api import Api
from tests.helpers.console import CSRF, browser_sign_in, form_value, sign_in

pytestmark = pytest.mark.timeout(600)
DB = psycopg.Connection[dict[str, object]]


def _put(api: Api, name: str, **body: object) -> dict[str, object]:
    response = api.operator.put(
        f"/v1/tenants/acme/schedules/{name}",
        json=body,
        headers={"Idempotency-Key": uuid.uuid4().hex},
    )
    assert response.status_code == 201, response.text
    created: dict[str, object] = response.json()
    return created


@pytest.mark.live
def test_operator_sees_next_fires_pauses_resumes_and_triggers(
    page: Page, api: Api, db: DB, shots: Path
) -> None:
    nightly = _put(api, "nightly", queue="reports", cron="30 2 * * *", timezone="Europe/Berlin")
    _put(api, "hourly", queue="sync", every=3600, paused=True)
    browser_sign_in(page, api.url, api.keys["operator"])
    page.get_by_role("navigation").get_by_role("link", name="Schedules").click()
    expect(page.get_by_role("heading", name="Schedules")).to_be_visible()
    row = page.get_by_role("row").filter(has_text="nightly")
    first = str(nightly["next_fires"][0])  # type: ignore[index]
    expect(row).to_contain_text(first[:10] + " " + first[11:19] + " UTC")
    expect(row).to_contain_text("30 2 * * * Europe/Berlin")
    expect(row).to_contain_text("running")
    expect(page.get_by_role("row").filter(has_text="hourly")).to_contain_text("paused")
    page.screenshot(path=str(shots / "schedules.png"), full_page=True)

    row.get_by_role("button", name="Pause").click()
    expect(page.get_by_role("status")).to_have_text("Paused nightly.")
    shown = api.operator.get("/v1/tenants/acme/schedules/nightly").json()
    assert shown["paused"] is True
    row = page.get_by_role("row").filter(has_text="nightly")
    expect(row).to_contain_text("paused")
    row.get_by_role("button", name="Resume").click()
    expect(page.get_by_role("status")).to_have_text("Resumed nightly.")
    assert api.operator.get("/v1/tenants/acme/schedules/nightly").json()["paused"] is False

    page.get_by_role("row").filter(has_text="nightly").get_by_role(
        "button", name="Trigger now"
    ).click()
    expect(page.get_by_role("status")).to_contain_text("Enqueued item")
    expect(page.get_by_role("status")).to_contain_text("on reports.")
    fired = api.operator.get("/v1/tenants/acme/schedules/nightly").json()["recent_fires"]
    assert [(f["kind"], f["outcome"]) for f in fired] == [("trigger", "enqueued")]
    expect(
        page.get_by_role("row").filter(has_text="nightly").get_by_role("cell").nth(5)
    ).to_have_text("0")  # fires counts ticks; the trigger is in recent fires
    assert db.execute("SELECT count(*) AS n FROM work_items").fetchone() == {"n": 1}


def test_a_schedule_form_without_the_csrf_token_changes_nothing(api: Api) -> None:
    _put(api, "nightly", queue="reports", cron="30 2 * * *")
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/schedules")
    assert page.status_code == 200
    for action in ("pause", "trigger"):
        refused = client.post(
            f"/console/tenants/acme/schedules/nightly/{action}",
            data={"csrf": "0" * 64, "idempotency_key": uuid.uuid4().hex},
        )
        assert refused.status_code == 403
        assert "Form refused" in refused.text
    shown = api.operator.get("/v1/tenants/acme/schedules/nightly").json()
    assert (shown["paused"], shown["recent_fires"]) == (False, [])
    done = client.post(
        "/console/tenants/acme/schedules/nightly/pause",
        data={"csrf": form_value(page.text, CSRF), "idempotency_key": uuid.uuid4().hex},
    )
    assert done.status_code == 303
    assert api.operator.get("/v1/tenants/acme/schedules/nightly").json()["paused"] is True
