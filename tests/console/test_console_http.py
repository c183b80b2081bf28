"""The console over plain HTTP: the session cookie, CSRF, roles, tenant isolation, and the
same idempotent effect as the REST route it mirrors."""

from __future__ import annotations

import re
import uuid

import httpx
import psycopg
import pytest

from queue_server.settings import Settings
from tests.helpers import web
from tests.helpers.api import Api, setup_tenant
from tests.helpers.console import CSRF, KEY, form_value, sign_in
from tests.helpers.items import dead_letter_of, quarantine
from tests.helpers.server import LiveServer, transport_for

DB = psycopg.Connection[dict[str, object]]


def _set_cookie(response: httpx.Response, name: str) -> str:
    (header,) = [h for h in response.headers.get_list("set-cookie") if h.startswith(f"{name}=")]
    return header


def test_operator_signs_in_with_an_httponly_strict_session_cookie(api: Api) -> None:
    client, answer = sign_in(api.url, api.keys["operator"])
    assert answer.status_code == 303
    cookie = _set_cookie(answer, "qs_console").lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie
    assert "path=/console" in cookie
    assert "secure" not in cookie  # plain HTTP here
    assert f"max-age={12 * 3600}" in cookie  # it expires with the session
    # The cookie carries a session id, never the key (nor its secret).
    value = cookie.split(";")[0].split("=", 1)[1]
    key = api.keys["operator"].lower()
    assert key not in cookie
    assert key.split("_", 2)[2] not in cookie  # the secret, whatever it holds
    assert len(value) >= 40
    home = client.get("/console", follow_redirects=True)
    assert home.status_code == 200
    assert str(home.url).endswith("/console/tenants/acme/queues")
    assert "Sign out" in home.text


@pytest.mark.live  # uvicorn takes the scheme from a trusted proxy's header
def test_session_cookie_is_secure_when_served_over_tls(api: Api) -> None:
    # uvicorn takes the scheme from X-Forwarded-Proto of a trusted (loopback) proxy.
    tls = {"X-Forwarded-Proto": "https"}
    with web.client(base_url=api.url, headers=tls) as client:
        form = client.get("/console/sign-in")
        login = _set_cookie(form, "qs_console_login")
        assert "secure" in login.lower()
        answer = client.post(
            "/console/sign-in",
            data={"api_key": api.keys["operator"], "csrf": form_value(form.text, CSRF)},
            # The client keeps a Secure cookie for https only; send it as the browser would.
            headers={"Cookie": login.split(";")[0]},
        )
    assert answer.status_code == 303
    assert "secure" in _set_cookie(answer, "qs_console").lower()


def test_worker_key_cannot_sign_in(api: Api) -> None:
    client, answer = sign_in(api.url, api.keys["worker"])
    assert answer.status_code == 403
    assert "A worker key cannot sign in" in answer.text
    assert "qs_console" not in client.cookies
    page = client.get("/console/tenants/acme/queues")
    assert page.status_code == 303
    assert page.headers["location"].startswith("/console/sign-in")
    # Nor does a worker key set in the cookie by hand open any page.
    client.cookies.set("qs_console", api.keys["worker"], domain="127.0.0.1", path="/console")
    page = client.get("/console/tenants/acme/dead-letters")
    assert page.status_code == 303
    assert page.headers["location"].startswith("/console/sign-in")


def test_unknown_key_and_missing_login_token_are_refused(api: Api) -> None:
    _client, answer = sign_in(api.url, "qsk_0123456789abcdef_nope")
    assert answer.status_code == 401
    assert "unknown or revoked" in answer.text
    with api.client(None) as bare:
        forged = bare.post("/console/sign-in", data={"api_key": api.keys["operator"]})
    assert forged.status_code == 403
    assert "qs_console=" not in " ".join(forged.headers.get_list("set-cookie"))


def test_a_form_without_the_session_csrf_token_changes_nothing(api: Api, db: DB) -> None:
    dead_letter_id = dead_letter_of(api, quarantine(api))
    client, _ = sign_in(api.url, api.keys["operator"])
    path = "/console/tenants/acme/dead-letters/replay"
    for token in (None, "0" * 64):
        data = {"dead_letter_id": dead_letter_id, "idempotency_key": uuid.uuid4().hex}
        if token:
            data["csrf"] = token
        refused = client.post(path, data=data)
        assert refused.status_code == 403
        assert "Form refused" in refused.text
    row = db.execute(
        "SELECT closed_at FROM dead_letters WHERE dead_letter_id = %s", (dead_letter_id,)
    ).fetchone()
    assert row == {"closed_at": None}


