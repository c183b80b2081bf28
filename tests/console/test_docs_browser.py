"""/docs in a real browser with every other host unreachable: Swagger UI renders the API from
the installed package's files alone, and its Authorize dialog takes a bearer key."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, Route, expect

from tests.helpers.server import LiveServer

# A browser loads the pages over a socket.
pytestmark = [pytest.mark.timeout(600), pytest.mark.live]


def test_swagger_ui_renders_offline_with_bearer_authorization(page: Page, live: LiveServer) -> None:
    elsewhere: list[str] = []

    def only_this_server(route: Route) -> None:
        if route.request.url.startswith(live.url):
            route.continue_()
        else:
            elsewhere.append(route.request.url)
            route.abort()

    page.route("**/*", only_this_server)
    page.goto(f"{live.url}/docs")
    expect(page.get_by_text("/v1/tenants/{tenant}/items:cancel", exact=True)).to_be_visible()
    expect(page.locator(".opblock-tag", has_text="queues").first).to_be_visible()
    page.get_by_role("button", name="Authorize").first.click()
    expect(page.get_by_text("apiKey  (http, Bearer)")).to_be_visible()
    assert elsewhere == []
