"""``gpuprofctl kernels``: a run's kernel table and two runs compared, on the
real A100 DLRM traces (``tests/fixtures/kineto-a100``) stored in a real
SQLite database by the daemon's own inserts."""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gpuprof.kernels import KernelAgg, aggregate_trace
from gpuprofd.ctl import main
from gpuprofd.storage import schema
from gpuprofd.storage.writes import runsdb
from gpuprofd.views import kerneltable

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "kineto-a100"
ALLREDUCE = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"
SENDRECV = "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)"


def store_run(conn: sqlite3.Connection, run_id: int, name: str, windows) -> None:
    """One finished run with the windows' steps and kernel windows, written
    with the daemon's own SQL (runsdb.kernel_window_ops)."""
    conn.execute(
        "INSERT INTO runs (id, run_key, run_name, status) VALUES (?, ?, ?, 'finished')",
        (run_id, f"k{run_id}", name),
    )
    for window, rows in windows:
        for i in window["steps"]:
            conn.execute(
                "INSERT INTO steps (run_id, step, t0_ns, t1_ns, wait_ns, explicit, micro, "
                "phases, traced) VALUES (?, ?, ?, ?, 0, 0, 1, '{}', 1)",
                (run_id, i, window["t0"], window["t1"]),
            )
        ops = runsdb.kernel_window_ops(run_id, window, rows)
        for op in ops:
            conn.execute(op.sql, op.params)


@pytest.fixture(scope="module")
def dlrm_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Run 1: the DLRM baseline (rank 3), run 2: the slower run (rank 1), each
    six ProfilerStep windows (#1009-#1014) from gpuprof.kernels.aggregate_trace."""
    if not FIXTURES.is_dir():
        pytest.skip(f"no fixtures at {FIXTURES}")
    db = tmp_path_factory.mktemp("kern") / "g.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    for run_id, (name, file) in enumerate(
        [("dlrm-baseline", "dlrm8_baseline_rank3"), ("dlrm-slower", "dlrm8_slower_rank1")], 1
    ):
        with gzip.open(FIXTURES / f"{file}.json.gz") as f:
            trace = json.load(f)
        store_run(
            conn,
            run_id,
            name,
            [w.as_stored("snapshot") for w in aggregate_trace(trace, window="step")],
        )
    conn.commit()
    conn.close()
    yield db


def test_compare_shows_the_allreduce_growth(dlrm_db: Path, capsys) -> None:
    assert main(["kernels", str(dlrm_db), "1", "--compare", "2", "--format", "json"]) == 0
    cmp = orjson.loads(capsys.readouterr().out)
    assert cmp["basis"] == "step"
    assert (cmp["a"]["steps"], cmp["b"]["steps"]) == (6, 6)
    assert (cmp["a"]["run_name"], cmp["b"]["run_name"]) == ("dlrm-baseline", "dlrm-slower")
    by_name = {k["name"]: k for k in cmp["kernels"]}
    ar = by_name[ALLREDUCE]
    # README: "NCCL AllReduce time ~3x the baseline's": 5.48 -> 15.35 ms per step
    assert ar["a_ms"] == pytest.approx(5.48, abs=0.01)
    assert ar["b_ms"] == pytest.approx(15.347, abs=0.01)
    assert ar["delta_ms"] == pytest.approx(9.867, abs=0.01)
    assert ar["ratio"] == pytest.approx(2.80, abs=0.01)
    # the largest-growing collective (a DtoD copy and a new embedding kernel grew more)
    assert next(k for k in cmp["kernels"] if k["cls"] == "comm")["name"] == ALLREDUCE
    assert by_name[SENDRECV]["delta_ms"] == pytest.approx(26.543 - 21.776, abs=0.01)
    assert cmp["classes"]["comm"]["delta_ms"] == pytest.approx(9.867 + 4.767, abs=0.02)

    assert main(["kernels", str(dlrm_db), "1", "--compare", "2", "--top", "3"]) == 0
    text = capsys.readouterr().out
    assert "A = run 1 (dlrm-baseline)" in text and "B = run 2 (dlrm-slower)" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("ncclKernel_AllReduce"))
    assert line.split()[-4:] == ["5.480", "15.347", "+9.867", "2.80x"]