def test_replay_from_the_console_is_the_rest_routes_idempotent_effect(api: Api, db: DB) -> None:
    item_id = quarantine(api)
    dead_letter_id = dead_letter_of(api, item_id)
    client, _ = sign_in(api.url, api.keys["operator"])
    confirm = client.post(
        "/console/tenants/acme/dead-letters/confirm",
        data={
            "csrf": form_value(client.get("/console/tenants/acme/dead-letters").text, CSRF),
            "action": "replay",
            "dead_letter_id": dead_letter_id,
        },
    )
    assert confirm.status_code == 200, confirm.text
    assert "Replay 1 dead letter?" in confirm.text
    key = form_value(confirm.text, KEY)
    form = {"csrf": form_value(confirm.text, CSRF), "idempotency_key": key}
    done = client.post(
        "/console/tenants/acme/dead-letters/replay",
        data={**form, "dead_letter_id": dead_letter_id},
    )
    assert done.status_code == 303
    assert client.get(done.headers["location"]).text.count("Replayed 1 dead letter.") == 1

    # The same form sent twice replays its first answer: one effect, one ledger row.
    again = client.post(
        "/console/tenants/acme/dead-letters/replay",
        data={**form, "dead_letter_id": dead_letter_id},
    )
    assert again.status_code == 303
    assert "Replayed 1 dead letter." in client.get(again.headers["location"]).text
    # And it is the REST request's receipt: the REST route replays the console's answer.
    rest = api.operator.post(
        f"/v1/tenants/acme/dead-letters/{dead_letter_id}/replay",
        json={},
        headers={"Idempotency-Key": f"{key}:{dead_letter_id}"},
    )
    assert rest.status_code == 200, rest.text
    assert rest.headers["Idempotent-Replayed"] == "true"
    assert rest.json()["state"] == "ready"

    operator_key_id = api.keys["operator"].split("_")[1]
    replays = db.execute(
        "SELECT actor FROM item_events WHERE item_id = %s AND kind = 'replayed'", (item_id,)
    ).fetchall()
    assert replays == [{"actor": f"key:{operator_key_id}"}]


def test_another_tenants_item_is_a_404_page(live: LiveServer, api: Api) -> None:
    other = setup_tenant(live.url, api.admin, "globex")
    theirs = other.enqueue("q", {"secret": "globex"})
    client, _ = sign_in(api.url, api.keys["operator"])
    for path in (
        f"/console/tenants/globex/items/{theirs['item_id']}",
        f"/console/tenants/acme/items/{theirs['item_id']}",
        "/console/tenants/globex/queues",
    ):
        page = client.get(path)
        assert page.status_code == 404, path
        assert '"secret"' not in page.text


def test_every_page_and_every_link_on_it_renders(api: Api) -> None:
    item_id = quarantine(api)
    api.enqueue("q", {"n": 1})
    client, _ = sign_in(api.url, api.keys["operator"])
    queues = client.get("/console/tenants/acme/queues")
    assert queues.status_code == 200
    nav = sorted(set(re.findall(r'href="(/console/tenants/acme/[a-z-]+)"', queues.text)))
    assert len(nav) >= 5, nav
    # Follow every console link from the navigation on (a bounded crawl).
    seen: set[str] = set(nav)
    queue = list(nav)
    while queue and len(seen) < 80:
        link = queue.pop(0)
        page = client.get(link)
        assert page.status_code == 200, (link, page.text[:500])
        for href in re.findall(r'href="(/console/[^"]*)"', page.text):
            href = href.replace("&amp;", "&")
            if href not in seen and not href.startswith("/console/static"):
                seen.add(href)
                queue.append(href)
    assert f"/console/tenants/acme/items/{item_id}" in seen


def test_a_revoked_key_is_signed_out_at_once(api: Api) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    assert client.get("/console/tenants/acme/queues").status_code == 200
    key_id = api.keys["operator"].split("_")[1]
    assert api.admin.delete(f"/v1/tenants/acme/keys/{key_id}").status_code == 204
    page = client.get("/console/tenants/acme/queues")
    assert page.status_code == 303
    assert page.headers["location"].startswith("/console/sign-in")


def test_admin_picks_a_tenant(live: LiveServer, api: Api, admin_key: str) -> None:
    setup_tenant(live.url, api.admin, "globex")
    client, _ = sign_in(api.url, admin_key)
    home = client.get("/console")
    assert home.status_code == 200
    assert "/console/tenants/acme/queues" in home.text
    assert "/console/tenants/globex/queues" in home.text
    assert client.get("/console/tenants/globex/queues").status_code == 200


