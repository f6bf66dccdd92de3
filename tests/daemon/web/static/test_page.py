"""The dashboard page in headless Chromium against a real gpuprofd with real
CPU torch runs (the recorded H200 trace replayed as the node's GPU).

Screenshots of each view go to a temporary directory, or to
``$GPUPROF_SCREENSHOTS`` (the docs' images: ``GPUPROF_SCREENSHOTS=docs/img``).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlparse

import pytest

from tests.daemon.web.static import runs_table as rt
from tests.daemon.web.static.conftest import Dash
from tests.daemon.web.static.wait import wait_until

pytestmark = pytest.mark.timeout(600)

#: What a run name can hold once it reaches the page from a database: markup,
#: quotes, an entity, bidi overrides and isolates, 10 kB.
HOSTILE = (
    '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">'
    "\"quoted\" 'single' &amp; \u202eevil\u202c \u2067rtl\u2069 "
) + "x" * 10_000
GROUP = "ddp-web-ü/1"


@pytest.fixture(scope="module")
def runs(dash: Dash) -> dict[str, Any]:
    """Ended runs: a plain one, one waiting on its loader, a hostile-named one
    (stored as the shim cleans it, then overwritten in the database with the
    whole hostile string), and a two-rank group."""
    started = {
        "plain": dash.train(40, 0.0, "web-plain"),
        # long enough (150 x 30 ms) for the daemon's GPU (10 Hz) and host (2 Hz) samples
        "stall": dash.train(150, 0.03, "web-stall"),
        "hostile": dash.train(15, 0.0, HOSTILE),
    }
    rows = {
        key: dash.finish(p, n)
        for key, p, n in (
            ("plain", started["plain"], "web-plain"),
            ("stall", started["stall"], "web-stall"),
        )
    }
    _, err = started["hostile"].communicate(timeout=120)
    assert started["hostile"].returncode == 0, err
    hostile = _wait_prefix(dash, "<script>")
    with closing(sqlite3.connect(dash.db)) as db, db:
        sql = "UPDATE runs SET run_name = ?, error = ? WHERE id = ?"
        db.execute(sql, (HOSTILE, HOSTILE, hostile["id"]))
    rows["hostile"] = hostile
    ranks = [
        dash.train(20, 0.0, f"web-rank{r}", GROUP, env={"RANK": str(r), "WORLD_SIZE": "2"})
        for r in (0, 1)
    ]
    rows["rank0"] = dash.finish(ranks[0], "web-rank0")
    rows["rank1"] = dash.finish(ranks[1], "web-rank1")
    return rows


def _wait_prefix(dash: Dash, prefix: str) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        for row in dash.get("/api/v1/runs")["runs"]:
            if row["run_name"].startswith(prefix) and row["status"] != "running":
                return row
        time.sleep(0.2)
    raise AssertionError(f"no ended run named {prefix}…: {dash.log()[-3000:]}")


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    d = Path(os.environ.get("GPUPROF_SCREENSHOTS") or tmp_path)
    d.mkdir(parents=True, exist_ok=True)
    return d


def chart_cursors(page: Any) -> list[dict[str, Any]]:
    """Every chart on the page: its title, the time under its cursor (unix s,
    None when its cursor is off), one x unit per pixel, its legend's x text."""
    return page.evaluate(
        """[...document.querySelectorAll('.chart')].map(e => {
             const u = e.uplot;
             const on = u.cursor.left !== null && u.cursor.left >= 0;
             return {title: e.dataset.title, x: on ? u.posToVal(u.cursor.left, 'x') : null,
                     px: (u.scales.x.max - u.scales.x.min) / u.bbox.width * devicePixelRatio,
                     legend: e.querySelector('.u-legend .u-value').textContent};
           })"""
    )


def test_live_page_gains_steps_without_a_reload(dash: Dash, runs: dict, pages, shots: Path):
    proc = dash.train(400, 0.05, "web-live")
    row = dash.wait_run("web-live", lambda r: r["status"] == "running" and r["steps"] > 5, "live")
    w = pages()
    page = w.open(f"{dash.url}/#/run/{row['id']}")
    page.evaluate("window.__sameDocument = true")
    wait_until(page, "document.body.dataset.live === 'open'", timeout=15_000)
    steps_chart = "document.querySelector('#steps .chart').uplot.data[0].length"
    first_points = page.evaluate(steps_chart)
    first_steps = int(page.get_attribute("#run-steps", "data-steps"))
    # more steps arrive over the WebSocket: in the headline and in the chart
    wait_until(
        page,
        f"Number(document.querySelector('#run-steps').dataset.steps) >= {first_steps + 20}",
        timeout=60_000,
    )
    wait_until(page, f"{steps_chart} > {first_points}", timeout=30_000)
    assert page.evaluate("window.__sameDocument") is True  # never reloaded
    assert page.evaluate("Number(document.body.dataset.seriesLoaded)") == 1  # nor re-fetched
    page.screenshot(path=str(shots / "run-live.png"), full_page=False)
    proc.kill()
    proc.communicate(timeout=30)
    assert w.errors == []


