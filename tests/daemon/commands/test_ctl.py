"""gpuprofctl on a database written by a real daemon, and against a live one."""

from __future__ import annotations

import json
import os
import platform
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuprof.protocol import PROTOCOL_VERSION
from gpuprof.summary import format_summary
from gpuprofd.commands.insights import LIVE_NOTE
from gpuprofd.ctl import main
from gpuprofd.sampling.nvml import NO_GPU_NOTE
from gpuprofd.storage import schema
from tests.daemon import helpers as h

GIB = 2**30


@pytest.fixture(scope="module")
def real_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A DB with run 1 finished (12 steps) and run 2 still running (3 steps)."""
    tmp = tmp_path_factory.mktemp("ctl")
    sock = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    daemons = h.Daemons(tmp)
    try:
        db = tmp / "g.db"
        proc, client = daemons.start_ready(sock, db)
        client.request(h.hello("done", os.getpid(), run_name="baseline"))
        base = time.monotonic_ns()
        for i in range(12):
            client.push(h.step("done", i, base))
        assert client.request(h.bye("done", sent=12, dropped=2))["ok"]
        client.request(h.hello("live", os.getpid(), run_name="ongoing"))
        for i in range(3):
            client.push(h.step("live", i, base))
        client.wait_for(lambda r: r["received"] == 15)
        assert daemons.stop(proc) == 0
        yield db
    finally:
        daemons.kill_all()
        for p in sock.iterdir():
            p.unlink()
        sock.rmdir()


def test_runs_json_has_exact_breakdown(real_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", str(real_db), "--format", "json"]) == 0
    rows = orjson.loads(capsys.readouterr().out)
    assert [(r["id"], r["run_name"], r["status"], r["steps"]) for r in rows] == [
        (2, "ongoing", "running", 3),
        (1, "baseline", "finished", 12),
    ]
    done = rows[1]
    # every share is of the 18 ms iteration (8 ms wait + 10 ms step with
    # phases 3/4/2 ms), so together they make 100
    assert done["pct_of_iteration"] == {
        "loader_wait": 44.4,
        "forward": 16.7,
        "backward": 22.2,
        "comm": None,
        "optimizer": 11.1,
        "other": 5.6,
    }
    assert sum(v for v in done["pct_of_iteration"].values() if v) == pytest.approx(100.0)
    assert done["steps_counted"] == 11  # step 0 left out
    assert "phase_pct" not in done and "loader_wait_pct" not in done
    assert done["dropped_events"] == 2
    assert done["median_step_ms"] == 18.0
    assert rows[0]["median_step_ms"] == 18.0  # running: computed from its steps


def test_runs_text_table(real_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", str(real_db)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "ID  NAME      STATUS    STEPS  MICRO  MEDIAN_STEP_MS  WAIT%  FWD%  BWD%  COMM%  OPT%"
        "  OTHER%  SKIPPED  EVAL  DROPPED",
        "2   ongoing   running       3      1            18.0   44.4  16.7  22.2      -  11.1"
        "     5.6        0     -        0",
        "1   baseline  finished     12      1            18.0   44.4  16.7  22.2      -  11.1"
        "     5.6        0     -        2",
    ]


def test_runs_table_says_a_short_evaluation_in_ms(
    real_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpuprofd.commands.runs import format_table

    assert main(["runs", str(real_db), "--format", "json"]) == 0
    rows = orjson.loads(capsys.readouterr().out)
    rows[0]["eval_s"], rows[1]["eval_s"] = 0.004, 12.345  # as the JSON keeps them: seconds
    lines = format_table(rows).splitlines()
    assert lines[0].split()[-2:] == ["EVAL", "DROPPED"]
    assert lines[1].endswith("0    4 ms        0") and lines[2].endswith("0  12.3 s        2")


def test_runs_table_keeps_columns_under_wide_and_hostile_names(
    real_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rich.cells import cell_len

    from gpuprofd.commands.runs import format_table

    assert main(["runs", str(real_db), "--format", "json"]) == 0
    rows = orjson.loads(capsys.readouterr().out)
    rows[0]["run_name"] = "🚀 rocket 训练"  # two wide characters... and three
    rows[1]["run_name"] = "evil\x1b[2J" + "x" * 60
    lines = format_table(rows).splitlines()
    words = ("STATUS", rows[0]["status"], rows[1]["status"])
    status_at = [line.index(f"  {w} ") + 2 for line, w in zip(lines, words, strict=True)]
    # STATUS starts in the same terminal cell on every line
    assert len({cell_len(line[:i]) for line, i in zip(lines, status_at, strict=True)}) == 1, lines
    assert "\x1b" not in "".join(lines) and "evil\\x1b[2J" in lines[2]
    assert "…" in lines[2] and "🚀 rocket 训练" in lines[1]


def _iteration(
    run_key: str, i: int, t0: int, wait: int, step: int, phases: dict[str, int], micro: int = 1
) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "step",
        "run_key": run_key,
        "i": i,
        "t0": t0,
        "t1": t0 + step,
        "wait": wait,
        "explicit": True,
        "micro": micro,
        "phases": phases,
    }


def test_runs_shares_skip_step_0_and_fold_the_data_phase_into_wait(
    daemons, sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], my_pid: int
) -> None:
    db = tmp_path / "g.db"
    proc, client = daemons.start_ready(sock_dir, db)
    ms = 1_000_000
    base = time.monotonic_ns()
    client.request(h.hello("accum", my_pid, run_name="accum"))
    # step 0: 500 ms start-up wait and a 50 ms step, which no share may count
    client.push(_iteration("accum", 0, base, 500 * ms, 50 * ms, {"forward": 40 * ms}))
    t0 = base + 550 * ms
    for i in range(1, 8):  # 2 ms wait + 10 ms step: fwd 2, bwd 3, opt 1, data 2, rest 2
        phases = {"forward": 2 * ms, "backward": 3 * ms, "optimizer": 1 * ms, "data": 2 * ms}
        step = _iteration("accum", i, t0 + 2 * ms, 2 * ms, 10 * ms, phases, micro=2)
        if i == 3:
            step["skipped"] = True  # GradScaler skipped this update
        if i == 5:
            step["eval"] = 1_500 * ms  # a validation loop before step 5, outside its wait
        if i in (2, 6):  # torch's allocator [allocated, reserved, peak], on two steps only
            step["mem"] = [i * GIB, (i + 2) * GIB, (10 - i) * GIB]
        client.push(step)
        t0 += 12 * ms
    # step 8 ran under a profiler snapshot: 300 ms wait, 100 ms step, in no share
    traced = _iteration("accum", 8, t0 + 300 * ms, 300 * ms, 100 * ms, {"forward": 90 * ms})
    client.push({**traced, "traced": True})
    assert client.request(h.bye("accum", sent=9))["ok"]
    client.request(h.hello("one", my_pid, run_name="one-step"))
    client.push(_iteration("one", 0, base, 5 * ms, 10 * ms, {"forward": 4 * ms}))
    assert client.request(h.bye("one", sent=1))["ok"]
    assert daemons.stop(proc) == 0

    assert main(["runs", str(db), "--format", "json"]) == 0
    one, accum = orjson.loads(capsys.readouterr().out)
    # loader_wait = (2 ms wait + 2 ms data) / 12 ms iteration; other = 2 / 12
    assert accum["pct_of_iteration"] == {
        "loader_wait": 33.3,
        "forward": 16.7,
        "backward": 25.0,
        "comm": None,
        "optimizer": 8.3,
        "other": 16.7,
    }
    assert (accum["steps"], accum["steps_counted"], accum["median_step_ms"]) == (9, 7, 12.0)
    # 2 micro-batches in steps 1-7; step 0 (start-up) and the traced step 8 have 1
    assert (accum["micro_batches_per_step"], one["micro_batches_per_step"]) == (2.0, None)
    assert (accum["skipped_updates"], accum["eval_s"], one["skipped_updates"]) == (1, 1.5, 0)
    # the highest figures any step reported: peak from step 2, reserved from step 6
    assert (accum["torch_peak_allocated_bytes"], accum["torch_peak_reserved_bytes"]) == (
        8 * GIB,
        8 * GIB,
    )
    assert one["torch_peak_allocated_bytes"] is None and one["torch_peak_reserved_bytes"] is None
    # a single step is all start-up: nothing to share out
    assert one["pct_of_iteration"] == dict.fromkeys(
        ("loader_wait", "forward", "backward", "comm", "optimizer", "other")
    )
    assert (one["steps"], one["steps_counted"]) == (1, 0)

    assert main(["runs", str(db)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "ID  NAME      STATUS    STEPS  MICRO  MEDIAN_STEP_MS  WAIT%  FWD%  BWD%  COMM%  OPT%"
        "  OTHER%  SKIPPED   EVAL  DROPPED",
        "2   one-step  finished      1      -            15.0      -     -     -      -     -"
        "       -        0      -        0",
        "1   accum     finished      9      2            12.0   33.3  16.7  25.0      -   8.3"
        "    16.7        1  1.5 s        0",
    ]
    # the summary has them too: its JSON, and a line in the text (not for one micro-batch)
    assert main(["insights", str(db), "1", "--format", "json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["micro_batches_per_step"] == 2.0
    assert main(["insights", str(db), "1"]) == 0
    assert "  Micro-batches per step: 2 (gradient accumulation)" in capsys.readouterr().out
    assert main(["insights", str(db), "2"]) == 0
    assert "Micro-batches" not in capsys.readouterr().out


#: Where the runs' columns and every JSON field are explained in full.
COMMANDS_PAGE = Path(__file__).resolve().parents[3] / "docs" / "gpuprofctl.md"


def _page_section(heading: str) -> str:
    """The text under *heading* on the commands page, to the next heading of its level."""
    text = COMMANDS_PAGE.read_text()
    level = heading.split(" ", 1)[0]
    body = text.split(f"\n{heading}\n", 1)[1]
    return body.split(f"\n{level} ", 1)[0]


def _table_rows(section: str) -> dict[str, str]:
    """A markdown table's rows: first cell -> second cell."""
    rows = [line.strip("|").split("|") for line in section.splitlines() if line.startswith("|")]
    return {cells[0].strip(): cells[1].strip() for cells in rows[2:]}


