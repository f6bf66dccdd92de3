"""The login in a real browser (headless Chromium): the page sends a
visitor without a session to the login form, a wrong password back to it,
the right one to the dashboard with an HttpOnly, SameSite=Lax session
cookie; the page's own requests then read the API, and logging out ends it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.batches import batch, new_uuid, run_event, steps_event
from tests.daemon.server.conftest import PASSWORD, TeamServer

CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


@pytest.fixture
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield b
        finally:
            b.close()


def test_login_and_logout_in_a_browser(
    tmp_path: Path, browser: Any, team_servers: list[TeamServer]
) -> None:
    server = TeamServer(tmp_path, f"sqlite:///{tmp_path / 'team.db'}").start()
    team_servers.append(server)
    run = new_uuid()
    assert server.ingest(batch("n1", [run_event(1, run, name="<b>seen</b>"), steps_event(2, run)]))
    page = browser.new_page()
    page.goto(server.url + "/")
    assert page.url == server.url + "/login"
    page.fill("#password", "not it")
    page.click("button[type=submit]")
    page.wait_for_url("**/login?failed=1")
    assert page.get_by_role("alert").inner_text().startswith("Wrong password")
    page.fill("#password", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(server.url + "/")
    cookies = {c["name"]: c for c in page.context.cookies()}
    session = cookies["gpuprof_session"]
    assert session["httpOnly"] and session["sameSite"] == "Lax" and not session["secure"]
    assert not cookies["gpuprof_csrf"]["httpOnly"]  # the page reads it to send it back
    assert page.evaluate("document.cookie").count("gpuprof_session") == 0
    runs = page.evaluate("fetch('/api/v1/runs').then(r => r.json())")
    assert [r["run_name"] for r in runs["runs"]] == ["<b>seen</b>"]
    logout = """() => {
        const token = document.cookie.split('; ').find(c => c.startsWith('gpuprof_csrf='));
        return fetch('/api/v1/logout', {method: 'POST',
            headers: {'X-CSRF-Token': token.slice('gpuprof_csrf='.length)}}).then(r => r.status);
    }"""
    assert page.evaluate(logout) == 200
    assert page.evaluate("fetch('/api/v1/runs').then(r => r.status)") == 401
    page.goto(server.url + "/")
    assert page.url == server.url + "/login"