def test_insights_panel_shows_the_runs_findings(dash: Dash, runs: dict, pages):
    rid = runs["stall"]["id"]
    found = dash.get(f"/api/v1/runs/{rid}/insights")["insights"]
    assert found, "a run waiting 30 ms a step on its loader has a finding"
    w = pages()
    page = w.open(f"{dash.url}/#/run/{rid}")
    items = page.locator("#insights li.insight")
    assert items.count() == len(found)
    shown = {items.nth(i).get_attribute("data-rule"): items.nth(i) for i in range(items.count())}
    for ins in found:
        item = shown[ins["rule"]]
        assert item.locator(".sev").text_content() == ins["severity"]
        assert item.locator(".insight-title").text_content() == ins["title"]
        if ins["fix"]:
            assert item.locator(".insight-fix").text_content() == f"Fix: {ins['fix']}"
    # in the API's order (ranked by what fixing each is worth), each with its worth
    assert [items.nth(i).get_attribute("data-rule") for i in range(items.count())] == [
        i["rule"] for i in found
    ]
    for ins in found:
        if ins["gain_ms_per_iteration"] is not None:
            worth = shown[ins["rule"]].locator(".insight-gain").text_content()
            assert worth.startswith("Worth: up to ") and "ms per iteration" in worth
    # the insights come before every chart
    assert page.evaluate(
        "document.querySelector('#insights').compareDocumentPosition("
        "document.querySelector('.chart')) & Node.DOCUMENT_POSITION_FOLLOWING"
    )
    assert w.errors == []


def _gain(ms: float, speedup: float, label: str) -> dict:
    return {
        "gain_ms_per_iteration": ms,
        "gain_pct": ms,
        "gain_speedup_max": speedup,
        "gain_run_s": 2 * ms,
        "gain_iteration_ms": 100.0,
        "gain_method": f"{label}, removed",
        "gain_parts_ms": {"loader_wait": ms},
        "gain_label": label,
    }


def test_insights_panel_ranks_findings_by_what_fixing_each_is_worth(dash: Dash, runs: dict, pages):
    """Findings stored with gains (in their evidence, as gpuprofd stores them),
    in severity order: the panel lists them by gain, severity still shown."""
    rid = runs["rank1"]["id"]
    stored = [  # (rule, severity, gain)
        ("high_none", "HIGH", {"gain_method": "not estimated: its time is not measured"}),
        ("low_none", "LOW", {}),
        ("high_small", "HIGH", _gain(5.0, 1.05, "the small one")),
        ("med_big", "MED", _gain(30.0, 1.43, "the slow steps")),
    ]
    with closing(sqlite3.connect(dash.db)) as db, db:
        db.execute("DELETE FROM insights WHERE run_id = ?", (rid,))
        for rule, sev, gain in stored:
            evidence = json.dumps({"n": 1, **({"gain": gain} if gain else {})})
            db.execute(
                "INSERT INTO insights (run_id, rule, severity, title, detail, fix, evidence, "
                "created_wall_ns) VALUES (?, ?, ?, ?, '', '', ?, 1)",
                (rid, rule, sev, f"title of {rule}", evidence),
            )
        # the run's own fix-all figure is of its real findings: none here
        (summary,) = db.execute("SELECT summary FROM runs WHERE id = ?", (rid,)).fetchone()
        if summary:
            db.execute(
                "UPDATE runs SET summary = ? WHERE id = ?",
                (json.dumps({**json.loads(summary), "gains": None}), rid),
            )
    ranked = ["med_big", "high_small", "high_none", "low_none"]
    api = dash.get(f"/api/v1/runs/{rid}/insights")
    assert [i["rule"] for i in api["insights"]] == ranked
    assert api["insights"][0]["gain_speedup_max"] == 1.43
    assert api["insights"][0]["evidence"] == {"n": 1}  # the gain is lifted out of it
    w = pages()
    page = w.open(f"{dash.url}/#/run/{rid}")
    items = page.locator("#insights li.insight")
    items.first.wait_for()
    assert [items.nth(i).get_attribute("data-rule") for i in range(items.count())] == ranked
    assert [items.nth(i).locator(".sev").text_content() for i in range(4)] == [
        "MED",
        "HIGH",
        "HIGH",
        "LOW",
    ]
    assert page.locator("#insights .gain-headline").text_content() == (
        "Fixing the slow steps: up to 1.4× faster"
    )
    assert items.nth(0).locator(".insight-gain").text_content() == (
        "Worth: up to 1.4× faster: 30.0 of 100.0 ms per iteration (30%), ~60 s of this run"
    )
    assert items.nth(0).locator(".insight-gain-method").text_content() == (
        "How: the slow steps, removed"
    )
    assert items.nth(2).locator(".insight-gain").text_content() == (
        "Worth: not estimated: its time is not measured"
    )
    assert items.nth(3).locator(".insight-gain").count() == 0  # costs no time
    assert w.errors == []


def test_a_stored_value_the_daemon_cannot_read_is_a_note_on_the_run_page(
    dash: Dash, runs: dict, pages
):
    """A finding whose evidence something outside gpuprof left unreadable:
    the page shows the finding and, with the insights' notes, what could
    not be read (the API's ``unreadable``)."""
    rid = runs["plain"]["id"]
    with closing(sqlite3.connect(dash.db)) as db, db:
        db.execute(
            "INSERT INTO insights (run_id, rule, severity, title, detail, fix, evidence, "
            "created_wall_ns) VALUES (?, 'damaged', 'LOW', 'a finding', '', '', '{', 1)",
            (rid,),
        )
    try:
        api = dash.get(f"/api/v1/runs/{rid}/insights")
        assert api["unreadable"] == [
            f"1 stored value in {dash.db.absolute()} could not be read (run {rid}: "
            "insights.evidence): shown empty; they were changed outside gpuprof, or the file "
            "is damaged (a copy of it from before holds them)"
        ]
        w = pages()
        page = w.open(f"{dash.url}/#/run/{rid}")
        note = page.locator("#insights p.note")
        note.first.wait_for()
        assert [note.nth(i).text_content() for i in range(note.count())] == [
            f"Note: {api['unreadable'][0]}"
        ]
        assert page.locator("#insights li.insight[data-rule=damaged]").count() == 1
        assert w.errors == []
    finally:
        with closing(sqlite3.connect(dash.db)) as db, db:
            db.execute("DELETE FROM insights WHERE run_id = ? AND rule = 'damaged'", (rid,))


