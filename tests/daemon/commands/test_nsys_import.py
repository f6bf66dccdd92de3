"""``gpuprofctl nsys-import`` against SQLite reports built here to the schema
``nsys export --type sqlite`` writes, into a real gpuprof database.

Schema source: NVIDIA, "SQLite Export Schema Reference" (Nsight Systems
2021.5, docs.nvidia.com/nsight-systems/2021.5/nsys-exporter/exported_data.html):
``StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)``; kernel rows with
``start``/``end`` ns, ``deviceId``/``contextId``/``streamId`` and names as
``StringIds`` ids; every column declared ``NOT NULL``; tables created lazily.
Version differences exercised: ``mangledName`` exists only in recent exports
(Analysis Guide: "the ability to display mangled names is a recent addition
to the report file format"), so the 2021-era layout lacks it; an export with
only ``shortName`` and one whose name column holds the text itself are read
through the same column lookup.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from gpuprofd.commands import nsys_report as nsys
from gpuprofd.ctl import main
from gpuprofd.storage import schema

MS = 1_000_000
RUN_MONO0 = 5_000_000_000_000  # the run's first step starts here (monotonic ns)
RUN_WALL0 = 1_764_000_000_000_000_000  # ... at this wall time
STEP_NS = 20 * MS
N_STEPS = 10

GEMM = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_32x3_nn_align4>(Params)"
GEMM_SHORT = "Kernel"
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
NCCL_SHORT = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
ELEM = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int)"
ELEM_SHORT = "vectorized_elementwise_kernel"


def make_db(path: Path, steps: int = N_STEPS) -> Path:
    """A gpuprof database with one run of *steps* 15 ms steps every 20 ms."""
    schema.prepare(path)
    conn = sqlite3.connect(path)
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status, start_wall_ns, start_mono_ns, "
        "end_mono_ns) VALUES (1, 'k1', 'dlrm', 'finished', ?, ?, ?)",
        (RUN_WALL0 - 10 * MS, RUN_MONO0 - 10 * MS, RUN_MONO0 + steps * STEP_NS),
    )
    conn.executemany(
        "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, phases) "
        "VALUES (1, ?, ?, ?, 5000000, 0, 1, '{}')",
        [(i, RUN_MONO0 + i * STEP_NS, RUN_MONO0 + i * STEP_NS + 15 * MS) for i in range(steps)],
    )
    conn.commit()
    conn.close()
    return path


#: Kernel table layouts: name columns of each export version exercised.
LAYOUTS = {
    "current": ("demangledName", "shortName", "mangledName"),
    "2021": ("demangledName", "shortName"),  # before mangledName was added
    "short_only": ("shortName",),
    "inline_text": ("name",),  # the name column holds the text, not a StringIds id
}


def make_report(
    path: Path,
    layout: str = "current",
    base: int = RUN_MONO0,
    session_utc: int | None = None,
    kernels: bool = True,
    memops: bool = True,
    devices: tuple[int, ...] = (0,),
) -> Path:
    """An nsys-export-shaped SQLite: in each of steps 2-5, per device, two
    GEMMs (3 ms each), one AllReduce (step 5: 4 ms, else 1 ms), one fill
    kernel (0.1 ms), one HtoD copy (0.5 ms) and one memset (0.05 ms); plus one
    GEMM before the run's first step. Times are *base*-relative ns."""
    names = LAYOUTS[layout]
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    strings = {
        GEMM: 1,
        GEMM_SHORT: 2,
        NCCL: 3,
        NCCL_SHORT: 4,
        ELEM: 5,
        ELEM_SHORT: 6,
        "_Z6KernelI": 7,
        "_Z4nccl": 8,
        "_Z4elem": 9,
    }
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    conn.execute("CREATE TABLE ThreadNames (nameId INT NOT NULL, priority INT, globalTid INT)")
    if session_utc is not None:
        conn.execute(
            "CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INT NOT NULL, "
            "utcTime TEXT NOT NULL, localTime TEXT NOT NULL)"
        )
        conn.execute(
            "INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, 'x', 'y')", (session_utc,)
        )
    if kernels:
        name_decl = ", ".join(f"{n} {'TEXT' if n == 'name' else 'INT'} NOT NULL" for n in names)
        conn.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT NOT NULL, end INT NOT NULL, "
            "deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL, "
            f"correlationId INT NOT NULL, globalPid INT NOT NULL, {name_decl}, "
            "gridX INT NOT NULL, blockX INT NOT NULL)"
        )
    if memops:
        conn.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INT NOT NULL, end INT NOT NULL, "
            "deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL, "
            "correlationId INT NOT NULL, globalPid INT NOT NULL, bytes INT NOT NULL, "
            "copyKind INT NOT NULL, srcKind INT, dstKind INT)"
        )
        conn.execute(
            "CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INT NOT NULL, end INT NOT NULL, "
            "deviceId INT NOT NULL, contextId INT NOT NULL, streamId INT NOT NULL, "
            "correlationId INT NOT NULL, globalPid INT NOT NULL, value INT NOT NULL, "
            "bytes INT NOT NULL)"
        )
    if kernels or memops:
        _fill(conn, names, base, devices, kernels, memops, strings)
    conn.commit()
    conn.close()
    return path


