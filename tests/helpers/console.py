"""Console test helpers: sign a browser-less client or a browser page in, read a page's forms."""

from __future__ import annotations

import re

import httpx
from playwright.sync_api import Page, expect

from queue_server.client.connection import tls_context
from tests.helpers.server import transport_for

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
KEY = re.compile(r'name="idempotency_key" value="([^"]+)"')


def form_value(page: str, pattern: re.Pattern[str]) -> str:
    found = pattern.search(page)
    assert found, "the page has no such form field"
    return found.group(1)


def sign_in(url: str, key: str, **headers: str) -> tuple[httpx.Client, httpx.Response]:
    """A cookie-keeping client after posting the sign-in form; returns the POST's answer."""
    client = httpx.Client(
        base_url=url,
        timeout=30,
        headers=headers,
        transport=transport_for(url),
        verify=tls_context(),
    )
    form = client.get("/console/sign-in")
    assert form.status_code == 200, form.text
    answer = client.post(
        "/console/sign-in",
        data={"api_key": key, "csrf": form_value(form.text, CSRF), "next": "/console"},
    )
    return client, answer


def browser_sign_in(page: Page, url: str, key: str) -> None:
    page.goto(f"{url}/console")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    page.get_by_label("API key").fill(key)
    page.get_by_role("button", name="Sign in").click()