def test_one_runs_table(dlrm_db: Path, capsys) -> None:
    assert main(["kernels", str(dlrm_db), "1", "--format", "json"]) == 0
    t = orjson.loads(capsys.readouterr().out)
    assert (t["run_id"], t["source"], t["windows"], t["steps"]) == (1, "snapshot", 6, 6)
    comm_share = sum(k["share"] for k in t["kernels"] if k["cls"] == "comm")
    assert 0.30 < comm_share < 0.42  # README: NCCL ~36 % of kernel time in the baseline
    ar = next(k for k in t["kernels"] if k["name"] == ALLREDUCE)
    assert ar["per_step_ms"] == pytest.approx(5.48, abs=0.01)
    assert ar["mean_us"] == pytest.approx(ar["total_ms"] * 1000 / ar["count"], rel=1e-3)
    assert t["shown"] == t["of"] == len(t["kernels"])

    assert main(["kernels", str(dlrm_db), "1", "--top", "5"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("run 1 (dlrm-baseline): kernels from 6 snapshot window(s), 6 steps")
    assert "by class: compute " in text and "comm 3" in text
    assert "NAME" in text and "MS/STEP" in text and "more; --top N or --format json" in text


def test_latest_run_default_and_no_kernels(tmp_path: Path, capsys) -> None:
    db = tmp_path / "g.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    store_run(conn, 1, "empty", [])
    conn.commit()
    conn.close()
    assert main(["kernels", str(db)]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("run 1 (empty): no trace windows in this run: ")
    # why there are none, and the profile() option that records them
    assert "gpuprof records kernels only while tracing is on, and this run was not traced" in out
    assert "Turn it on with gpuprof.profile(..., trace_every_n_steps=N)" in out
    assert "gpuprofctl nsys-import" in out
    assert main(["kernels", str(db), "--kind", "op"]) == 0
    assert "records operators only while tracing is on" in capsys.readouterr().out
    assert main(["kernels", str(db), "--compare", "1"]) == 0
    assert "no kernel data in run 1 (empty) or run 1 (empty)" in capsys.readouterr().out
    assert main(["kernels", str(db), "7"]) == 2
    assert "no run 7" in capsys.readouterr().err


def _cpu_windows(flops_mm: float) -> list:
    """Snapshot windows as a CPU-only traced run sends them: operator rows with
    FLOPs and no device time, no kernel rows (tests/shim/test_trace.py)."""
    return [
        _w(
            "snapshot",
            [i],
            [
                KernelAgg("aten::mm", "op", "compute", 5, 0, 0, flops_mm),
                KernelAgg("aten::addmm", "op", "compute", 3, 0, 0, 3456.0),
            ],
            t0=i * 100,
        )
        for i in (0, 1, 5)
    ]


@pytest.fixture
def cpu_db(tmp_path: Path) -> Path:
    db = tmp_path / "g.db"
    schema.prepare(db)
    conn = sqlite3.connect(db)
    store_run(conn, 1, "cpu-a", _cpu_windows(5888.0))
    store_run(conn, 2, "cpu-b", _cpu_windows(11776.0))
    conn.commit()
    conn.close()
    return db


def test_a_cpu_only_run_says_it_has_operators_and_names_kind_op(cpu_db: Path, capsys) -> None:
    assert main(["kernels", str(cpu_db)]) == 0
    assert capsys.readouterr().out.strip() == (
        "run 2 (cpu-b): no GPU kernels in its 3 snapshot windows, only operators "
        "(a CPU-only run): see --kind op for their FLOPs"
    )
    assert main(["kernels", str(cpu_db), "1", "--compare", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "no kernel data in run 1 (cpu-a) or run 2 (cpu-b)"
    assert lines[1].startswith("run 1 (cpu-a): no GPU kernels in its 3 snapshot windows")
    assert all("see --kind op" in line for line in lines[1:])


def test_a_cpu_only_runs_operators_show_flops_not_zero_times(cpu_db: Path, capsys) -> None:
    assert main(["kernels", str(cpu_db), "2", "--kind", "op"]) == 0
    out = capsys.readouterr().out
    head, cols, mm, addmm = out.strip().splitlines()
    assert head.startswith("run 2 (cpu-b): ops from 3 snapshot window(s), 3 steps, no device time")
    assert cols.split() == ["NAME", "CLASS", "COUNT", "FLOP/STEP"]
    # 15 calls of 11776 FLOP each window over 3 steps: 11.8k FLOP per step
    assert mm.split() == ["aten::mm", "compute", "15", "11.8k"]
    assert addmm.split() == ["aten::addmm", "compute", "9", "3.46k"]
    assert "0.000" not in out
    assert main(["kernels", str(cpu_db), "1", "--compare", "2", "--kind", "op"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0] == "no device time in run 1 (cpu-a) or run 2 (cpu-b): nothing to compare"
    assert lines[2] == (
        "run 2 (cpu-b): ops without device time (a CPU-only run); "
        "their FLOPs: gpuprofctl kernels 2 --kind op"
    )


def test_a_gpu_runs_operators_show_their_flops_beside_device_time() -> None:
    mm = KernelAgg("aten::mm", "op", "compute", 4, 9_000_000, 8_000_000, 2e12)
    table = kerneltable.build_table([_w("snapshot", [1, 2], [mm])], kind="op")
    text = kerneltable.format_table(table)
    cols, row = text.splitlines()[2:4]
    assert cols.split() == ["NAME", "CLASS", "SHARE%", "COUNT", "MEAN_US", "MS/STEP", "FLOP/STEP"]
    assert row.split() == ["aten::mm", "compute", "100.0", "4", "2000.0", "4.000", "1T"]


def _w(source: str, steps: list[int], rows: list[KernelAgg], t0: int = 0):
    return ({"t0": t0, "t1": t0 + 10, "source": source, "steps": steps, "rows_dropped": 0}, rows)


def test_table_picks_one_source_and_normalises() -> None:
    gemm = KernelAgg("gemm", "kernel", "compute", 4, 8_000_000, 8_000_000)
    mm = KernelAgg("aten::mm", "op", "compute", 4, 9_000_000, 8_000_000, 1e12)
    windows = [
        _w("snapshot", [1], [gemm, mm]),
        _w("continuous", [0, 1], [gemm]),
        _w("continuous", [], [gemm]),
    ]
    t = kerneltable.build_table(windows)
    # continuous preferred; the snapshot's copy of step 1 is not counted twice
    assert (t.source, t.windows, t.steps, t.total_ns) == ("continuous", 2, None, 16_000_000)
    assert t.per_window_ms(t.total_ns) == 8.0
    s = kerneltable.build_table(windows, "snapshot")
    assert (s.steps, s.lines[0].count, s.per_step_ms(s.lines[0].total_ns)) == (1, 4, 8.0)
    ops = kerneltable.build_table(windows, "snapshot", kind="op")
    assert [(k.name, k.total_ns, k.flops) for k in ops.lines] == [("aten::mm", 8_000_000, 1e12)]
    cmp = kerneltable.compare(s, t)
    assert cmp["basis"] == "window"
    assert cmp["kernels"] == [
        {"name": "gemm", "cls": "compute", "a_ms": 8.0, "b_ms": 8.0, "delta_ms": 0.0, "ratio": 1.0}
    ]
    new = kerneltable.compare(kerneltable.build_table([]), s)
    assert new["kernels"][0]["ratio"] is None and new["kernels"][0]["delta_ms"] == 8.0


def test_insights_shows_top_kernels_and_mfu(dlrm_db: Path, tmp_path: Path, capsys) -> None:
    assert main(["insights", str(dlrm_db), "1", "--format", "json"]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    top = summary["top_kernels"]
    assert len(top) == 10 and top == sorted(top, key=lambda k: -k["share"])
    assert summary["kernels_source"] == {"source": "snapshot", "windows": 6, "steps": 6}
    sendrecv = next(k for k in top if k["name"] == SENDRECV)
    assert sendrecv["share"] == pytest.approx(21.776 / 83.594, abs=0.002)
    assert {"name", "cls", "share", "count", "mean_us", "per_step_ms"} <= set(sendrecv)
    assert summary["mfu"] is None and summary["achieved_tflops"] is None

    assert main(["insights", str(dlrm_db), "1"]) == 0
    text = capsys.readouterr().out
    assert "  Top kernels (6 snapshot window(s); share of device time, launches, mean):" in text
    line = next(ln for ln in text.splitlines() if ln.endswith(SENDRECV))
    assert line.split()[:2] == ["26.1", "%"]
    assert "MFU: unknown" in text

    # the FLOPs side sets runs.mfu / achieved_tflops at run end: shown as stored
    db = tmp_path / "mfu.db"
    db.write_bytes(dlrm_db.read_bytes())
    conn = sqlite3.connect(db)
    conn.execute("UPDATE runs SET mfu = 0.4213, achieved_tflops = 131.4 WHERE id = 1")
    conn.commit()
    conn.close()
    assert main(["insights", str(db), "1"]) == 0
    text = capsys.readouterr().out
    # (the summary's own text may print it; else the added line does)
    assert "MFU" in text and "42.1" in text and "MFU: unknown" not in text
    assert main(["insights", str(db), "1", "--format", "json"]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    assert (summary["mfu"], summary["achieved_tflops"]) == (0.4213, 131.4)