def test_pages_escape_payloads_and_forbid_framing_and_scripts(api: Api) -> None:
    hostile = '</pre><script>alert("x")</script><img src=x onerror=alert(1)>'
    item = api.enqueue("q", {"note": hostile})
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get(f"/console/tenants/acme/items/{item['item_id']}")
    assert page.status_code == 200
    assert "<script>" not in page.text
    assert "<img src=x" not in page.text
    assert "&lt;script&gt;" in page.text
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp
    assert "frame-ancestors 'none'" in csp
    assert page.headers["X-Frame-Options"] == "DENY"
    assert page.headers["Cache-Control"] == "no-store"
    # The sign-in page and the error pages carry them too.
    assert client.get("/console/sign-in").headers["X-Frame-Options"] == "DENY"
    assert client.get("/console/tenants/acme/items/nope").headers["X-Frame-Options"] == "DENY"


def test_replay_a_whole_queues_dead_letters_is_the_bulk_replay_route(api: Api) -> None:
    for n in range(3):
        quarantine(api, "q", {"n": n})
    client, _ = sign_in(api.url, api.keys["operator"])
    page = client.get("/console/tenants/acme/dead-letters", params={"queue": "q"}).text
    action = "/console/tenants/acme/queues/q/dead-letters/replay"
    assert f'action="{action}"' in page
    key = form_value(page, KEY)
    done = client.post(action, data={"csrf": form_value(page, CSRF), "idempotency_key": key})
    assert done.status_code == 303
    flash = client.get(done.headers["location"]).text
    assert "Replayed 3 of q&#39;s dead letters, skipped 0; 0 still open." in flash
    rest = api.operator.post(
        "/v1/tenants/acme/queues/q/dead-letters:replay", json={}, headers={"Idempotency-Key": key}
    )
    assert rest.headers["Idempotent-Replayed"] == "true"
    assert rest.json()["replayed"] == 3


def test_filter_forms_as_a_browser_sends_them_with_empty_choices(api: Api) -> None:
    quarantine(api, "q")
    client, _ = sign_in(api.url, api.keys["operator"])
    empty = client.get(
        "/console/tenants/acme/dead-letters", params={"queue": "", "kind": "", "status": ""}
    )
    assert empty.status_code == 200
    assert "quarantined by triage" in empty.text
    assert client.get("/console/tenants/acme/dead-letters?kind=nope").status_code == 422


def _form(client: httpx.Client) -> str:
    return form_value(client.get("/console/tenants/acme/queues").text, CSRF)


def test_a_cookie_used_after_sign_out_is_refused_everywhere(
    api: Api, settings: Settings, database_url: str
) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    cookie = client.cookies["qs_console"]
    out = client.post("/console/sign-out", data={"csrf": _form(client)})
    assert out.status_code == 303
    # The same cookie, replayed as an attacker who copied it would: the session is over, in
    # this process and in any other one serving the same database.
    with httpx.Client(base_url=api.url, transport=transport_for(api.url)) as stolen:
        stolen.cookies.set("qs_console", cookie, domain="127.0.0.1", path="/console")
        page = stolen.get("/console/tenants/acme/queues")
        assert page.status_code == 303
        assert page.headers["location"].startswith("/console/sign-in")
    other = LiveServer(settings, database_url)
    other.start()
    try:
        with web.client(base_url=other.url) as elsewhere:
            elsewhere.cookies.set("qs_console", cookie, domain="127.0.0.1", path="/console")
            assert elsewhere.get("/console/tenants/acme/queues").status_code == 303
    finally:
        other.stop()


def test_a_session_ends_when_it_expires_or_its_key_is_revoked(api: Api, db: DB) -> None:
    client, _ = sign_in(api.url, api.keys["operator"])
    assert client.get("/console/tenants/acme/queues").status_code == 200
    db.execute("UPDATE console_sessions SET expires_at = created_at + interval '1 ms'")
    assert client.get("/console/tenants/acme/queues").status_code == 303

    client, _ = sign_in(api.url, api.keys["operator"])
    assert client.get("/console/tenants/acme/queues").status_code == 200
    key_id = api.keys["operator"].split("_")[1]
    assert api.admin.delete(f"/v1/tenants/acme/keys/{key_id}").status_code == 204
    assert client.get("/console/tenants/acme/queues").status_code == 303


def test_failed_sign_ins_are_limited_per_address_and_per_key(api: Api) -> None:
    wrong = [f"qsk_{n:016x}_nope" for n in range(30)]
    statuses = [sign_in(api.url, key)[1].status_code for key in wrong]
    assert statuses[:10] == [401] * 10
    assert set(statuses[10:]) == {429}
    refused = sign_in(api.url, api.keys["operator"])[1]  # even the right key, from here
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 60
    assert "Too many failed sign-ins" in refused.text


def test_a_message_after_an_action_shows_once(api: Api) -> None:
    client, answer = sign_in(api.url, api.keys["operator"])
    assert answer.status_code == 303
    queues = "/console/tenants/acme/queues"
    assert '<p class="flash ok" role="status">Signed in.</p>' in client.get(queues).text
    assert 'class="flash' not in client.get(queues).text  # shown once, then gone