def test_a_findings_evidence_window_is_shown_and_linked(dash: Dash, runs: dict, pages):
    """A finding with an evidence window (stored as gpuprofd stores one): its
    top operators under the finding, and its link shows that window's
    operators in the Top kernels panel; "all windows" goes back."""
    rid = runs["rank0"]["id"]
    rows = [("aten::mm", 2, 19_600_000, 19_500_000), ("aten::mul", 5, 90_000, 60_000)]
    with closing(sqlite3.connect(dash.db)) as db, db:
        cur = db.execute(
            "INSERT INTO kernel_windows (run_id, t0_ns, t1_ns, source, steps, rows_dropped) "
            "VALUES (?, 1, 2, 'evidence', '[1267]', 0)",
            (rid,),
        )
        wid = cur.lastrowid
        for name, count, total, own in rows:
            db.execute(
                "INSERT INTO kernel_stats (window_id, run_id, name, kind, cls, count, total_ns, "
                "self_ns, flops) VALUES (?, ?, ?, 'op', 'compute', ?, ?, ?, NULL)",
                (wid, rid, name, count, total, own),
            )
        db.execute(
            "INSERT INTO evidence_windows (run_id, window_id, request_id, rule, time_kind, "
            "t0_ns, t1_ns, first_step, last_step) VALUES (?, ?, 'r1', 'high_step_variance', "
            "'cpu', 1, 2, 1267, 1267)",
            (rid, wid),
        )
        profile = {
            "request_id": "r1",
            "window_id": wid,
            "t0_ns": 1,
            "steps": [1267],
            "time": "cpu",
            "top": [
                {
                    "name": "aten::mm",
                    "kind": "op",
                    "count": 2,
                    "total_ms": 19.6,
                    "self_ms": 19.5,
                    "share": 0.9,
                },
                {
                    "name": "<b>aten::mul</b>",
                    "kind": "op",
                    "count": 5,
                    "total_ms": 0.09,
                    "self_ms": 0.06,
                    "share": 0.01,
                },
            ],
        }
        db.execute(
            "INSERT INTO insights (run_id, rule, severity, title, detail, fix, evidence, "
            "created_wall_ns) VALUES (?, 'high_step_variance', 'MED', 'slow every 8 steps', "
            "'', '', ?, 1)",
            (rid, json.dumps({"profile": profile})),
        )
    api = dash.get(f"/api/v1/runs/{rid}/kernels?evidence=r1")
    assert api["window"]["kind"] == "op" and api["kernels"][0]["name"] == "aten::mm"
    w = pages()
    page = w.open(f"{dash.url}/#/run/{rid}")
    item = page.locator('#insights li.insight[data-rule="high_step_variance"]')
    item.wait_for()
    assert item.locator(".insight-evidence").text_content() == (
        "Evidence: a profiler window of step 1267 (CPU time): aten::mm 19.5 ms self (90%), "
        "<b>aten::mul</b> 0.06 ms self (1%) · the window's operators"
    )
    # under the title, as the worth, detail and fix lines are (not at the bar)
    title_x = item.locator(".insight-title").bounding_box()["x"]
    assert abs(item.locator(".insight-evidence").bounding_box()["x"] - title_x) < 1
    item.locator("a.evidence-window").click()
    page.locator("#kernels .evidence-shown").wait_for()
    assert page.locator("#kernels h2").text_content() == "Evidence window"
    assert page.locator("#kernels td.kname").first.text_content() == "aten::mm"
    assert page.url.endswith(f"#/run/{rid}")  # the view stays; no route change
    page.locator("#kernels a.all-kernels").click()
    wait_until(page, "document.querySelector('#kernels h2').textContent === 'Top kernels'")
    assert w.errors == []


#: True once every chart's cursor is on and at the first chart's time (within
#: 2 px), and, given a time, before it: the charts follow one crosshair.
_CURSORS_FOLLOW = """(before) => {
    const us = [...document.querySelectorAll('.chart')].map(e => e.uplot);
    const xs = us.map(u => u.cursor.left !== null && u.cursor.left >= 0
                           ? u.posToVal(u.cursor.left, 'x') : null);
    if (!us.length || xs.some(x => x === null)) return false;
    const px = us.map(u => (u.scales.x.max - u.scales.x.min) / u.bbox.width * devicePixelRatio);
    const together = xs.every((x, i) => Math.abs(x - xs[0]) <= 2 * px[i]);
    return together && (before === null || xs[0] < before);
}"""


