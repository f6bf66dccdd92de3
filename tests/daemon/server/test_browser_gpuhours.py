"""The "GPU-hours" page in headless Chromium on a team server fed by two
nodes' forwarded runs (tests/daemon/server/rollup_fixture.py): the totals,
the weekly stacked bars of lost GPU-hours by finding, the costliest findings
with their fix, the project and user tables linking to the runs; a hostile
project name shown as text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.daemon.server.conftest import KEY_ONE, TeamServer, log_in_page
from tests.daemon.server.rollup_fixture import FIX, HOSTILE, feed
from tests.daemon.web.static.wait import wait_until

KEY = {"Authorization": f"Bearer {KEY_ONE}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TeamServer]:
    tmp = tmp_path_factory.mktemp("gpuhours")
    s = TeamServer(tmp, f"sqlite:///{tmp / 'team.db'}").start()
    try:
        feed(s)
        yield s
    finally:
        s.stop()


@pytest.fixture
def page(browser: Any, server: TeamServer) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    p = ctx.new_page()
    errors: list[str] = []
    p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.goto(server.url + "/#/gpu-hours")
    log_in_page(p)
    p.wait_for_url(server.url + "/#/gpu-hours")
    p.wait_for_selector("body[data-ready='1'] #gpuhours-totals", timeout=30_000)
    p.errors = errors
    yield p
    ctx.close()


def _column(page: Any, table: str, n: int) -> list[str]:
    return page.locator(f"#{table} tbody tr td:nth-child({n})").all_inner_texts()


def test_the_page_shows_the_teams_gpu_hours(page: Any, server: TeamServer) -> None:
    totals = page.inner_text("#gpuhours-totals")
    assert totals == "2 runs · 88.0 GPU-hours ($352) · 9.0 GPU-hours lost ($36.00, 10%)"
    assert _column(page, "gpuhours-findings", 1) == ["dataloader_stall", "gpu_idle_between_steps"]
    assert _column(page, "gpuhours-findings", 3) == ["5.6", "3.4"]  # 8 x 8/14 + 1, 8 x 6/14
    assert _column(page, "gpuhours-findings", 6)[0] == FIX
    assert _column(page, "gpuhours-users", 1) == ["alice", "bob"]
    assert _column(page, "gpuhours-users", 3) == ["80.0", "8.0"]
    # the stacked bars: one series a finding, this week's bar the sum
    wait_until(page, "() => !!document.querySelector('#gpuhours-weeks .uplot canvas')")
    legend = page.locator("#gpuhours-weeks .u-legend th").all_inner_texts()
    assert [t.strip() for t in legend[1:]] == ["gpu_idle_between_steps", "dataloader_stall"]
    page.screenshot(path=str(server.tmp / "gpu-hours.png"), full_page=True)
    assert page.errors == []


def test_a_hostile_project_is_text_and_the_tables_link_to_runs(
    page: Any, server: TeamServer
) -> None:
    assert _column(page, "gpuhours-projects", 1) == ["llm", HOSTILE]
    assert page.locator("#gpuhours img").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    worst = page.locator("#gpuhours-projects a.worst-run", has_text="pretrain")
    with server.client(headers=KEY) as c:
        run_id = c.get("/api/v1/runs?name=pretrain").json()["runs"][0]["id"]
    assert worst.get_attribute("href") == f"#/run/{run_id}"
    page.locator("#gpuhours-projects a.group-link").nth(1).click()
    wait_until(
        page,
        "() => [...document.querySelectorAll('#runs a.run-link')].map(a => a.innerText)"
        ".join() === 'sft'",
        timeout=30_000,
    )
    assert page.input_value("#filter-project") == HOSTILE
    assert page.errors == []
