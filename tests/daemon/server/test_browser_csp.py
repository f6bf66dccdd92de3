"""The Content-Security-Policy in a real browser (headless Chromium) on the
team server: every answer carries it (pages, static files, the API, a
refusal), and no page breaks it — the login page (its script and style are
files now), the runs list, a run, the compare view and a group view load
with no violation reported and no console error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from gpuprofd.web.app import CONTENT_SECURITY_POLICY
from tests.daemon.batches import batch, new_uuid, run_event, steps_event
from tests.daemon.server.conftest import TeamServer, log_in_page

#: Counts the page's CSP violations (the securitypolicyviolation event) from its first script on.
WATCH_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener('securitypolicyviolation',
    e => window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));
"""


def test_every_answer_carries_the_policy(tmp_path: Path, team_servers: list[TeamServer]) -> None:
    server = TeamServer(tmp_path, f"sqlite:///{tmp_path / 'team.db'}").start()
    team_servers.append(server)
    with httpx.Client(base_url=server.url) as client:
        for path, status in [
            ("/login", 200),
            ("/static/login.js", 200),
            ("/static/login.css", 200),
            ("/api/v1/runs", 401),  # refused before a login: still with the policy
            ("/", 303),
        ]:
            resp = client.get(path)
            assert resp.status_code == status, path
            assert resp.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY, path
            assert resp.headers["X-Content-Type-Options"] == "nosniff", path
        page = client.get("/login").text
        assert "<script>" not in page and "<style>" not in page  # nothing inline to allow


def test_no_page_breaks_the_policy(
    tmp_path: Path, browser: Any, team_servers: list[TeamServer]
) -> None:
    server = TeamServer(tmp_path, f"sqlite:///{tmp_path / 'team.db'}").start()
    team_servers.append(server)
    a, b = new_uuid(), new_uuid()
    events = [
        run_event(1, a, name="csp-a", group_id="job-1", rank=0, world_size=2),
        steps_event(2, a, n=8),
        run_event(3, b, name="csp-b", group_id="job-1", rank=1, world_size=2),
        steps_event(4, b, n=8),
    ]
    assert server.ingest(batch("n1", events)).status_code == 200
    ctx = browser.new_context()
    ctx.add_init_script(WATCH_VIOLATIONS)
    page = ctx.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url + "/#/runs")
    page.wait_for_url(server.url + "/login#/runs")
    assert page.evaluate("window.__cspViolations") == []
    assert page.input_value("#next") == "#/runs"  # login.js ran under the policy
    log_in_page(page)
    page.wait_for_url(server.url + "/#/runs")
    for view in ("#/runs", "#/run/1", "#/compare/1,2", "#/group/job-1"):
        page.goto(f"{server.url}/{view}")
        page.wait_for_selector("body[data-ready='1']", timeout=30_000)
        page.wait_for_timeout(300)  # the charts' first frame
        assert page.evaluate("window.__cspViolations") == [], view
    assert errors == []
    ctx.close()
