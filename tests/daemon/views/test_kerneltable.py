"""Kernel tables: which windows a table reads, and when a comparison of two
runs is not like for like (found by a fresh-user pass: identical nsys reports
compared at 0.22x, continuous op-only windows hiding an nsys import)."""

from __future__ import annotations

from gpuprof.kernels import KernelAgg
from gpuprofd.views import kerneltable

MS = 1_000_000


def _kernel(name: str, ms: float, count: int = 1) -> KernelAgg:
    ns = int(ms * MS)
    return KernelAgg(name, "kernel", "compute", count, ns, ns)


def _op(name: str) -> KernelAgg:  # what a CPU run's continuous windows hold
    return KernelAgg(name, "op", "compute", 3, 0, 0, 1e6)


def _win(source: str, steps: list[int] | None, rows: list[KernelAgg]) -> tuple[dict, list]:
    return {"t0": 0, "t1": 1, "source": source, "steps": steps or []}, rows


def test_a_table_reads_the_source_that_timed_kernels_not_op_only_windows():
    windows = [_win("continuous", [i], [_op("aten::mm")]) for i in range(3)]
    windows += [_win("nsys", [i], [_kernel("gemm", 2.0)]) for i in range(2)]
    table = kerneltable.build_table(windows)
    assert (table.source, table.steps, [k.name for k in table.lines]) == ("nsys", 2, ["gemm"])
    assert table.per_step_ms(table.total_ns) == 2.0
    # operators are still the continuous windows' (they have no device time either way)
    assert kerneltable.build_table(windows, kind="op").source == "continuous"


def test_a_comparison_of_per_step_and_whole_capture_windows_warns():
    steps = [_win("nsys", [i], [_kernel("gemm", 2.0)]) for i in range(4)]
    per_step = kerneltable.build_table(steps)
    whole = kerneltable.build_table([_win("nsys", None, [_kernel("gemm", 8.0, count=4)])])
    cmp = kerneltable.compare(whole, per_step)
    assert cmp["basis"] == "window"
    assert len(cmp["warnings"]) == 1 and "per-window times differ" in cmp["warnings"][0]
    text = kerneltable.format_compare(cmp, "run 2", "run 4")
    assert "warning: one run's windows are steps" in text
    # like for like: no warning
    same = kerneltable.compare(per_step, per_step)
    assert same["warnings"] == [] and same["kernels"][0]["ratio"] == 1.0


def test_runs_are_compared_on_a_source_both_have():
    a = [_win("continuous", [1], [_kernel("gemm", 1.0)]), _win("nsys", [1], [_kernel("gemm", 3.0)])]
    b = [_win("nsys", [1], [_kernel("gemm", 3.0)])]
    assert kerneltable.common_source(a, b) == "nsys"
    assert kerneltable.common_source(a, [_win("snapshot", [1], [_kernel("x", 1.0)])]) is None
    mixed = kerneltable.compare(kerneltable.build_table(a), kerneltable.build_table(b))
    assert "not like for like" in mixed["warnings"][0]  # continuous vs nsys, said so


def test_a_comparison_with_a_run_without_kernels_says_so():
    timed = kerneltable.build_table([_win("snapshot", [1], [_kernel("gemm", 2.0)])])
    empty = kerneltable.build_table([])
    assert empty.source is None
    out = kerneltable.compare(timed, empty)
    assert "run B has no kernel data: its column is empty" in out["warnings"]
    assert not any("None" in w for w in out["warnings"])
