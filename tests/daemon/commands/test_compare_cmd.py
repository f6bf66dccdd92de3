"""``gpuprofctl compare`` on a database written by a real daemon: runs of
controlled step times, their findings made by the daemon's own rules."""

from __future__ import annotations

import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuprofd.ctl import main
from tests.daemon import helpers as h

MS = 1_000_000
STEPS = 43  # 3 warm-up steps, then 40: half of each of two iteration times


def _steps(key: str, base: int, waits: tuple[int, int], steps: tuple[int, int]) -> list[dict]:
    """*STEPS* steps alternating between two waits and two step times (ms);
    phases: a third forward, half backward, a sixth optimizer."""
    out, t = [], base
    for i in range(STEPS):
        wait, step = waits[i % 2] * MS, steps[i % 2] * MS
        phases = {"forward": step // 3, "backward": step // 2, "optimizer": step // 6}
        out.append(
            {
                "v": 1,
                "type": "step",
                "run_key": key,
                "i": i,
                "t0": t + wait,
                "t1": t + wait + step,
                "wait": wait,
                "explicit": True,
                "micro": 1,
                "phases": phases,
            }
        )
        t += wait + step
    return out


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """1 ``stalled``: 36 ms loader wait (34/38) + 24 ms step, 60 ms a
    iteration; 2 ``fixed``: 1 ms wait + 19 ms step (18/20), 20 ms; 3
    ``fixed`` again, 30 ms (28/30 ms steps); 4 ``empty``: no steps; 5 and 6
    ``bs``: 64 then 256 samples a step (declared), 20 then 30 ms."""
    tmp = tmp_path_factory.mktemp("compare")
    sock = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    daemons = h.Daemons(tmp)
    runs = (
        ("a", "stalled", (34, 38), (24, 24)),
        ("b", "fixed", (1, 1), (18, 20)),
        ("c", "fixed", (1, 1), (28, 30)),
    )
    try:
        path = tmp / "g.db"
        proc, client = daemons.start_ready(sock, path)
        base = time.monotonic_ns()
        for key, name, waits, steps in runs:
            client.request(h.hello(key, os.getpid(), run_name=name))
            for s in _steps(key, base, waits, steps):
                client.push(s)
            # the bye waits for the run's end (its findings, its median) to be stored
            assert client.request(h.bye(key, sent=STEPS))["ok"]
            base += 10_000 * MS
        client.request(h.hello("d", os.getpid(), run_name="empty"))
        assert client.request(h.bye("d", sent=0))["ok"]
        base += 10_000 * MS
        # 5 and 6 "bs": 64 samples a step at 20 ms, then 256 at 30 ms (2.7x faster a sample)
        for key, samples, steps in (("e", 64, (19, 21)), ("f", 256, (29, 31))):
            options = {"samples_per_step": samples}
            client.request(h.hello(key, os.getpid(), run_name="bs", options=options))
            for s in _steps(key, base, (0, 0), steps):
                client.push(s)
            assert client.request(h.bye(key, sent=STEPS))["ok"]
            base += 10_000 * MS
        assert daemons.stop(proc) == 0
        yield path
    finally:
        daemons.kill_all()
        for p in sock.iterdir():
            p.unlink()
        sock.rmdir()


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    got = capsys.readouterr()
    return rc, got.out, got.err


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    rc, out, err = _run(capsys, *args, "--format", "json")
    assert rc == 0, err
    return orjson.loads(out)


def test_compare_by_id_names_the_speed_up_phases_and_resolved_findings(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _json(capsys, "compare", str(db), "1", "2")
    assert (got["a"]["run_id"], got["b"]["run_id"]) == (1, 2)
    assert (got["a"]["mean_iteration_ms"], got["b"]["mean_iteration_ms"]) == (60.0, 20.0)
    assert (got["a"]["median_iteration_ms"], got["b"]["median_iteration_ms"]) == (60.0, 20.0)
    assert (got["a"]["steps_per_s"], got["b"]["steps_per_s"]) == (16.667, 50.0)
    assert got["a"]["steady_steps"] == STEPS - 3
    assert got["speedup"] == 3.0  # exact: the means are 60 and 20 ms
    assert got["ci_low"] < 3.0 < got["ci_high"] and got["within_noise"] is False
    assert got["basis"] == {"unit": "iteration", "units_a": 1.0, "units_b": 1.0, "note": None}
    wait = next(p for p in got["phases"] if p["phase"] == "loader_wait")
    assert (wait["a_ms"], wait["b_ms"], wait["a_pct"], wait["b_pct"]) == (36.0, 1.0, 60.0, 5.0)
    assert wait["delta_ms"] == -35.0 and wait["delta_pct"] == -55.0
    # the findings are the daemon's own: what run 1 had and run 2 has not is resolved
    found_a = {f["rule"] for f in _json(capsys, "insights", str(db), "1")["insights"]}
    found_b = {f["rule"] for f in _json(capsys, "insights", str(db), "2")["insights"]}
    assert {e["rule"] for e in got["findings"]["resolved"]} == found_a - found_b
    assert "dataloader_stall" in found_a - found_b
    assert re.fullmatch(
        r"B is 3\.0× faster \(95 % CI 2\.\d+–3\.\d+\): loader wait fell from 60 % to 5 %; "
        r'(.*")?"loader stall"(".*)? (is|are) resolved\.',
        got["verdict"],
    ), got["verdict"]


def test_compare_text_ends_in_the_verdict(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    verdict = _json(capsys, "compare", str(db), "1", "2")["verdict"]
    rc, out, _ = _run(capsys, "compare", str(db), "1", "2")
    lines = out.splitlines()
    assert rc == 0
    assert lines[:2] == [
        "A: run 1  stalled  (finished, 43 steps)",
        "B: run 2  fixed  (finished, 43 steps)",
    ]
    assert lines[-1] == verdict
    assert any(re.fullmatch(r"mean iteration +60\.0 ms +20\.0 ms +-67 %", line) for line in lines)
    assert any(line.startswith("  resolved   [") and "loader stall" in line for line in lines)


def test_a_name_means_its_latest_run(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    got = _json(capsys, "compare", str(db), "stalled", "fixed")
    assert (got["a"]["run_id"], got["b"]["run_id"]) == (1, 3)
    assert got["speedup"] == pytest.approx(60 / 30, abs=1e-4)


def test_the_regression_rule_is_the_compares_test(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run 3 is run 2's name, 30 vs 20 ms: its stored regression finding is
    what compare 2 3 says, to the last digit of the interval."""
    got = _json(capsys, "compare", str(db), "2", "3")
    (reg,) = [
        f for f in _json(capsys, "insights", str(db), "3")["insights"] if f["rule"] == "regression"
    ]
    ev = reg["evidence"]
    assert (ev["speedup"], ev["ci_low"], ev["ci_high"]) == (
        got["speedup"],
        got["ci_low"],
        got["ci_high"],
    )
    assert (ev["mean_iteration_ms"], ev["baseline_ms"]) == (30.0, 20.0)
    assert reg["title"].startswith("Regression vs the previous run of 'fixed': iteration 30.0 ms")
    assert got["verdict"].startswith("B is 1.50× slower (95 % CI 1.")
    assert {e["rule"] for e in got["findings"]["new"]} >= {"regression"}


def test_default_db_storage_url_and_a_url_as_db_read_alike(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    by_path = _run(capsys, "compare", str(db), "1", "2", "--format", "json")
    url = f"sqlite://{db.absolute()}"
    assert _run(capsys, "compare", "1", "2", "--format", "json", "--storage-url", url) == by_path
    assert _run(capsys, "compare", url, "1", "2", "--format", "json") == by_path
    monkeypatch.setenv("GPUPROF_DB", str(db))
    assert _run(capsys, "compare", "1", "2", "--format", "json") == by_path
    rc, _, err = _run(capsys, "compare", str(db), "1", "2", "--storage-url", url)
    assert rc == 2 and "give DB or --storage-url, not both" in err


@pytest.mark.parametrize(
    "args, says",
    [
        (["1", "99"], "no run 99 in {db} (runs 1-6; see gpuprofctl runs {db})"),
        (
            ["nope", "1"],
            "no run named 'nope' in {db} (names here, newest first: bs, empty, fixed, stalled; "
            "see gpuprofctl runs {db})",
        ),
        (["2", "2"], "both name run 2: give two different runs"),
        (["1", "4"], "run 4 ('empty') has no timed steps to compare"),
        (["0", "1"], "'0' is not a run id: a whole number from 1"),
    ],
)
def test_bad_runs_are_one_line_errors(
    db: Path, capsys: pytest.CaptureFixture[str], args: list[str], says: str
) -> None:
    rc, out, err = _run(capsys, "compare", str(db), *args)
    assert (rc, out) == (2, "")
    assert err == f"gpuprofctl: error: {says.format(db=db.absolute())}\n"


def test_wrong_argument_counts_are_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["compare"], ["compare", "1"], ["compare", "a.db", "1", "2", "3"]):
        rc, _, err = _run(capsys, *args)
        assert rc == 2 and "give [DB] A B: two runs to compare" in err, args


COMMANDS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "gpuprofctl.md"


def test_help_and_the_commands_page_name_every_json_field(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    got = _json(capsys, "compare", str(db), "1", "2")
    section = COMMANDS_PAGE.read_text().split("\n## gpuprofctl compare\n", 1)[1]
    fields = section.split("\n### compare --format json\n", 1)[1]
    entries = [e for kind in got["findings"].values() for e in kind]
    keys = {*got, *got["a"], *got["basis"], *got["phases"][0], *got["findings"]}
    keys |= {k for e in entries for k in e}
    assert [k for k in sorted(keys) if not re.search(rf"\b{k}\b", fields)] == []
    assert main(["compare", "--help"]) == 0
    assert "docs/gpuprofctl.md" in capsys.readouterr().out


def test_a_resolved_findings_predicted_gain_is_shown_beside_it(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuprofd.commands.compare import format_compare

    got = _json(capsys, "compare", str(db), "1", "2")
    plain = format_compare(got)
    stall = next(e for e in got["findings"]["resolved"] if e["rule"] == "dataloader_stall")
    # the stored finding's own gain (gpuprof.insights.gains) comes with it
    stored = _json(capsys, "insights", str(db), "1", "--format", "json")
    mine = next(i for i in stored["insights"] if i["rule"] == "dataloader_stall")
    assert stall["gain_a"]["gain_speedup_max"] == mine["gain_speedup_max"] > 1
    assert "loader stall (predicted: up to" in plain
    stall["gain_a"] = {"gain_speedup_max": 2.3, "gain_ms_per_iteration": 34.0}
    line = next(x for x in format_compare(got).splitlines() if "loader stall" in x)
    assert line == "  resolved   [HIGH] loader stall (predicted: up to 2.3× faster)"
    stall["gain_a"] = {}  # a finding without a gain: none shown
    assert "predicted" not in format_compare(got)


def test_a_regression_of_another_names_run_is_shown_as_that_runs_own(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuprofd.commands.compare import format_compare

    got = _json(capsys, "compare", str(db), "1", "2")  # "stalled" against "fixed"
    assert got["findings"]["history"] == []
    got["findings"]["history"] = [
        {"rule": "regression", "label": "regression", "severity_b": "MED", "title_b": "31% slower"}
    ]
    lines = format_compare(got).splitlines()
    at = lines.index("  B only     [MED] regression (against B's own earlier runs)")
    assert lines[at + 1] == "             31% slower"
    assert not any(x.startswith("  resolved") and "regression" in x for x in lines)


def test_a_finding_of_one_run_beside_a_too_short_run_is_said_unjudged(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuprofd.commands.compare import format_compare

    got = _json(capsys, "compare", str(db), "1", "2")
    got["b"]["steady_steps"] = 2
    got["findings"]["unjudged"] = [
        {"rule": "dataloader_stall", "label": "loader stall", "severity_a": "HIGH", "title_a": "t"}
    ]
    lines = format_compare(got).splitlines()
    at = lines.index("  A only     [HIGH] loader stall (too few steady steps to judge: 40 and 2)")
    assert lines[at + 1] == "             t"
    got["b"].update(steady_steps=40, status="running")  # not judged yet
    assert "  A only     [HIGH] loader stall (B running, not judged yet)" in (
        format_compare(got).splitlines()
    )


def test_a_run_doing_more_work_an_iteration_is_no_regression_per_sample(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # run 6 takes 1.5x the iteration of run 5 for 4x its samples
    rules = {f["rule"] for f in _json(capsys, "insights", str(db), "6")["insights"]}
    assert "regression" not in rules
    got = _json(capsys, "compare", str(db), "5", "6")
    assert got["basis"]["unit"] == "sample" and got["speedup"] == pytest.approx(4 / 1.5, rel=0.05)
    assert got["findings"]["new"] == [] or "regression" not in {
        e["rule"] for e in got["findings"]["new"]
    }


def test_insights_takes_a_run_name_as_compare_does(
    db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    by_name = _json(capsys, "insights", str(db), "fixed")
    assert (by_name["run_id"], by_name["run_name"]) == (3, "fixed")  # the latest of the name
    assert _json(capsys, "insights", str(db), "stalled")["run_id"] == 1
    monkeypatch.setenv("GPUPROF_DB", str(db))  # a lone name: the default database's run
    assert _json(capsys, "insights", "stalled")["run_id"] == 1
    assert _json(capsys, "insights", "2")["run_id"] == 2  # a lone id, as before
    rc, _, err = _run(capsys, "insights", "no such run")
    assert rc == 2 and "no run named 'no such run'" in err
    # a lone *.db path that does not exist is a database, not a run name
    rc, _, err = _run(capsys, "insights", "missing.db")
    assert rc == 2 and "no database at missing.db" in err


def test_an_unchanged_finding_whose_figures_moved_shows_both_titles(
    db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuprofd.commands.compare import format_compare

    got = _json(capsys, "compare", str(db), "1", "2")
    stall = {"rule": "dataloader_stall", "label": "loader stall", "severity_a": "HIGH"}
    got["findings"]["unchanged"] = [
        {**stall, "title_a": "84% waiting", "severity_b": "HIGH", "title_b": "39% waiting"},
        {**stall, "rule": "x", "title_a": "same", "severity_b": "HIGH", "title_b": "same"},
    ]
    lines = format_compare(got).splitlines()
    at = lines.index("  unchanged  [HIGH] loader stall")
    assert lines[at + 1 : at + 3] == ["             A: 84% waiting", "             B: 39% waiting"]
    assert lines[at + 4] == "             B: same"  # the same title: said once


def test_a_run_named_by_a_number_no_run_has_as_id_is_found_by_its_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # gpuprof.profile("7"): "7" read as run id 7, which does not exist, left
    # the run unreachable by its name
    sock = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    daemons = h.Daemons(tmp_path)
    path = tmp_path / "n.db"
    try:
        proc, client = daemons.start_ready(sock, path)
        base = time.monotonic_ns()
        for key, name in (("a", "7"), ("b", "b")):
            client.request(h.hello(key, os.getpid(), run_name=name))
            for s in _steps(key, base, (1, 1), (18, 20)):
                client.push(s)
            assert client.request(h.bye(key, sent=STEPS))["ok"]
            base += 10_000 * MS
        assert daemons.stop(proc) == 0
    finally:
        daemons.kill_all()
        for p in sock.iterdir():
            p.unlink()
        sock.rmdir()
    assert _json(capsys, "insights", str(path), "7")["run_id"] == 1  # no run 7: the name
    assert _json(capsys, "insights", str(path), "2")["run_id"] == 2  # an id first
    got = _json(capsys, "compare", str(path), "7", "b")
    assert (got["a"]["run_id"], got["a"]["run_name"], got["b"]["run_id"]) == (1, "7", 2)
    rc, _, err = _run(capsys, "compare", str(path), "9", "b")
    assert rc == 2 and f"no run 9 in {path} (runs 1-2" in err