def test_one_crosshair_moves_on_every_chart(dash: Dash, runs: dict, pages):
    rid = runs["stall"]["id"]
    series = dash.get(f"/api/v1/runs/{rid}/series")
    assert series["gpus"] and (series["host"] or {}).get("t"), "GPU and host samples to chart"
    w = pages()
    page = w.open(f"{dash.url}/#/run/{rid}")
    before = chart_cursors(page)
    titles = [c["title"] for c in before]
    assert any("utilization" in t for t in titles), titles  # GPU rows are there (replay)
    assert any("CPU cores" in t for t in titles), titles
    assert len(before) >= 8
    steps_chart = page.locator("#steps .chart .u-over").first
    steps_chart.scroll_into_view_if_needed()  # below the findings: the mouse must reach it
    over = steps_chart.bounding_box()
    page.mouse.move(over["x"] + over["width"] * 0.6, over["y"] + over["height"] / 2)
    wait_until(page, _CURSORS_FOLLOW, timeout=15_000)  # however busy the box
    after = chart_cursors(page)
    source = after[0]["x"]
    assert source is not None
    for c in after:
        assert c["x"] is not None, f"{c['title']}: cursor did not move"
        assert abs(c["x"] - source) <= 2 * c["px"], (c, source)
        assert c["legend"] not in ("", "–"), c  # the hover value is in its legend
    # somewhere else: every chart follows again
    page.mouse.move(over["x"] + over["width"] * 0.2, over["y"] + over["height"] / 2)
    wait_until(page, _CURSORS_FOLLOW, arg=source, timeout=15_000)
    moved = chart_cursors(page)
    assert all(abs(c["x"] - moved[0]["x"]) <= 2 * c["px"] for c in moved)
    assert moved[0]["x"] < source
    assert w.errors == []


def _window_of(url: str) -> tuple[float, float]:
    q = parse_qs(urlparse(url).query)
    return float(q["from"][0]), float(q["to"][0])


#: The run of the window selector's test: steps at least ``LATE_SLEEP_S``
#: apart (its loader waits that long before each), then ``LATE_TAIL_S`` more
#: of the run without a step, so its steps lie in the first part of its span
#: only (as a short run's do when its end waits on a busy gpuprofd).
LATE_STEPS, LATE_SLEEP_S, LATE_TAIL_S = 20, 0.03, 4.0


@pytest.fixture(scope="module")
def late(dash: Dash) -> dict[str, Any]:
    """An ended run whose steps all lie in the first part of its span."""
    proc = dash.train(LATE_STEPS, LATE_SLEEP_S, "web-late", tail_s=LATE_TAIL_S)
    return dash.finish(proc, "web-late")


def test_an_older_windows_answer_arriving_last_is_dropped(dash: Dash, late: dict, pages):
    # the 5m window's steps answer is held back until the whole run's (asked
    # after it) is drawn: it must not redraw the page when it comes
    w = pages()
    held: list[Any] = []

    def hold_5m(route: Any) -> None:
        if "from=" in route.request.url and "parts=steps" in route.request.url and not held:
            held.append(route)
        else:
            route.continue_()

    page = w.open(f"{dash.url}/#/run/{late['id']}")
    wait_until(page, "Number(document.body.dataset.seriesLoaded) === 1")
    page.route("**/series?*", hold_5m)
    page.click("button[data-window='5m']")
    wait_until(page, "document.querySelector(\"button[data-window='5m']\").ariaPressed === 'true'")
    page.click("button[data-window='whole']")
    wait_until(page, "Number(document.body.dataset.seriesLoaded) === 2")
    assert len(held) == 1 and "from=" in held[0].request.url
    held[0].continue_()
    wait_until(page, "Number(document.body.dataset.seriesStale) === 1")
    assert page.evaluate("Number(document.body.dataset.seriesLoaded)") == 2
    assert page.get_attribute("button[data-window='whole']", "aria-pressed") == "true"
    assert w.errors == []


def test_window_selector_refetches_the_window(dash: Dash, late: dict, pages):
    run = dash.get(f"/api/v1/runs/{late['id']}")["run"]
    assert run["steps"] == LATE_STEPS
    w = pages(height=600)  # the steps chart below the fold, as taller insights put it
    page = w.open(f"{dash.url}/#/run/{run['id']}")
    with page.expect_request(lambda r: "/series?" in r.url and "from=" in r.url) as req:
        page.click("button[data-window='5m']")
    frm, to = _window_of(req.value.url)
    assert to == pytest.approx(run["end_s"], abs=1e-3)
    assert frm == pytest.approx(max(run["start_s"], run["end_s"] - 300), abs=1e-3)
    page.wait_for_selector("button[data-window='5m'][aria-pressed='true']")
    wait_until(page, "Number(document.body.dataset.seriesLoaded) === 2")
    # in the viewport whatever the insights above it hold (a mouse outside it drags nothing)
    over = page.locator("#steps .chart .u-over").first
    over.scroll_into_view_if_needed()
    # the steps as drawn (one per bucket: they are LATE_SLEEP_S apart), each
    # with its x on the page, and one x unit per pixel
    drawn = page.evaluate(
        """() => { const u = document.querySelector('#steps .chart').uplot;
             const o = u.over.getBoundingClientRect();
             const px = u.data[0].map((x) => o.left + u.valToPos(x, 'x'));
             const span = u.scales.x.max - u.scales.x.min;
             return {xs: u.data[0], px, unit: span / u.bbox.width * devicePixelRatio}; }"""
    )
    xs, px = drawn["xs"], drawn["px"]
    assert len(xs) == LATE_STEPS
    # a dragged range from between steps a-1 and a to between steps b and b+1:
    # it holds steps a..b whatever part of the run's span the steps lie in
    a, b = LATE_STEPS // 4, 3 * LATE_STEPS // 4
    x0, x1 = (px[a - 1] + px[a]) / 2, (px[b] + px[b + 1]) / 2
    gap_px = min(px[a] - px[a - 1], px[b + 1] - px[b])
    assert gap_px >= 4, f"steps {gap_px:.1f} px apart: the drag cannot fall between two"
    box = over.bounding_box()
    y = box["y"] + box["height"] / 2
    want = page.evaluate(
        """([a, b]) => { const u = document.querySelector('#steps .chart').uplot;
             const o = u.over.getBoundingClientRect();
             return [u.posToVal(a - o.left, 'x'), u.posToVal(b - o.left, 'x')]; }""",
        [x0, x1],
    )
    with page.expect_request(lambda r: "/series?" in r.url and "from=" in r.url) as req:
        page.mouse.move(x0, y)
        page.mouse.down()
        page.mouse.move(x1, y, steps=8)
        page.mouse.up()
    frm, to = _window_of(req.value.url)
    # the time under each end of the drag
    assert frm == pytest.approx(want[0], abs=2 * drawn["unit"])
    assert to == pytest.approx(want[1], abs=2 * drawn["unit"])
    assert xs[a - 1] < frm < xs[a] and xs[b] < to < xs[b + 1]
    page.wait_for_selector(".window-bar .range")
    wait_until(page, "Number(document.body.dataset.seriesLoaded) === 3")
    got = page.evaluate("document.querySelector('#steps .chart').uplot.data[0]")
    assert got == xs[a : b + 1]  # the window's steps, and only those
    with page.expect_request(lambda r: "/series?" in r.url and "from=" not in r.url):
        page.click("button[data-window='whole']")
    assert w.errors == []


