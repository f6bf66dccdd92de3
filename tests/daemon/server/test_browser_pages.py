"""The team server's pages in a real browser (headless Chromium), logged in:
the runs list with its node column and its node, name and time filters
(kept in the address), and a run page whose GPU is known only from what
its node sent (no device index: the GPU is named by its UUID, never "null")."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.daemon.batches import GPU, batch, new_uuid, run_event, steps_event
from tests.daemon.server.conftest import TeamServer, log_in_page
from tests.daemon.server.test_views import ended, rollup_row, rollups_event
from tests.daemon.web.static import runs_table as rt
from tests.daemon.web.static.wait import wait_until

NS = 1_000_000_000
#: A project name that would run script if it reached the page as HTML.
HOSTILE = '<img src=x onerror="document.body.dataset.pwned=1">'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TeamServer]:
    """A server holding node-a's run of two days ago and node-b's two recent ones."""
    tmp = tmp_path_factory.mktemp("pages")
    s = TeamServer(tmp, f"sqlite:///{tmp / 'team.db'}").start()
    try:
        now = time.time_ns()
        old, sft, pre = new_uuid(), new_uuid(), new_uuid()
        a = [
            run_event(
                1,
                old,
                name="sft-old",
                start_wall_ns=now - 2 * 86400 * NS,
                user_name="bob",
                project="vision",
            ),
            ended(2, old, now - 2 * 86400 * NS + 60 * NS),
        ]
        assert s.ingest(batch("n1", a)).status_code == 200
        b = [
            run_event(
                1,
                sft,
                name="sft-new",
                host="node-b",
                start_wall_ns=now - 600 * NS,
                cuda_uuid=f"GPU-{GPU}",
                gpu_model="NVIDIA H200",
                user_name="alice",
                project="llm",
                tags='{"team": "nlp"}',
            ),
            steps_event(2, sft, n=5),
            rollups_event(3, [rollup_row(1)]),
            run_event(
                4,
                pre,
                name="pretrain",
                host="node-b",
                start_wall_ns=now - 300 * NS,
                user_name="<b>bob</b>",
                project=HOSTILE,
            ),
            ended(5, pre, now - 200 * NS),
        ]
        assert s.ingest(batch("n2", b, host="node-b")).status_code == 200
        yield s
    finally:
        s.stop()


@pytest.fixture
def page(browser: Any, server: TeamServer) -> Iterator[Any]:
    """A logged-in page (its console errors collected in ``page.errors``)."""
    ctx = browser.new_context(viewport={"width": 1600, "height": 900})
    p = ctx.new_page()
    errors: list[str] = []
    p.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    p.on("pageerror", lambda e: errors.append(str(e)))
    p.goto(server.url + "/")
    log_in_page(p)
    p.wait_for_url(server.url + "/")
    p.wait_for_selector("body[data-ready='1']", timeout=30_000)
    p.errors = errors
    yield p
    ctx.close()


def _names(page: Any) -> list[str]:
    return page.locator("#runs a.run-link").all_inner_texts()


def _shows(page: Any, names: list[str]) -> None:
    """Wait until the runs list shows exactly *names* (in order)."""
    want = orjson.dumps(names).decode()
    wait_until(
        page,
        f"""() => JSON.stringify([...document.querySelectorAll('#runs a.run-link')]
            .map(a => a.innerText)) === {want!r}""",
        timeout=30_000,
    )


def test_the_runs_list_has_a_node_column_and_filters(page: Any, server: TeamServer) -> None:
    assert _names(page) == ["pretrain", "sft-new", "sft-old"]
    heads = page.locator("table.runs thead th").all_inner_texts()
    col = heads.index("Node")
    cells = page.locator(f"table.runs tbody tr td:nth-child({col + 1})").all_inner_texts()
    assert cells == ["node-b", "node-b", "node-a"]
    node = page.locator("#filter-node")
    assert node.is_visible()  # runs from two nodes: the node filter is offered
    assert node.locator("option").all_inner_texts() == ["any node", "node-a (1)", "node-b (2)"]

    node.select_option("n2")
    _shows(page, ["pretrain", "sft-new"])
    assert page.evaluate("location.hash") == "#/runs?node=n2"
    page.fill("#filter-name", "sft")
    _shows(page, ["sft-new"])
    node.select_option("")
    _shows(page, ["sft-new", "sft-old"])
    page.locator("#filter-time").select_option("24h")
    _shows(page, ["sft-new"])  # the two-day-old run is out
    assert page.evaluate("location.hash") == "#/runs?name=sft&within=24h"

    # the address keeps the filters: a reload (or a bookmark) shows the same list
    page.reload()
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    _shows(page, ["sft-new"])
    assert page.input_value("#filter-name") == "sft"
    assert page.input_value("#filter-time") == "24h"

    # a node's name in the list picks it
    page.goto(server.url + "/#/runs")
    _shows(page, ["pretrain", "sft-new", "sft-old"])
    page.locator("#runs a.node-link", has_text="node-a").click()
    _shows(page, ["sft-old"])
    assert page.input_value("#filter-node") == "n1"
    assert page.errors == []


def test_the_runs_list_shows_who_trained_and_filters_by_user(page: Any, server: TeamServer) -> None:
    heads = page.locator("table.runs thead th").all_inner_texts()
    col = heads.index("User")
    cells = page.locator(f"table.runs tbody tr td:nth-child({col + 1})").all_inner_texts()
    assert cells == ["<b>bob</b>", "alice", "bob"]  # a user name is text, never markup
    assert page.locator("table.runs tbody b").count() == 0
    page.fill("#filter-user", "bob")
    _shows(page, ["sft-old"])  # exactly "bob", not "<b>bob</b>"
    assert page.evaluate("location.hash") == "#/runs?user=bob"
    page.goto(server.url + "/#/runs")
    _shows(page, ["pretrain", "sft-new", "sft-old"])
    page.locator("#runs a.user-link", has_text="alice").click()
    _shows(page, ["sft-new"])
    assert page.input_value("#filter-user") == "alice"
    assert page.errors == []


def test_the_runs_list_shows_the_project_as_text_and_filters_by_it(
    page: Any, server: TeamServer
) -> None:
    heads = page.locator("table.runs thead th").all_inner_texts()
    col = heads.index("Project")
    cells = page.locator(f"table.runs tbody tr td:nth-child({col + 1})").all_inner_texts()
    assert cells == [HOSTILE, "llm", "vision"]  # a project name is text, never markup
    assert page.locator("table.runs tbody img").count() == 0
    assert page.evaluate("document.body.dataset.pwned") is None
    page.fill("#filter-project", "llm")
    _shows(page, ["sft-new"])
    assert page.evaluate("location.hash") == "#/runs?project=llm"
    page.goto(server.url + "/#/runs")
    _shows(page, ["pretrain", "sft-new", "sft-old"])
    page.locator("#runs a.project-link", has_text="vision").click()
    _shows(page, ["sft-old"])
    assert page.input_value("#filter-project") == "vision"
    assert page.errors == []


def test_a_run_page_names_an_ingested_gpu_by_its_uuid(page: Any, server: TeamServer) -> None:
    page.goto(server.url + "/#/runs?name=sft-new")
    _shows(page, ["sft-new"])
    page.locator("#runs a.run-link").click()
    page.wait_for_selector("#gpus .gpu-row", timeout=30_000)
    label = page.locator("#gpus .gpu-label").inner_text()
    assert label.splitlines() == ["GPU c0ffee00", "NVIDIA H200", f"GPU-{GPU}"]
    assert "null" not in page.locator("#gpus").inner_text()
    assert page.locator("#gpus .gpu-row").get_attribute("data-gpu") == f"GPU-{GPU}"
    assert page.errors == []


def test_the_runs_list_fits_a_1400px_screen(browser: Any, server: TeamServer) -> None:
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        p = ctx.new_page()
        p.goto(server.url + "/")
        log_in_page(p)
        p.wait_for_selector("body[data-ready='1'] table.runs", timeout=30_000)
        fit = p.evaluate(
            """() => { const box = document.querySelector('#runs');
                       return {table: box.querySelector('table.runs').scrollWidth,
                               box: box.clientWidth}; }"""
        )
        assert fit["table"] <= fit["box"], fit  # the node and user columns too: no scrolling
    finally:
        ctx.close()


def test_the_runs_list_fits_1400px_with_realistic_long_values(browser: Any, tmp_path: Any) -> None:
    """A sweep's two runs from two nodes of a cluster, name, group, host and
    user long at once: no sideways scroll, every cut value whole in its
    tooltip, the two nodes read differently."""
    s = TeamServer(tmp_path, f"sqlite:///{tmp_path / 'team.db'}").start()
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    try:
        now = time.time_ns()
        for i, (host, user) in enumerate(zip(rt.HOSTS, rt.USERS, strict=True)):
            ev = run_event(
                1, new_uuid(), name=rt.NAME, host=host, group_id=rt.GROUP, user_name=user,
                start_wall_ns=now - (600 - i) * NS,
            )  # fmt: skip
            assert s.ingest(batch(f"n{17 + i}", [ev], host=host)).status_code == 200
        p = ctx.new_page()
        p.goto(s.url + "/")
        log_in_page(p)
        p.wait_for_selector("body[data-ready='1'] table.runs", timeout=30_000)
        seen = rt.runs_table(p)
        ids = sorted(seen["rows"], key=int)
        full = {
            rid: {"name": rt.NAME, "group": rt.GROUP, "node": host, "user": user}
            for rid, host, user in zip(ids, rt.HOSTS, rt.USERS, strict=True)
        }
        rt.assert_fits_and_tells_apart(seen, full)
    finally:
        ctx.close()
        s.stop()
