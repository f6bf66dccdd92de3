"""The context's per-step figures from numpy columns: the same as from the
rows, on a run that varies everything the columns must carry."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest

from gpuprof import stats
from gpuprof.insights import build_context, run_rules
from gpuprof.insights.hostcpu import cpu_columns, host_columns, intervals, step_cpu
from gpuprof.insights.stepcols import step_columns

MS = 1_000_000


def _varied_run(n: int = 900, seed: int = 7) -> tuple[dict, list[dict], list[dict], list[dict]]:
    """Traced steps, phase sets that change (a data phase every 5th step, a
    comm phase from step 301 listed first, gpuprof's own time every 7th),
    slow steps, optimizers, torch memory on 2 steps in 3, step numbers that
    skip; host samples at a jittered 0.5 s with readings missing, the run's
    CPU missing at some of their times."""
    rnd = random.Random(seed)
    run = {"run_name": "v", "status": "finished", "start_mono_ns": 0, "cpu_count": 4}
    steps, t = [], 50 * MS
    for i in range(n):
        wait, dur = rnd.randrange(30 * MS), rnd.randrange(20 * MS, 400 * MS) if i % 97 else 900 * MS
        phases = {"forward": dur // 3, "backward": dur // 2}
        if i % 5 == 0:
            phases["data"] = rnd.randrange(MS, 5 * MS)
        if i > 300:
            phases = {"comm": rnd.randrange(MS, 9 * MS), **phases}
        if i % 7 == 0:
            phases["gpuprof"] = rnd.randrange(1000, 90_000)
        s: dict[str, Any] = {
            "step": i * 2,
            "t0": t + wait,
            "t1": t + wait + dur,
            "wait": wait,
            "explicit": i % 11 == 0,
            "micro": 1 + i % 3,
            "phases": phases,
            "skipped": i % 13 == 0,
            "eval": 5 * MS if i % 50 == 0 else 0,
            "optimizers": [{"name": "adam", "updates": 1, "skipped": 0, "ns": 3 * MS + i}]
            if i % 2
            else [],
        }
        if i % 3:
            s["mem"] = [2**30 + i, 2**31 + i * 7 % 1000, 2**30 + i * 13 % 5000]
        if i % 41 == 5:
            s["traced"] = True
        steps.append(s)
        t = s["t1"]
    host, own, h = [], [], 0
    while h < t + 2000 * MS:
        h += 500 * MS + rnd.randrange(-20 * MS, 20 * MS)
        host.append(
            {
                "mono_ns": h,
                "cpu_pct": rnd.uniform(5, 100),
                "cpu_count": None if rnd.random() < 0.02 else 4,
                "disk_read_bps": None if rnd.random() < 0.1 else rnd.uniform(0, 3e8),
                "disk_read_iops": rnd.uniform(0, 900),
                "page_cache_bytes": rnd.randrange(2**34),
                "mem_total_bytes": 2**36,
                "swap_in_bps": 0.0 if rnd.random() < 0.9 else None,
            }
        )
        if rnd.random() < 0.93:
            own.append({"mono_ns": h, "cores": rnd.uniform(0.2, 3.5)})
    return run, steps, host, own


def _fields(ctx: Any) -> dict[str, Any]:
    return {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)}


def test_columns_and_rows_give_the_same_context():
    run, steps, host, own = _varied_run()
    job = [{"cores": 4.25, "ranks": 2}]
    rows = build_context(run, steps, host, run_cpu=own, job_cpu=job)
    cols = build_context(
        run, step_columns(steps), host_columns(host), run_cpu=cpu_columns(own), job_cpu=job
    )
    assert repr(_fields(cols)) == repr(_fields(rows))
    assert [i.to_dict() for i in run_rules(cols)] == [i.to_dict() for i in run_rules(rows)]


def test_the_columns_figures_are_the_rows_figures_summed_in_python():
    run, steps, host, own = _varied_run()
    ctx = build_context(run, steps, host, run_cpu=own, job_cpu=[{"cores": 4.25, "ranks": 2}])
    timed = [s for s in steps if not s.get("traced")]
    assert ctx.traced_steps == len(steps) - len(timed) == 22
    assert ctx.step_numbers == tuple(s["step"] for s in timed)
    assert ctx.traced_step_numbers == tuple(s["step"] for s in steps if s.get("traced"))
    own_ns = [s["phases"].get("gpuprof", 0) for s in timed]
    assert ctx.step_ms == tuple(
        (s["t1"] - s["t0"] - o) / 1e6 for s, o in zip(timed, own_ns, strict=True)
    )
    assert ctx.data_ms == tuple(s["phases"].get("data", 0) / 1e6 for s in timed)
    assert ctx.comm_ms == tuple(s["phases"].get("comm", 0) / 1e6 for s in timed)
    # phases in the order first listed: comm comes in at step 301
    assert list(ctx.phase_ms) == ["forward", "backward", "data", "gpuprof", "comm"]
    for name, ms in ctx.phase_ms.items():
        assert ms == sum(s["phases"].get(name, 0) for s in timed) / 1e6
    assert ctx.skipped_updates == sum(s["skipped"] for s in steps)
    assert ctx.torch_peak_allocated_bytes == max(s["mem"][2] for s in steps if "mem" in s)
    assert ctx.torch_peak_reserved_bytes == max(s["mem"][1] for s in steps if "mem" in s)
    assert ctx.eval_ms == sum(s["eval"] for s in steps) / 1e6
    # every odd step's 3 ms + i ns: 1,350.2025 ms, summed in ms and rounded to µs
    assert ctx.optimizers == (("adam", 450, 0, pytest.approx(1350.2025, abs=1e-3), 450),)
    # per step: the host samples each iteration overlaps, through the row path
    per = step_cpu([(s["t0"] - s["wait"], s["t1"]) for s in timed], intervals(host, own), 4, 0.0)
    assert ctx.step_host_pct == per.host_pct
    assert ctx.step_own_cores == per.own_cores
    assert sum(v is None for v in ctx.step_own_cores) < len(timed) // 4
    disk = [h["disk_read_bps"] for h in host if h["disk_read_bps"] is not None]
    assert ctx.host_disk_read_bps == math.fsum(disk) / len(disk)
    assert ctx.host_disk_read_bps_median == stats.median(disk)  # found by np.partition
    # the first sample's interval is the median gap between the timed, counted samples
    counted = [h["mono_ns"] for h in host if h["cpu_count"]]
    first = intervals(host, own)[0]
    gaps = [b - a for a, b in zip(counted, counted[1:], strict=False)]
    assert first.t1_ns - first.t0_ns == int(stats.median(gaps))
    # the thirds of the iterations summed by numpy: a Python loop's sums
    iteration = [a + b for a, b in zip(ctx.step_ms, ctx.wait_ms, strict=True)]
    third = len(timed) // 3
    assert ctx.iteration_ms_thirds == (
        stats.median(iteration[:third]),
        stats.median(iteration[-third:]),
    )
    cache = [h["page_cache_bytes"] / h["mem_total_bytes"] for h in host]
    assert ctx.page_cache_fraction == math.fsum(cache) / len(cache)