def _fill(conn, names, base, devices, kernels, memops, strings) -> None:
    corr = 0

    def kernel(start: int, dur: int, long: str, short: str, mangled: str, dev: int) -> None:
        nonlocal corr
        corr += 1
        by = {
            "demangledName": strings[long],
            "shortName": strings[short],
            "mangledName": strings[mangled],
            "name": long,
        }
        cols = ", ".join(names)
        conn.execute(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
            f"correlationId, globalPid, {cols}, gridX, blockX) "
            f"VALUES (?, ?, ?, 1, 7, ?, 4242, {', '.join('?' * len(names))}, 1, 128)",
            (start, start + dur, dev, corr, *(by[n] for n in names)),
        )

    for dev in devices:
        if kernels:
            kernel(base - 50 * MS, 3 * MS, GEMM, GEMM_SHORT, "_Z6KernelI", dev)  # before step 0
        for step in range(2, 6):
            t = base + step * STEP_NS + 1 * MS
            if kernels:
                kernel(t, 3 * MS, GEMM, GEMM_SHORT, "_Z6KernelI", dev)
                kernel(t + 3 * MS, 3 * MS, GEMM, GEMM_SHORT, "_Z6KernelI", dev)
                kernel(t + 6 * MS, (4 if step == 5 else 1) * MS, NCCL, NCCL_SHORT, "_Z4nccl", dev)
                # the GPU runs behind: this one starts in the loader wait after the step
                kernel(t + 16 * MS, MS // 10, ELEM, ELEM_SHORT, "_Z4elem", dev)
            if memops:
                conn.execute(
                    "INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, ?, 1, 7, 0, 4242, 4096, "
                    "1, 0, 2)",
                    (t - MS // 2, t, dev),
                )
                conn.execute(
                    "INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, ?, 1, 7, 0, 4242, 0, 64)",
                    (t + 10 * MS, t + 10 * MS + MS // 20, dev),
                )


def run(args: list[str], capsys) -> tuple[int, str, str]:
    rc = main(args)
    got = capsys.readouterr()
    return rc, got.out, got.err


def windows(db: Path) -> list[tuple]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(
            "SELECT w.steps, w.t0_ns, w.t1_ns, s.name, s.cls, s.count, s.total_ns "
            "FROM kernel_windows w JOIN kernel_stats s ON s.window_id = w.id "
            "WHERE w.run_id = 1 AND w.source = 'nsys' ORDER BY w.t0_ns, s.total_ns DESC"
        ).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_report_is_aligned_with_the_runs_steps(tmp_path: Path, capsys, layout: str) -> None:
    db = make_db(tmp_path / "g.db")
    report = make_report(tmp_path / "r.sqlite", layout)
    rc, out, err = run(["nsys-import", str(report), "--db", str(db), "--format", "json"], capsys)
    assert rc == 0, err
    got = orjson.loads(out)
    name_col = LAYOUTS[layout][0]
    assert got["name_column"] == name_col
    assert got["aligned"] == "monotonic"
    assert got["steps"] == [2, 5] and got["windows"] == 4
    assert got["activities"] == 4 * 6 + 1
    assert got["notes"] == ["1 activities outside the run's steps left out"]
    gemm, nccl, elem = (
        (GEMM_SHORT, NCCL_SHORT, ELEM_SHORT) if layout == "short_only" else (GEMM, NCCL, ELEM)
    )
    rows = windows(db)
    step5 = [r[3:] for r in rows if r[0] == "[5]"]
    assert step5 == [
        (gemm, "compute", 2, 6 * MS),
        (nccl, "comm", 1, 4 * MS),
        ("Memcpy HtoD", "memcpy", 1, MS // 2),
        (elem, "compute", 1, MS // 10),
        ("Memset", "memset", 1, MS // 20),
    ]
    # a step's window runs to the next step's start: the late fill kernel is its own
    w2 = next(r for r in rows if r[0] == "[2]")
    assert (w2[1], w2[2]) == (RUN_MONO0 + 2 * STEP_NS, RUN_MONO0 + 3 * STEP_NS)

    # gpuprofctl kernels reads them back per step
    rc, out, _ = run(["kernels", str(db), "1", "--source", "nsys", "--format", "json"], capsys)
    table = orjson.loads(out)
    assert rc == 0 and table["steps"] == 4 and table["windows"] == 4
    top = table["kernels"][0]
    assert (top["name"], top["count"], top["per_step_ms"], top["mean_us"]) == (gemm, 8, 6.0, 3000.0)
    nccl_row = next(k for k in table["kernels"] if k["cls"] == "comm")
    assert nccl_row["per_step_ms"] == pytest.approx((1 + 1 + 1 + 4) / 4)


def test_wall_clock_alignment_through_the_session_start(tmp_path: Path, capsys) -> None:
    """Timestamps relative to the session start (the usual export): mapped
    through the session's UTC start and the run's wall/monotonic anchor."""
    db = make_db(tmp_path / "g.db")
    session_start_mono = RUN_MONO0 - 2_000 * MS  # nsys started 2 s before step 0
    run_wall_at_mono0 = RUN_WALL0 - 10 * MS - (RUN_MONO0 - 10 * MS) + session_start_mono
    report = make_report(
        tmp_path / "r.sqlite", base=RUN_MONO0 - session_start_mono, session_utc=run_wall_at_mono0
    )
    rc, out, err = run(["nsys-import", str(report), "--db", str(db)], capsys)
    assert rc == 0, err
    assert "4 step window(s), steps 2-5 (clocks matched by wall)" in out
    assert len({r[0] for r in windows(db)}) == 4


def test_unmatched_clock_is_one_window_and_says_so(tmp_path: Path, capsys) -> None:
    db = make_db(tmp_path / "g.db")
    report = make_report(tmp_path / "r.sqlite", base=10 * 1000 * MS)  # another time, no anchor
    rc, out, err = run(["nsys-import", str(report), "--db", str(db)], capsys)
    assert rc == 0, err
    assert "one window" in out
    assert (
        "note: not aligned with steps: the report's clock does not match the run's steps "
        "(another host, or another time); stored as one window"
    ) in out
    rows = windows(db)
    assert {r[0] for r in rows} == {"[]"}
    gemm = next(r for r in rows if r[3] == GEMM)
    assert gemm[5:] == (9, 27 * MS)  # every GEMM, the one before step 0 included
    assert gemm[1] == RUN_MONO0 and gemm[2] - gemm[1] == (5 * STEP_NS + 17 * MS + MS // 10) - (
        -50 * MS
    )  # placed at the run's first step, the report's span long


def test_reimport_replaces_and_devices_are_noted(tmp_path: Path, capsys) -> None:
    db = make_db(tmp_path / "g.db")
    report = make_report(tmp_path / "r.sqlite", devices=(0, 1))
    assert run(["nsys-import", str(report), "--db", str(db)], capsys)[0] == 0
    rc, out, _ = run(["nsys-import", str(report), "--db", str(db), "--device", "1"], capsys)
    assert rc == 0
    assert "note: replaced 4 earlier nsys window(s) of this run" in out
    gemm = [r for r in windows(db) if r[3] == GEMM]
    assert [r[5] for r in gemm] == [2, 2, 2, 2]  # device 1 only, not doubled
    _, out, _ = run(["nsys-import", str(report), "--db", str(db)], capsys)
    assert "the report holds activity of devices [0, 1]: all summed (--device N for one)" in out


@pytest.mark.parametrize("tables", ["empty", "none"])
def test_report_without_kernels_is_a_clear_message_exit_0(
    tmp_path: Path, capsys, tables: str
) -> None:
    db = make_db(tmp_path / "g.db")
    report = tmp_path / "r.sqlite"
    if tables == "empty":  # activity tables present, no rows
        make_report(report, kernels=True, memops=True)
        conn = sqlite3.connect(report)
        for t in ("KERNEL", "MEMCPY", "MEMSET"):
            conn.execute(f"DELETE FROM CUPTI_ACTIVITY_KIND_{t}")
        conn.commit()
        conn.close()
    else:  # recorded without CUDA trace: the lazily created tables are absent
        make_report(report, kernels=False, memops=False)
    rc, out, err = run(["nsys-import", str(report), "--db", str(db)], capsys)
    assert rc == 0, err
    assert out.strip() == (
        f"{report}: no CUDA kernel, memcpy or memset activity (was it "
        "recorded with --trace=cuda?); nothing attached"
    )
    assert windows(db) == []


def test_not_an_nsys_export_is_one_line_exit_2(tmp_path: Path, capsys) -> None:
    db = make_db(tmp_path / "g.db")
    text = tmp_path / "notes.sqlite"
    text.write_text("this is not a database\n" * 100)
    other = tmp_path / "other.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()
    cases = {
        text: "not a readable SQLite file",
        other: "none of its tables is one nsys writes",
        db: "it is a gpuprof database",
        tmp_path / "missing.sqlite": "no file at",
    }
    for path, why in cases.items():
        rc, out, err = run(["nsys-import", str(path), "--db", str(db)], capsys)
        assert rc == 2, (path, out, err)
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
        assert err.startswith("gpuprofctl: error: ") and why in err, err
    assert windows(db) == []


def test_report_is_opened_read_only(tmp_path: Path, capsys) -> None:
    db = make_db(tmp_path / "g.db")
    report = make_report(tmp_path / "r.sqlite")
    report.chmod(0o444)
    before = report.read_bytes()
    assert run(["nsys-import", str(report), "--db", str(db)], capsys)[0] == 0
    assert report.read_bytes() == before
    assert not Path(f"{report}-wal").exists() and not Path(f"{report}-journal").exists()


def test_big_report_shows_progress(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setattr(nsys, "CHUNK_ROWS", 5)
    db = make_db(tmp_path / "g.db")
    report = make_report(tmp_path / "r.sqlite")
    rc, _, err = run(["nsys-import", str(report), "--db", str(db)], capsys)
    assert rc == 0
    lines = err.splitlines()
    assert lines[0] == "nsys-import: read 5 of 25 device activities"
    assert lines[-1] == "nsys-import: read 25 of 25 device activities"
    rc, _, err = run(["nsys-import", str(report), "--db", str(db), "--quiet"], capsys)
    assert rc == 0 and err == ""


def test_unknown_run_and_missing_db_are_exit_2(tmp_path: Path, capsys) -> None:
    db = make_db(tmp_path / "g.db")
    report = make_report(tmp_path / "r.sqlite")
    rc, _, err = run(["nsys-import", str(report), "--db", str(db), "--run", "9"], capsys)
    assert rc == 2 and "no run 9" in err
    rc, _, err = run(["nsys-import", str(report), "--db", str(tmp_path / "no.db")], capsys)
    assert rc == 2 and "no database at" in err


def test_device_without_activity_attaches_nothing(tmp_path: Path, capsys) -> None:
    db = make_db(tmp_path / "g.db")
    report = make_report(tmp_path / "r.sqlite", devices=(0,))
    rc, out, _ = run(
        ["nsys-import", str(report), "--db", str(db), "--device", "3", "--format", "json"], capsys
    )
    assert rc == 0
    got = orjson.loads(out)
    assert (got["windows"], got["notes"]) == (
        0,
        [f"{report}: no device activity on device 3; nothing attached"],
    )
    assert windows(db) == []


def _add_kernel(report: Path, start: int, end: int, name_id: int = 1) -> None:
    conn = sqlite3.connect(report)
    conn.execute(
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, contextId, streamId, "
        "correlationId, globalPid, demangledName, shortName, mangledName, gridX, blockX) "
        "VALUES (?, ?, 0, 1, 7, 999, 4242, ?, 2, 7, 1, 1)",
        (start, end, name_id),
    )
    conn.commit()
    conn.close()


def test_absurd_kernel_durations_are_counted_and_left_out(tmp_path: Path, capsys) -> None:
    db = make_db(tmp_path / "g.db")
    report = make_report(tmp_path / "r.sqlite")
    t = RUN_MONO0 + 2 * STEP_NS + MS
    for _ in range(2):  # each 2**62 ns: their sum does not fit SQLite's INTEGER
        _add_kernel(report, t, t + 2**62)
    _add_kernel(report, t, t - 1)  # ends before it starts
    rc, out, err = run(["nsys-import", str(report), "--db", str(db)], capsys)
    assert rc == 0, err
    assert "note: 3 device activities with a negative or longer than 7-day duration left out" in out
    gemm = [r for r in windows(db) if r[3] == GEMM]
    assert [(r[5], r[6]) for r in gemm] == [(2, 6 * MS)] * 4


def test_kernel_names_are_made_printable(tmp_path: Path, capsys) -> None:
    db = make_db(tmp_path / "g.db")
    report = make_report(tmp_path / "r.sqlite")
    conn = sqlite3.connect(report)
    conn.execute("INSERT INTO StringIds VALUES (100, ?)", ("evil\x1b[2J\u202egemm\x00x\nline",))
    conn.execute("INSERT INTO StringIds VALUES (101, ?)", ("\x00\n",))
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 100 WHERE rowid % 2 = 0")
    conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET demangledName = 101 WHERE rowid % 2 = 1")
    conn.commit()
    conn.close()
    assert run(["nsys-import", str(report), "--db", str(db)], capsys)[0] == 0
    names = {r[3] for r in windows(db)}
    assert "evil [2J gemm x line" in names and "(unnamed)" in names, names
    assert all(n.isprintable() for n in names), names
    rc, out, _ = run(["kernels", str(db), "--source", "nsys"], capsys)
    assert rc == 0 and "\x1b" not in out and "\u202e" not in out