def test_compare_view(dash: Dash, runs: dict, pages):
    a, b = runs["plain"], runs["stall"]
    w = pages()
    page = w.open(f"{dash.url}/#/compare/{a['id']},{b['id']}")
    heads = page.locator("#compare-figures thead th[scope=col]").all_text_contents()
    assert heads == [f"#{a['id']} web-plain", f"#{b['id']} web-stall"]
    assert page.locator("#compare-phases tbody tr").count() == 6
    u = page.evaluate(
        "(() => { const u = document.querySelector('#compare-chart .chart').uplot;"
        " return {series: u.series.length - 1,"
        " filled: u.data.slice(1).map(ys => ys.filter(v => v !== null).length)}; })()"
    )
    assert u["series"] == 2
    assert all(n >= 30 for n in u["filled"]), u  # each run's steps drawn
    assert w.errors == []


def test_compare_view_says_the_verdict_and_deltas_of_each_run_against_the_first(
    dash: Dash, runs: dict, pages
):
    stall, plain, hostile = (runs[k]["id"] for k in ("stall", "plain", "hostile"))
    want = dash.get(f"/api/v1/compare?a={stall}&b={plain}")
    w = pages()
    page = w.open(f"{dash.url}/#/compare/{stall},{plain},{hostile}")
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    pair = page.locator(f".pair[data-a='{stall}'][data-b='{plain}']")
    assert pair.locator(".verdict").text_content() == want["verdict"]
    assert want["verdict"].startswith("B is ") and " faster " in want["verdict"]
    # the findings resolved, new and changed, as the API has them
    shown = pair.locator("li[data-kind]").evaluate_all(
        "els => els.map(e => [e.dataset.kind, e.dataset.rule])"
    )
    kinds = ("resolved", "new", "changed", "unchanged")
    assert shown == [[k, e["rule"]] for k in kinds for e in want["findings"][k]]
    assert want["findings"]["unchanged"]  # the cost line at least: shown too
    wait = next(p for p in want["phases"] if p["phase"] == "loader_wait")
    cells = pair.locator("tr[data-phase='loader_wait'] td").all_text_contents()
    assert cells == [
        f"{wait['a_pct']:.1f}%",
        f"{wait['b_pct']:.1f}%",
        f"{wait['delta_pct']:.1f} pp",
    ]
    assert wait["delta_pct"] < 0  # the plain run waits less
    # the hostile-named run's pair: its name is text, nothing of it runs
    other = page.locator(f".pair[data-b='{hostile}'] h3 bdi").all_text_contents()
    assert HOSTILE in other
    assert page.evaluate("window.__pwned") is None
    assert w.errors == []


def test_a_regression_between_runs_of_two_names_is_shown_as_each_runs_own(
    dash: Dash, runs: dict, pages
):
    stall, plain = runs["stall"]["id"], runs["plain"]["id"]
    w = pages()

    def with_history(route: Any) -> None:
        # the pair's answer, plus what a regression of B's own name would add
        got = route.fetch().json()
        if "findings" not in got:  # the runs' figures (ids=), not a pair
            route.fulfill(json=got)
            return
        got["findings"]["history"] = [
            {"rule": "regression", "label": "regression", "severity_b": "MED", "title_b": HOSTILE}
        ]
        # and what a run too short for the rules leaves unjudged
        got["findings"]["unjudged"] = [
            {"rule": "kernel_drift", "label": "kernel drift", "severity_a": "HIGH", "title_a": "d"}
        ]
        route.fulfill(json=got)

    w.page.route("**/api/v1/compare?*", with_history)
    page = w.open(f"{dash.url}/#/compare/{stall},{plain}")
    pair = page.locator(f".pair[data-a='{stall}'][data-b='{plain}']")
    item = pair.locator("li[data-rule='regression']")
    assert item.count() == 1 and item.get_attribute("data-kind") == "B only"
    assert item.locator("div.muted").text_content() == HOSTILE
    short = pair.locator("li[data-rule='kernel_drift']")
    assert short.count() == 1 and short.get_attribute("data-kind") == "A only"
    assert page.evaluate("window.__pwned") is None
    assert w.errors == []


def _compared(page: Any) -> list[str]:
    page.wait_for_selector("body[data-ready='1']", timeout=30_000)
    return page.locator("#compare-figures thead th[scope=col] a.run-link").all_text_contents()