def test_runs_help_lists_each_column_on_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprofd.commands.runs import format_table

    assert main(["runs", "--help"]) == 0
    out = capsys.readouterr().out
    assert len(out.splitlines()) <= 40  # usage, options and the columns: no JSON reference
    assert "docs/gpuprofctl.md" in out and COMMANDS_PAGE.is_file()
    block = out.split("Columns (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    named = {w for line in block for w in line.strip().split("  ")[0].split()}
    heads = format_table([], groups=True).split()
    assert set(heads) - {"WAIT%", "FWD%", "BWD%", "COMM%", "OPT%", "OTHER%"} <= named
    assert {"WAIT%", "FWD%", "BWD%", "COMM%", "OPT%", "OTHER%"} <= named
    assert all(len(line) <= 80 for line in block)  # one line each, as printed
    assert "pct_of_iteration" not in out and "torch_peak_allocated_bytes" not in out


def test_the_commands_page_explains_the_runs_columns() -> None:
    from gpuprof.insights.base import WARMUP_STEPS
    from gpuprofd.commands.runs import GROUP_CHARS

    columns = _table_rows(_page_section("### Columns"))
    assert columns["MEDIAN_STEP_MS"].startswith(
        "steady-state median iteration time: median of loader wait + time between steps + step, "
        f"warm-up steps excluded (the first {WARMUP_STEPS} when the run has more than "
        f"{2 * WARMUP_STEPS})"
    )
    assert "WAIT% + FWD% + BWD% + COMM% + OPT% + OTHER% = 100" in columns["WAIT%..OTHER%"]
    assert "(the data phase, between micro-batches) folded in" in columns["WAIT%"]
    assert f"its first {GROUP_CHARS} characters" in columns["GROUP, RANK"]


def test_the_commands_page_names_every_runs_json_field(
    real_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["runs", str(real_db), "--format", "json"]) == 0
    row = orjson.loads(capsys.readouterr().out)[0]
    section = _page_section("### --format json")
    assert [k for k in row if f"`{k}`" not in section] == []
    shares = " ".join(section.split()).split("`pct_of_iteration` `{", 1)[1].split("}`")[0]
    assert sorted(shares.split(", ")) == sorted(row["pct_of_iteration"])


def test_insights_help_points_to_the_commands_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["insights", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Every field of --format json, one run's or a group's: docs/gpuprofctl.md" in out
    assert "clock_reference_rank" not in out  # the group's JSON is on the page
    section = " ".join(_page_section("### --group NAME, --format json").split())
    for key in ("insights_source", "runs_note", "missing_ranks", "comm_missing", "ranks"):
        assert f"`{key}`" in section, key
    assert "clock_reference_rank" in section and "not bytes on the wire" in section


def test_insights_prints_the_stored_summary(
    real_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stored = orjson.loads(h.query(real_db, "SELECT summary FROM runs WHERE id = 1")[0][0])
    assert main(["insights", str(real_db), "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    # a CPU run with no FLOPs declared and no kernels: no MFU line to add
    assert out == format_summary(stored, details=True).split("\n")
    assert main(["insights", str(real_db), "1", "--format", "json"]) == 0
    got = orjson.loads(capsys.readouterr().out)
    assert {k: v for k, v in got.items() if k in stored} == stored  # kernels/MFU added
    assert "2 events dropped in the training process" in stored["notes"]


def test_insights_defaults_to_latest_run_and_builds_a_live_summary(
    real_db: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPUPROF_DB", str(real_db))
    assert main(["insights", "--format", "json"]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    assert (summary["run_id"], summary["run_name"], summary["status"], summary["steps"]) == (
        2,
        "ongoing",
        "running",
        3,
    )
    assert summary["notes"] == [LIVE_NOTE]


def test_missing_db_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.db"
    assert main(["insights", str(missing)]) == 2
    assert main(["runs", str(missing)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert (
        err
        == [
            f"gpuprofctl: error: no database at {missing} (run a script under gpuprof.profile() "
            "first, or pass the path)"
        ]
        * 2
    )
    assert not missing.exists()  # read-only: nothing created


def test_corrupt_and_foreign_dbs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corrupt = tmp_path / "c.db"
    corrupt.write_bytes(b"\x00garbage" * 500)
    foreign = tmp_path / "f.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE t (x)")
    conn.close()
    assert main(["runs", str(corrupt)]) == 2
    assert main(["insights", str(foreign)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert "not a usable SQLite database" in err[0]
    assert err[1] == f"gpuprofctl: error: {foreign} is an SQLite database but not a gpuprof one"


def test_unknown_run_id_names_the_db_and_its_runs(
    real_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["insights", str(real_db), "99"]) == 2
    where = real_db.absolute()
    assert capsys.readouterr().err == (
        f"gpuprofctl: error: no run 99 in {where} (runs 1-2; see gpuprofctl runs {where})\n"
    )
    empty = tmp_path / "empty.db"
    schema.prepare(empty)
    assert main(["insights", str(empty), "99"]) == 2
    assert main(["insights", str(empty)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"gpuprofctl: error: no run 99 in {empty.absolute()}: it has no runs yet (run a script "
        "under gpuprof.profile() first, or pass the path)",
        f"gpuprofctl: error: no runs yet in {empty.absolute()} (run a script under "
        "gpuprof.profile() first, or pass the path)",
    ]


def test_insights_lone_number_is_a_run_id(
    real_db: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("GPUPROF_DB", str(real_db))
    monkeypatch.chdir(tmp_path)
    assert main(["insights", "1", "--format", "json"]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    assert (summary["run_id"], summary["run_name"]) == (1, "baseline")
    assert main(["insights", "7"]) == 2
    assert capsys.readouterr().err.startswith(f"gpuprofctl: error: no run 7 in {real_db}")
    # a file of that name is still a database path
    (tmp_path / "1").write_bytes(b"")
    assert main(["insights", "1"]) == 2
    err = capsys.readouterr().err
    assert err == "gpuprofctl: error: 1 is an empty database, not a gpuprof one\n"


def _out(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    rc = main(list(args))
    return rc, capsys.readouterr().out


def test_storage_url_reads_as_the_path_does(
    real_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--storage-url sqlite:///abs/path`` is the same database as the path:
    the same output, byte for byte (messages name it the same way)."""
    url = f"sqlite://{real_db.absolute()}"
    for args in (
        ["runs"],
        ["runs", "--format", "json"],
        ["insights", "1"],
        ["insights", "2", "--format", "json"],
        ["kernels", "1", "--format", "json"],
    ):
        by_path = _out(capsys, args[0], str(real_db), *args[1:])
        by_url = _out(capsys, *args, "--storage-url", url)
        assert by_path[0] == 0 and by_url == by_path, args
    assert main(["insights", "99", "--storage-url", url]) == 2
    where = real_db.absolute()
    assert capsys.readouterr().err == (
        f"gpuprofctl: error: no run 99 in {where} (runs 1-2; see gpuprofctl runs {where})\n"
    )
    missing = real_db.parent / "nope.db"
    assert main(["runs", "--storage-url", f"sqlite://{missing}"]) == 2
    assert capsys.readouterr().err.startswith(f"gpuprofctl: error: no database at {missing} (")
    assert not missing.exists()


def test_a_url_given_as_the_db_is_read_as_a_url(
    real_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary's Full report line is copied with its URL as DB: it reads."""
    by_path = _out(capsys, "runs", str(real_db), "--format", "json")
    by_url = _out(capsys, "runs", f"sqlite://{real_db.absolute()}", "--format", "json")
    assert by_path[0] == 0 and by_url == by_path


def test_a_db_and_a_storage_url_together_are_refused(
    real_db: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{real_db.absolute()}"
    for cmd in (["runs"], ["insights"], ["insights", "1"], ["runs", "--group", "g"], ["kernels"]):
        assert main([cmd[0], str(real_db), *cmd[1:], "--storage-url", url]) == 2, cmd
        err = capsys.readouterr().err
        assert "give DB or --storage-url, not both" in err, cmd
        assert capsys.readouterr().out == ""


NO_DAEMON = (
    "no gpuprofd answering on {}: one starts by itself when a script enters gpuprof.profile(), "
    "or run `gpuprofd` (see systemd/gpuprofd.service)"
)


def test_status_without_daemon_exits_3(sock_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--socket-dir", str(sock_dir)]) == 3
    out = capsys.readouterr()
    assert out.err == f"gpuprofctl: error: {NO_DAEMON.format(sock_dir)}\n"
    assert out.out == ""


def test_status_json_without_daemon_is_json_exit_3(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--socket-dir", str(sock_dir), "--format", "json"]) == 3
    out = capsys.readouterr()
    assert orjson.loads(out.out) == {
        "running": False,
        "socket_dir": str(sock_dir),
        "error": NO_DAEMON.format(sock_dir),
    }
    assert out.err == ""


def test_status_with_a_silent_socket_times_out_exit_3(
    sock_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import zmq

    from gpuprof import config

    ctx = zmq.Context()
    mute = ctx.socket(zmq.ROUTER)  # binds but never answers
    mute.bind(config.control_endpoint(sock_dir))
    try:
        t0 = time.monotonic()
        assert main(["status", "--socket-dir", str(sock_dir), "--timeout", "0.3"]) == 3
        assert time.monotonic() - t0 < 5
    finally:
        mute.close(0)
        ctx.term()
    assert capsys.readouterr().err == (
        f"gpuprofctl: error: no gpuprofd answered on {sock_dir} within 0.3 s: its control "
        "socket is there, so a daemon is busy or stuck, or one died and left it; retry with "
        "--timeout, or run `gpuprofd` (see systemd/gpuprofd.service)\n"
    )


def test_status_with_daemon(
    daemons, sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], my_pid: int
) -> None:
    proc, client = daemons.start_ready(sock_dir, tmp_path / "g.db")
    client.request(h.hello("st", my_pid, run_name="watched"))
    client.push(b"junk")
    client.wait_for(lambda r: r["dropped"])
    assert main(["status", "--socket-dir", str(sock_dir), "--format", "json"]) == 0
    reply = orjson.loads(capsys.readouterr().out)
    assert reply["running"] is True
    assert reply["pid"] == proc.pid and reply["dropped"] == {"not_json": 1}
    assert reply["live_runs"][0]["run_name"] == "watched"
    assert main(["status", "--socket-dir", str(sock_dir)]) == 0
    out = capsys.readouterr().out
    assert f"gpuprofd pid {proc.pid}" in out and "not_json=1" in out and "watched" in out
    assert "  log: " not in out  # started by hand here: it logs where it was told
    (sock_dir / "gpuprofd.log").touch()  # where an auto-started daemon logs
    assert main(["status", "--socket-dir", str(sock_dir)]) == 0
    assert f"  log:        {sock_dir / 'gpuprofd.log'}\n" in capsys.readouterr().out
    # no NVML on this machine: the status says GPU sampling is off, and why
    assert reply["gpu_sampling"] == {"on": False, "why": NO_GPU_NOTE}
    assert "GPU sampling: off (" in out


def test_status_reports_the_gpu_loops_achieved_rate(
    daemons, sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    daemons.start_ready(
        sock_dir, tmp_path / "g.db", "--sample-hz", "50", env={"GPUPROF_NVML": "mock"}
    )
    time.sleep(1.5)
    assert main(["status", "--socket-dir", str(sock_dir), "--format", "json"]) == 0
    gpu = orjson.loads(capsys.readouterr().out)["gpu_sampling"]
    assert gpu["on"] is True and gpu["gpus"] == 1 and gpu["backend"] == "mock"
    assert gpu["fast"]["requested_hz"] == 50.0 and gpu["fast"]["ticks"] >= 25
    assert 25 <= gpu["fast"]["achieved_hz"] <= 51  # deadline-scheduled: never above the rate
    assert main(["status", "--socket-dir", str(sock_dir)]) == 0
    assert "GPU sampling: 1 GPU(s) (mock), " in capsys.readouterr().out


def test_version_and_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    from gpuprofd import __version__

    assert main(["version"]) == 0
    assert capsys.readouterr().out == f"gpuprof {__version__}\n"
    assert main(["version", "--format", "json"]) == 0
    assert orjson.loads(capsys.readouterr().out) == {
        "gpuprof": __version__,
        "python": platform.python_version(),
        "protocol": PROTOCOL_VERSION,
    }
    assert main(["--version"]) == 0  # as other CLIs spell it
    assert capsys.readouterr().out == f"gpuprof {__version__}\n"
    assert main(["insights", "x.db", "not-a-number"]) == 2
    assert main(["no-such-command"]) == 2
    assert main(["--help"]) == 0


def test_absurd_run_id_and_socket_dir_are_one_line_errors(tmp_path, capsys) -> None:
    from gpuprofd.ctl import main

    db = tmp_path / "x.db"
    db.write_bytes(b"")
    assert main(["insights", str(db), "99999999999999999999999"]) == 2
    assert "Traceback" not in capsys.readouterr().err
    long_dir = tmp_path / ("d" * 120)
    long_dir.mkdir()
    (long_dir / "control.sock").touch()
    assert main(["status", "--socket-dir", str(long_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuprofctl: error: socket path") and "Set GPUPROF_SOCKET" in err
    assert main(["status", "--socket-dir", str(long_dir), "--format", "json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["running"] is False and "Set GPUPROF_SOCKET" in out["error"]


def test_status_points_to_daemons_of_other_databases(tmp_path, monkeypatch, capsys) -> None:
    from gpuprofd.ctl import main

    monkeypatch.delenv("GPUPROF_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPROF_DB", str(tmp_path / "here.db"))
    other = tmp_path / "gpuprof" / "0123456789ab"
    other.mkdir(parents=True)
    (other / "control.sock").touch()  # another project's daemon, gone without a word
    assert main(["status"]) == 3
    err = capsys.readouterr().err
    assert "no gpuprofd for this database" in err
    assert f"a daemon not answering (--socket-dir {other})" in err


def test_status_names_each_other_daemon_by_its_database(
    daemons, sock_dir: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """Which daemon is which: each by the database it serves, not its socket hash."""
    from gpuprof import config

    monkeypatch.delenv("GPUPROF_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(sock_dir))  # short: ipc paths < 107 bytes
    monkeypatch.setenv("GPUPROF_DB", str(tmp_path / "here.db"))
    theirs = tmp_path / "theirs.db"
    their_dir = config.socket_dir(db=theirs)
    their_dir.mkdir(parents=True)
    daemons.start_ready(their_dir, theirs)
    assert main(["status", "--timeout", "2"]) == 3
    err = capsys.readouterr().err
    assert f"daemons of other databases: {theirs.resolve()} (--socket-dir {their_dir})" in err
    assert main(["stop"]) == 3  # stop points to them the same way
    assert f"{theirs.resolve()} (--socket-dir {their_dir})" in capsys.readouterr().err
    mine = tmp_path / "mine.db"  # a database named: the message names it
    assert main(["status", str(mine), "--timeout", "2"]) == 3
    assert f"no gpuprofd for {mine} on " in capsys.readouterr().err


def test_other_daemons_storage_urls_are_said_without_their_password(
    tmp_path, monkeypatch, capsys
) -> None:
    from gpuprofd.commands import status
    from gpuprofd.core.errors import NoDaemonError

    monkeypatch.delenv("GPUPROF_SOCKET", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPROF_DB", str(tmp_path / "here.db"))
    other = tmp_path / "gpuprof" / "0123456789ab"
    other.mkdir(parents=True)
    (other / "control.sock").touch()
    url = "postgres://gp:s3cret@db.internal/gpuprof?password=s3cret"

    def ping(where: Path, timeout_s: float) -> dict[str, Any]:
        if where != other:
            raise NoDaemonError(f"no gpuprofd answering on {where}")
        return {"db": url}  # as a daemon that did not mask it would say it

    monkeypatch.setattr(status, "ping", ping)
    assert main(["status"]) == 3
    err = capsys.readouterr().err
    assert "s3cret" not in err
    assert f"postgres://gp:***@db.internal/gpuprof?password=*** (--socket-dir {other})" in err


@pytest.mark.parametrize(
    ("env_server", "expected"),
    [
        ("http://new-server.example:8000", "http://new-server.example:8000"),
        (None, "http://old-server.example:8000"),  # no GPUPROF_SERVER: the remembered one
    ],
)
def test_drain_takes_gpuprof_server_before_the_server_the_file_remembers(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    env_server: str | None,
    expected: str,
) -> None:
    """--server, else GPUPROF_SERVER, else the server the file last forwarded
    to, as drain --help says (an empty outbox: nothing is posted)."""
    db = tmp_path / "d.db"
    schema.prepare(db)
    with sqlite3.connect(db) as conn:
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('forward_server', ?)",
            ("http://old-server.example:8000",),
        )
    monkeypatch.setenv("GPUPROF_API_KEY", "k")
    if env_server is None:
        monkeypatch.delenv("GPUPROF_SERVER", raising=False)
    else:
        monkeypatch.setenv("GPUPROF_SERVER", env_server)
    with pytest.raises(SystemExit) as exited:  # drain exits with its verdict
        main(["drain", str(db), "--format", "json"])
    assert exited.value.code == 0
    assert json.loads(capsys.readouterr().out)["server"] == expected


def test_status_and_stop_find_the_daemon_of_the_database_named(
    daemons, sock_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    # as runs, insights and top do: `gpuprofctl status other.db` asks other.db's
    # per-user daemon, not the one of GPUPROF_DB / ./gpuprof.db
    from gpuprof import config

    monkeypatch.delenv("GPUPROF_SOCKET", raising=False)
    monkeypatch.delenv("GPUPROF_DB", raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(sock_dir))
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "other.db"
    where = config.socket_dir(db=db)
    assert where != config.socket_dir()  # ./gpuprof.db has another daemon
    where.mkdir(parents=True)
    proc, _ = daemons.start_ready(where, db)
    assert main(["status", "--format", "json"]) == 3  # none for ./gpuprof.db
    capsys.readouterr()
    assert main(["status", str(db), "--format", "json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["pid"] == proc.pid
    assert main(["stop", "other.db", "--format", "json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["pid"] == proc.pid
    assert proc.wait(20) == 0
