"""The login in a real browser (headless Chromium): the page sends a
visitor without a session to the login form, a wrong password back to it,
the right one to the dashboard with an HttpOnly, SameSite=Lax session
cookie, and to the view the visitor was going to (``#/run/N``); the page's
own requests then read the API, and logging out ends it, in this browser
and in one holding a copy of its cookie."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.daemon.batches import batch, new_uuid, run_event, steps_event
from tests.daemon.server.conftest import TeamServer, log_in_page

LOGOUT = """() => {
    const token = document.cookie.split('; ').find(c => c.startsWith('gpuprof_csrf='));
    return fetch('/api/v1/logout', {method: 'POST',
        headers: {'X-CSRF-Token': token.slice('gpuprof_csrf='.length)}}).then(r => r.status);
}"""


def test_login_and_logout_in_a_browser(
    tmp_path: Path, browser: Any, team_servers: list[TeamServer]
) -> None:
    server = TeamServer(tmp_path, f"sqlite:///{tmp_path / 'team.db'}").start()
    team_servers.append(server)
    run = new_uuid()
    assert server.ingest(batch("n1", [run_event(1, run, name="<b>seen</b>"), steps_event(2, run)]))
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(server.url + "/")
    assert page.url == server.url + "/login"
    log_in_page(page, "not it")
    page.wait_for_url("**/login?failed=1")
    assert page.get_by_role("alert").inner_text().startswith("Wrong password")
    log_in_page(page)
    page.wait_for_url(server.url + "/")
    cookies = {c["name"]: c for c in ctx.cookies()}
    session = cookies["gpuprof_session"]
    assert session["httpOnly"] and session["sameSite"] == "Lax" and not session["secure"]
    assert not cookies["gpuprof_csrf"]["httpOnly"]  # the page reads it to send it back
    assert page.evaluate("document.cookie").count("gpuprof_session") == 0
    runs = page.evaluate("fetch('/api/v1/runs').then(r => r.json())")
    assert [r["run_name"] for r in runs["runs"]] == ["<b>seen</b>"]
    assert page.evaluate(LOGOUT) == 200
    assert page.evaluate("fetch('/api/v1/runs').then(r => r.status)") == 401
    page.goto(server.url + "/")
    assert page.url == server.url + "/login"
    ctx.close()


def test_the_login_brings_the_viewer_back_to_the_view_asked_for(
    tmp_path: Path, browser: Any, team_servers: list[TeamServer]
) -> None:
    server = TeamServer(tmp_path, f"sqlite:///{tmp_path / 'team.db'}").start()
    team_servers.append(server)
    run = new_uuid()
    assert server.ingest(batch("n1", [run_event(1, run, name="asked-for"), steps_event(2, run)]))
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(server.url + "/#/run/1")
    page.wait_for_url(server.url + "/login#/run/1")
    log_in_page(page, "not it")  # a wrong password keeps where it was going
    page.wait_for_url(server.url + "/login?failed=1#/run/1")
    log_in_page(page)
    page.wait_for_url(server.url + "/#/run/1")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    assert page.locator("h1.run-name").inner_text().startswith("asked-for")

    # a copy of the cookie in another browser: logging out here ends it there,
    # and that page, at its next request, goes to the login, keeping its view
    other = browser.new_context()
    other.add_cookies(ctx.cookies())
    copy = other.new_page()
    copy.goto(server.url + "/#/runs?name=asked")
    copy.wait_for_selector("body[data-ready='1']", timeout=30_000)
    assert copy.locator("#runs a.run-link").all_inner_texts() == ["asked-for"]
    assert page.evaluate(LOGOUT) == 200
    copy.wait_for_url(server.url + "/login#/runs?name=asked", timeout=30_000)
    ctx.close()
    other.close()


def test_a_summarys_team_link_comes_back_to_its_run_after_the_login(
    tmp_path: Path, browser: Any, team_servers: list[TeamServer]
) -> None:
    """The summary's "Team server: URL/runs/<uuid>" opened without a session."""
    server = TeamServer(tmp_path, f"sqlite:///{tmp_path / 'team.db'}").start()
    team_servers.append(server)
    other, run = new_uuid(), new_uuid()
    events = [run_event(1, other, name="not-this"), run_event(2, run, name="linked")]
    assert server.ingest(batch("n1", [*events, steps_event(3, run)])).is_success
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(f"{server.url}/runs/{run}")
    page.wait_for_url(f"{server.url}/login#/run-uuid/{run}")
    log_in_page(page)
    page.wait_for_url(server.url + "/#/run/2", timeout=30_000)
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    assert page.locator("h1.run-name").inner_text().startswith("linked")
    page.goto(f"{server.url}/#/run-uuid/{new_uuid()}")  # a run not here (yet): said in words
    page.wait_for_url(f"{server.url}/runs/*", timeout=30_000)
    assert "no such run here" in page.locator("body").inner_text()
    ctx.close()


def test_a_login_never_sends_the_viewer_off_the_site(
    tmp_path: Path, browser: Any, team_servers: list[TeamServer]
) -> None:
    server = TeamServer(tmp_path, f"sqlite:///{tmp_path / 'team.db'}").start()
    team_servers.append(server)
    ctx = browser.new_context()
    page = ctx.new_page()
    page.goto(server.url + "/login")
    for hostile in ("//evil.example/", "https://evil.example/", "#/x\r\nSet-Cookie: a=b"):
        page.evaluate("v => { document.getElementById('next').value = v; }", hostile)
        log_in_page(page)
        page.wait_for_url(server.url + "/", timeout=30_000)  # the next field ignored
        page.goto(server.url + "/login")
    ctx.close()