def test_the_compare_views_address_carries_its_runs(dash: Dash, runs: dict, pages):
    a, b, c = (runs[k]["id"] for k in ("plain", "stall", "rank0"))
    names = {a: f"#{a} web-plain", b: f"#{b} web-stall", c: f"#{c} web-rank0"}
    w = pages()
    page = w.open(f"{dash.url}/#/compare/{a},{b},{a},{c}")  # a repeat is dropped
    assert page.evaluate("location.hash") == f"#/compare/{a},{b},{c}"
    assert _compared(page) == [names[a], names[b], names[c]]
    page.click(f"button[data-remove='{b}']")  # the address follows
    wait_until(page, f"location.hash === '#/compare/{a},{c}'")
    assert _compared(page) == [names[a], names[c]]
    assert page.locator("button[data-remove]").count() == 0  # a compare needs two
    page.fill("#compare-add", str(b))
    page.press("#compare-add", "Enter")
    wait_until(page, f"location.hash === '#/compare/{a},{c},{b}'")
    assert _compared(page) == [names[a], names[c], names[b]]
    page.fill("#compare-add", "424242")  # no such run: said, and the address kept
    page.press("#compare-add", "Enter")
    page.wait_for_selector("#compare-add-error:not(:empty)")
    assert "no run 424242" in page.locator("#compare-add-error").text_content()
    assert page.evaluate("location.hash") == f"#/compare/{a},{c},{b}"
    # bookmarked: a new page at the address shows the same runs; back gives the last set
    other = pages().open(f"{dash.url}/#/compare/{a},{c},{b}")
    assert _compared(other) == [names[a], names[c], names[b]]
    page.go_back()
    wait_until(page, f"location.hash === '#/compare/{a},{c}'")
    assert _compared(page) == [names[a], names[c]]
    # the only error: the browser's own line for the 404 that said "no run 424242"
    assert w.errors == [f"console: {NOT_FOUND}"]


NOT_FOUND = "Failed to load resource: the server responded with a status of 404 (Not Found)"


def test_group_view(dash: Dash, runs: dict, pages):
    w = pages()
    page = w.open(f"{dash.url}/#/group/{quote(GROUP, safe='')}")
    assert page.locator("h1").text_content() == f"Group {GROUP}"
    rows = page.locator("#group-ranks tbody tr")
    assert rows.count() == 2
    links = [rows.nth(i).locator("a").get_attribute("href") for i in range(2)]
    assert links == [f"#/run/{runs['rank0']['id']}", f"#/run/{runs['rank1']['id']}"]
    group = dash.get(f"/api/v1/groups/{quote(GROUP, safe='')}")
    assert page.locator("#insights li.insight").count() == len(group["insights"])
    assert w.errors == []


#: The runs table's headers: words, not gpuprofctl's column names.
RUNS_HEADERS = [
    "", "ID", "Name", "Status", "Group", "Rank", "Node", "User", "Project", "Steps",
    "Median step (ms)", "Wait %", "Fwd %", "Bwd %", "Comm %", "Opt %", "Other %", "Skipped",
    "Eval", "Dropped", "Started", "Duration",
]  # fmt: skip


def runs_table_fit(page: Any) -> dict[str, int]:
    """The runs table's width and its box's: the table fits when it is no wider."""
    return page.evaluate(
        """() => { const box = document.querySelector('#runs');
                   return {table: box.querySelector('table.runs').scrollWidth,
                           box: box.clientWidth, page: document.documentElement.scrollWidth,
                           viewport: innerWidth}; }"""
    )


def test_the_runs_table_has_readable_headers_and_fits_1400px(dash: Dash, runs: dict, pages):
    rid = runs["plain"]["id"]
    with closing(sqlite3.connect(dash.db)) as db, db:  # 4 ms of evaluation after its last step
        db.execute("UPDATE runs SET trailing_eval_ns = 4000000 WHERE id = ?", (rid,))
    try:
        w = pages(width=1400, height=900)
        page = w.open(f"{dash.url}/#/runs")
        heads = page.locator("table.runs thead th").all_inner_texts()
        assert [" ".join(t.split()) for t in heads] == RUNS_HEADERS  # a header may wrap
        row = page.locator(f"table.runs tbody tr[data-run='{rid}']")
        cells = row.locator("td").all_inner_texts()
        assert cells[RUNS_HEADERS.index("Eval")] == "4 ms"  # not "0.0"
        api = next(r for r in dash.get("/api/v1/runs")["runs"] if r["id"] == rid)
        assert api["eval_s"] == 0.004  # the data stays in seconds
        assert cells[RUNS_HEADERS.index("Median step (ms)")] == f"{api['median_step_ms']:.1f}"
        # a 10 kB hostile name and a group among the rows, and still no sideways scroll
        fit = runs_table_fit(page)
        assert fit["table"] <= fit["box"] and fit["page"] <= fit["viewport"], fit
        assert w.errors == []
    finally:
        with closing(sqlite3.connect(dash.db)) as db, db:
            db.execute("UPDATE runs SET trailing_eval_ns = 0 WHERE id = ?", (rid,))


def test_the_runs_table_fits_1400px_with_realistic_long_values(dash: Dash, runs: dict, pages):
    """Two runs of a sweep on two nodes of a cluster: name, group, host and user
    long at once. No sideways scroll; what is cut has its whole value as the
    tooltip; the nodes read differently."""
    ids = [runs["plain"]["id"], runs["stall"]["id"]]
    cols = "run_name, group_id, host, user_name"
    with closing(sqlite3.connect(dash.db)) as db, db:
        was = [db.execute(f"SELECT {cols} FROM runs WHERE id = ?", (i,)).fetchone() for i in ids]
        for rid, host, user in zip(ids, rt.HOSTS, rt.USERS, strict=True):
            sql = f"UPDATE runs SET ({cols}) = (?, ?, ?, ?) WHERE id = ?"
            db.execute(sql, (rt.NAME, rt.GROUP, host, user, rid))
    try:
        w = pages(width=1400, height=900)
        page = w.open(f"{dash.url}/#/runs")
        full = {
            str(rid): {"name": rt.NAME, "group": rt.GROUP, "node": host, "user": user}
            for rid, host, user in zip(ids, rt.HOSTS, rt.USERS, strict=True)
        }
        rt.assert_fits_and_tells_apart(rt.runs_table(page), full)
        assert w.errors == []
    finally:
        with closing(sqlite3.connect(dash.db)) as db, db:
            for rid, old in zip(ids, was, strict=True):
                db.execute(f"UPDATE runs SET ({cols}) = (?, ?, ?, ?) WHERE id = ?", (*old, rid))


def test_hostile_run_name_is_text(dash: Dash, runs: dict, pages):
    rid = runs["hostile"]["id"]
    for view in ("#/runs", f"#/run/{rid}", f"#/compare/{rid},{runs['plain']['id']}"):
        w = pages()
        page = w.open(f"{dash.url}/{view}")
        texts = page.evaluate(
            "[...document.querySelectorAll('bdi')].map(e => e.textContent)"
            ".filter(t => t.startsWith('<script>'))"
        )
        assert HOSTILE in texts, view
        assert page.evaluate("window.__pwned") is None, view
        assert page.locator("main script, main img").count() == 0, view
        assert w.errors == [], view
    # the run's own page: its name heads it and the error line says it, as text
    page = pages().open(f"{dash.url}/#/run/{rid}")
    assert page.locator("h1.run-name bdi").text_content() == HOSTILE
    assert page.locator("#run-head .error bdi").text_content() == HOSTILE
    # a 10 kB name stays inside the page's width
    assert page.evaluate("document.documentElement.scrollWidth <= innerWidth")


def test_every_view_renders_without_errors_and_screenshots(
    dash: Dash, runs: dict, pages, shots: Path
):
    views = {
        "runs": "#/runs",
        "run": f"#/run/{runs['stall']['id']}",
        "compare": f"#/compare/{runs['stall']['id']},{runs['plain']['id']}",  # the fix as B
        "group": f"#/group/{quote(GROUP, safe='')}",
    }
    for name, view in views.items():
        for scheme in ("light", "dark") if name == "run" else ("light",):
            w = pages(color_scheme=scheme)
            page = w.open(f"{dash.url}/{view}")
            page.wait_for_timeout(300)  # the charts' first frame
            suffix = "-dark" if scheme == "dark" else ""
            path = shots / f"{name}{suffix}.png"
            page.screenshot(path=str(path), full_page=True)
            assert path.stat().st_size > 10_000
            assert w.errors == [], (name, scheme)
    # a laptop screen and a 4K one: the run page fits the width, every chart drawn
    for label, (width, height) in {"laptop": (1366, 768), "4k": (3840, 2160)}.items():
        w = pages(width=width, height=height)
        page = w.open(f"{dash.url}/{views['run']}")
        page.wait_for_timeout(300)
        fit = page.evaluate(
            """() => ({over: document.documentElement.scrollWidth - innerWidth,
                       widths: [...document.querySelectorAll('.chart')].map(e => e.uplot.width)})"""
        )
        assert fit["over"] <= 0, (label, fit)  # nothing wider than the screen
        # the step chart spans the page; every other chart is a readable size
        assert fit["widths"] and fit["widths"][0] >= 0.5 * width, (label, fit)
        assert min(fit["widths"]) >= 200, (label, fit)
        path = shots / f"run-{label}.png"
        page.screenshot(path=str(path), full_page=False)
        assert path.stat().st_size > 10_000 and w.errors == [], label
    # an unknown run: the daemon's own message, and still no console error
    w = pages()
    page = w.open(f"{dash.url}/#/run/999999")
    assert "no run 999999" in page.locator(".error").text_content()
    assert [e for e in w.errors if "404" not in e] == []


def test_live_reconnects_from_its_cursors_and_reset_refetches(dash: Dash, runs: dict, pages):
    """The page's socket cut: it reconnects by itself and resends the cursors
    it holds; a server's reset: it re-fetches /series and sends new cursors."""
    proc = dash.train(600, 0.05, "web-resume")
    row = dash.wait_run("web-resume", lambda r: r["status"] == "running" and r["steps"] > 5, "run")
    w = pages()
    hellos: list[tuple[int, dict]] = []
    routes: list[Any] = []

    def route(ws: Any) -> None:
        server = ws.connect_to_server()
        n = len(routes)
        routes.append(ws)

        def from_page(message: str | bytes) -> None:
            hellos.append((n, json.loads(message)))
            server.send(message)

        ws.on_message(from_page)

    w.page.route_web_socket("**/api/v1/live", route)
    page = w.open(f"{dash.url}/#/run/{row['id']}")
    steps = "Number(document.querySelector('#run-steps').dataset.steps)"
    wait_until(page, f"{steps} >= {page.evaluate(steps) + 5}", timeout=60_000)
    assert [n for n, _ in hellos] == [0]
    routes[0].close()  # the socket drops
    held = page.evaluate(steps) - 1
    wait_until(page, "document.body.dataset.live === 'open'", timeout=15_000)
    wait_until(page, f"{steps} >= {held + 6}", timeout=60_000)  # steps flow again
    again = [h for n, h in hellos if n == 1]
    assert again and again[0]["run"] == row["id"]
    assert again[0]["cursors"]["step"] == held  # resumed where it was, nothing repeated
    # a reset from the server: the window is fetched again, then new cursors go out
    sent = len(hellos)
    with page.expect_request(lambda r: "/series" in r.url):
        routes[1].send(json.dumps({"type": "reset"}))
    wait_until(page, "Number(document.body.dataset.seriesLoaded) === 2")
    wait_until(page, f"{steps} >= {page.evaluate(steps) + 3}", timeout=60_000)
    after = [h for _, h in hellos[sent:]]
    assert after and after[0]["cursors"]["step"] >= held
    proc.kill()
    proc.communicate(timeout=30)
    assert w.errors == []


def test_the_pcie_chart_draws_the_slow_loops_readings(dash: Dash, runs: dict, pages):
    """The PCIe counters are read once a second, the fast loop ten times: the
    chart holds each reading and joins them into a line, not isolated dots."""
    rid = runs["stall"]["id"]
    series = dash.get(f"/api/v1/runs/{rid}/series")
    rx = [v for v in series["gpus"][0]["pcie_rx_bps"] or [] if v is not None]
    assert len(rx) >= 2, "the replayed H200's PCIe readings in the run's window"
    page = pages().open(f"{dash.url}/#/run/{rid}")
    chart = page.evaluate(
        """(() => { const e = [...document.querySelectorAll('.chart')]
                      .find(c => c.dataset.title === 'PCIe');
                    if (!e) return null;
                    const u = e.uplot;
                    return {rx: u.data[1].filter(v => v !== null && v !== undefined).length,
                            joined: u.series[1].spanGaps && u.series[2].spanGaps}; })()"""
    )
    assert chart == {"rx": len(rx), "joined": True}


def test_no_y_axis_repeats_a_label(dash: Dash, runs: dict, pages):
    """Each chart's y ticks read differently (a page cache between 5.21 and
    5.24 GB once read "5.2 GB" on every tick, one between 4.3925 and
    4.3935 GB "4.393 GB" twice)."""
    w = pages()
    page = w.open(f"{dash.url}/#/run/{runs['stall']['id']}")
    page.wait_for_selector(".chart[data-title='page cache']")
    axes = page.evaluate(
        """[...document.querySelectorAll('.chart')].map(c =>
             [c.dataset.title, (c.uplot.axes[1]._values || []).slice()])"""
    )
    drawn = {title: values for title, values in axes if values}
    assert "page cache" in drawn and len(drawn) >= 5
    assert {t: v for t, v in drawn.items() if len(set(v)) != len(v)} == {}
    got = page.evaluate(
        """import('/static/format.js').then(f => [
             [5.21e9, 5.22e9, 5.23e9].map(v => f.bytesOnAxis(v, [5.21e9, 5.22e9, 5.23e9])),
             [0, 5e8, 1e9].map(v => f.bytesOnAxis(v, [0, 5e8, 1e9])),
             [0, 200, 400].map(v => f.bytesOnAxis(v, [0, 200, 400])),
             [4.3925e9, 4.393e9, 4.3935e9].map((v, _, s) => f.bytesOnAxis(v, s)),
             [f.tickDigits([0.0005, 0.001, 0.0015])],
             f.bps(2.5e6, 0, [0, 2.5e6, 5e6])])"""
    )
    assert got == [
        ["5.21 GB", "5.22 GB", "5.23 GB"],
        ["0.0 GB", "0.5 GB", "1.0 GB"],
        ["0 B", "200 B", "400 B"],
        ["4392.5 MB", "4393.0 MB", "4393.5 MB"],
        [4],
        "2.5 MB/s",
    ]
    assert w.errors == []


def test_a_cpu_only_runs_trace_windows_show_their_operators(dash: Dash, runs: dict, pages):
    """Trace windows holding operators only (a CPU-only run's): the panel
    lists them by self CPU time, not "no kernel traces"."""
    rid = runs["hostile"]["id"]
    assert dash.get(f"/api/v1/runs/{rid}/kernels")["windows"] == 0
    rows = [("aten::addmm", 40, 9_000_000, 8_000_000), (HOSTILE, 40, 2_000_000, 2_000_000)]
    with closing(sqlite3.connect(dash.db)) as db, db:
        for t0 in (1, 3):
            wid = db.execute(
                "INSERT INTO kernel_windows (run_id, t0_ns, t1_ns, source, steps, rows_dropped) "
                "VALUES (?, ?, ?, 'snapshot', '[10]', 0)",
                (rid, t0, t0 + 1),
            ).lastrowid
            for name, count, total, own in rows:
                db.execute(
                    "INSERT INTO kernel_stats (window_id, run_id, name, kind, cls, count, "
                    "total_ns, self_ns, flops) VALUES (?, ?, ?, 'op', 'compute', ?, ?, ?, NULL)",
                    (wid, rid, name, count, total, own),
                )
    api = dash.get(f"/api/v1/runs/{rid}/kernels")
    assert api["windows"] == 2 and [k["kind"] for k in api["kernels"]] == ["op", "op"]
    assert [k["name"] for k in api["kernels"]] == ["aten::addmm", HOSTILE]
    assert api["kernels"][0]["share"] == pytest.approx(0.8)  # 16 of 20 ms self CPU time
    w = pages()
    page = w.open(f"{dash.url}/#/run/{rid}")
    page.locator("#kernels td.kname").first.wait_for()
    assert page.locator("#kernels h2").text_content() == "Top operators"
    assert page.locator("#kernels td.kname").all_text_contents() == ["aten::addmm", HOSTILE]
    assert page.evaluate("window.__pwned") is None
    assert w.errors == []
