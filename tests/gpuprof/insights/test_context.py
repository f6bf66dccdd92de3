from __future__ import annotations

import pytest

from gpuprof import stats
from gpuprof.insights import RunContext, build_context
from gpuprof.insights.context import _optimizer_totals


def test_build_context_aggregates_rows():
    run = {
        "run_name": "r",
        "status": "finished",
        "start_mono_ns": 0,
        "end_mono_ns": 4_000_000_000,
        "options": {"flops_per_step": 1e12, "dtype": "bf16"},
        "gpu_model": None,
        "gpu_count": None,
        "cpu_count": 2,
    }
    steps = [
        {
            "t0": 10_000_000,
            "t1": 30_000_000,
            "wait": 10_000_000,
            "explicit": False,
            "micro": 2,
            "phases": {"forward": 5_000_000, "backward": 10_000_000},
        },
        {
            "t0": 40_000_000,
            "t1": 50_000_000,
            "wait": 10_000_000,
            "explicit": True,
            "micro": 1,
            "phases": {"forward": 4_000_000, "data": 1_000_000},
        },
    ]
    ctx = build_context(
        run,
        steps,
        host=[{"cpu_pct": 50.0, "disk_read_bps": None}, {"cpu_pct": 100.0, "disk_read_bps": 10.0}],
        history_median_step_ms=[9.0],
        run_cpu=[{"cores": 1.0}, {"cores": 2.0}],
    )
    assert ctx.step_ms == (20.0, 10.0)
    assert ctx.wait_ms == (10.0, 10.0)
    assert ctx.explicit_wait is True
    assert ctx.micro_batches == (2, 1)
    assert ctx.phase_ms == {"forward": 9.0, "backward": 10.0, "data": 1.0}
    assert ctx.duration_s == pytest.approx(4.0)
    assert (ctx.host_cpu_pct, ctx.host_disk_read_bps, ctx.run_cpu_cores) == (75.0, 10.0, 1.5)
    assert (ctx.gpu_count, ctx.flops_per_step, ctx.dtype) == (0, 1e12, "bf16")
    assert ctx.history_median_step_ms == (9.0,)


def test_build_context_live_run_ends_at_last_step():
    run = {"run_name": "r", "status": "running", "start_mono_ns": 0, "end_mono_ns": None}
    steps = [{"t0": 0, "t1": 2_000_000_000, "wait": 0, "phases": {}}]
    ctx = build_context(run, steps)
    assert ctx.duration_s == pytest.approx(2.0)
    assert ctx.host_cpu_pct is None and ctx.run_cpu_cores is None


def test_build_context_counts_skipped_updates_and_eval_including_trailing():
    run = {
        "run_name": "r",
        "status": "finished",
        "start_mono_ns": 0,
        "end_mono_ns": 10**10,
        "trailing_eval_ns": 250_000_000,
    }
    steps = [
        {"t0": 0, "t1": 1, "wait": 0, "phases": {}},
        {"t0": 2, "t1": 3, "wait": 0, "phases": {}, "skipped": True, "eval": 0},
        {"t0": 4, "t1": 5, "wait": 0, "phases": {}, "skipped": False, "eval": 750_000_000},
    ]
    ctx = build_context(run, steps)
    assert (ctx.skipped_updates, ctx.eval_ms) == (1, 1000.0)


def test_gpuprofs_own_time_in_a_step_is_not_step_time():
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": 10**9}
    steps = [
        {"t0": 0, "t1": 2_000_000, "wait": 0, "phases": {"forward": 1_000_000}},
        {"t0": 3_000_000, "t1": 5_500_000, "wait": 0, "phases": {"gpuprof": 500_000}},
    ]
    assert build_context(run, steps).step_ms == (2.0, 2.0)


def test_build_context_sums_each_optimizers_updates_and_time():
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": 10**9}
    opt = [
        {"name": "SGD#0", "updates": 1, "skipped": 0, "ns": 2_000_000},
        {"name": "Adam#1", "updates": 1, "skipped": 0, "ns": 500_000},
    ]
    steps = [
        {"t0": 0, "t1": 1, "wait": 0, "phases": {}, "optimizers": opt},
        {
            "t0": 2,
            "t1": 3,
            "wait": 0,
            "phases": {},
            "optimizers": [dict(opt[0], updates=0, skipped=1)],
        },
        {"t0": 4, "t1": 5, "wait": 0, "phases": {}},
    ]
    assert build_context(run, steps).optimizers == (
        ("SGD#0", 1, 1, 4.0, 2),  # stepped in 2 steps (one update skipped)
        ("Adam#1", 1, 0, 0.5, 1),
    )


def test_build_context_takes_torch_memory_peaks_from_steps_that_report_them():
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": 10}
    steps = [
        {"t0": 0, "t1": 1, "wait": 0, "phases": {}},  # no reading for this step
        {"t0": 2, "t1": 3, "wait": 0, "phases": {}, "mem": [100, 400, 300]},
        # allocated and reserved fell (empty_cache), the cumulative peak did not
        {"t0": 4, "t1": 5, "wait": 0, "phases": {}, "mem": [90, 350, 700]},
        {"t0": 6, "t1": 7, "wait": 0, "phases": {}, "mem": [95, 380, 650]},  # peak reset
    ]
    ctx = build_context(run, steps)
    assert ctx.torch_peak_allocated_bytes == 700
    assert ctx.torch_peak_reserved_bytes == 400


def test_build_context_without_torch_memory_is_none_not_zero():
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": 10}
    ctx = build_context(run, [{"t0": 0, "t1": 1, "wait": 0, "phases": {}}])
    assert ctx.torch_peak_allocated_bytes is None and ctx.torch_peak_reserved_bytes is None


def test_traced_steps_are_left_out_of_the_timing_figures():
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": 10**9}

    def step(i: int, ms: int, traced: bool) -> dict:
        t0 = i * 100_000_000
        s = {
            "t0": t0,
            "t1": t0 + ms * 1_000_000,
            "wait": (ms // 10) * 1_000_000,
            "explicit": False,
            "micro": 1 + traced,
            "phases": {"forward": ms * 1_000_000},
        }
        return {**s, "traced": True} if traced else s

    # a profiler snapshot made steps 0 and 3 five times slower
    steps = [
        step(0, 50, True),
        step(1, 10, False),
        step(2, 12, False),
        step(3, 60, True),
        step(4, 11, False),
    ]
    ctx = build_context(run, steps)
    assert ctx.step_ms == (10.0, 12.0, 11.0)
    assert ctx.wait_ms == (1.0, 1.0, 1.0)
    assert ctx.micro_batches == (1, 1, 1)
    assert ctx.phase_ms == {"forward": 33.0}
    assert (ctx.steps, ctx.traced_steps) == (3, 2)
    untraced = build_context(run, [s for s in steps if not s.get("traced")])
    assert ctx.median_step_ms == untraced.median_step_ms < 14  # the run's median, MFU, baseline
    # every step traced (trace_range over the whole run): better those than nothing
    assert build_context(run, [step(0, 50, True), step(1, 60, True)]).step_ms == (50.0, 60.0)


def test_steps_keep_their_numbers_in_the_run_with_steps_traced_or_lost():
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": 10**9}

    def step(i: int, traced: bool = False) -> dict:
        s = {"step": i, "t0": i * 1_000_000, "t1": i * 1_000_000 + 500_000, "wait": 0}
        return {**s, "traced": True} if traced else s

    # step 2 traced, steps 4-5 lost on the way
    ctx = build_context(run, [step(0), step(1), step(2, True), step(3), step(6), step(7)])
    assert ctx.step_numbers == (0, 1, 3, 6, 7) == ctx.numbers
    assert ctx.traced_step_numbers == (2,)
    # a manual loop numbering each epoch from 0 again: positions among all steps
    epochs = [step(0), step(1, True), step(2), step(0), step(1), step(2)]
    again = build_context(run, [dict(s, t0=k, t1=k + 1) for k, s in enumerate(epochs)])
    assert again.step_numbers == (0, 2, 3, 4, 5) and again.traced_step_numbers == (1,)
    # no numbers stored: the positions, traced steps counted
    bare = [{k: v for k, v in step(i, i == 1).items() if k != "step"} for i in range(4)]
    assert build_context(run, bare).step_numbers == (0, 2, 3)
    # a context built without them numbers its steps by position
    assert RunContext(run_name="r", status="x", step_ms=(1.0, 2.0), wait_ms=(0, 0)).numbers == (
        0,
        1,
    )


def test_loader_thirds_are_the_median_wait_plus_data_phase_of_the_first_and_last_third():
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": 10**9}
    waits = [40, 30, 50, 20, 20, 20, 3, 5, 4]  # ms
    steps = [
        {
            "t0": k * 100_000_000,
            "t1": k * 100_000_000 + 50_000_000,
            "wait": w * 1_000_000,
            "phases": {"data": 2_000_000},
        }
        for k, w in enumerate(waits)
    ]
    ctx = build_context(run, steps)
    assert ctx.loader_ms_thirds == (42.0, 6.0)
    assert ctx.iteration_ms_thirds == (90.0, 54.0)
    assert build_context(run, steps[:2]).loader_ms_thirds is None


def test_loader_settings_from_the_options_reach_the_context():
    from gpuprof.insights.base import LoaderConfig

    cfg = {"num_workers": 2, "persistent_workers": True, "pin_memory": False, "prefetch_factor": 2}
    run = {"run_name": "r", "status": "finished", "options": {"loaders": [cfg, {"bad": 1}]}}
    ctx = build_context(run, [])
    assert ctx.loaders == (LoaderConfig(2, True, False, 2),)  # the malformed entry skipped
    assert build_context({"run_name": "r", "status": "finished"}, []).loaders == ()


def test_optimizer_totals_count_the_steps_each_stepped_in():
    def opt(name, ns, updates=1):
        return {"name": name, "updates": updates, "skipped": 0, "ns": ns}

    steps = [  # a critic stepping 5 times a step, a generator once, the last step critic only
        {"optimizers": [opt("critic", 5_000_000, 5), opt("gen", 2_000_000)]},
        {"optimizers": [opt("critic", 5_000_000, 5), opt("gen", 2_000_000)]},
        {"optimizers": [opt("critic", 5_000_000, 5)]},
    ]
    assert _optimizer_totals(steps) == (("critic", 15, 0, 15.0, 3), ("gen", 2, 0, 4.0, 2))


def _step(i: int, step_ms: float, wait_ms: float, **kw) -> dict:
    t0 = i * 1_000_000_000
    return {"t0": t0, "t1": t0 + int(step_ms * 1e6), "wait": int(wait_ms * 1e6), **kw}


def test_steady_figures_and_shape_for_the_compare():
    from gpuprof.insights.context import steady_iterations

    run = {
        "run_name": "r",
        "status": "finished",
        "world_size": 4,
        "options": {"tokens_per_step": 8192, "samples_per_step": 16},
    }
    steps = [_step(i, 50.0, 20.0, phases={"forward": 30_000_000}) for i in range(3)]  # warm-up
    steps += [
        _step(i, 10.0, 2.0, phases={"forward": 4_000_000, "gpuprof": 1_000_000})
        for i in range(3, 10)
    ]
    steps[5]["traced"] = True  # a profiler window: left out
    ctx = build_context(run, steps, history_iteration_ms=[(12.0, 13.0), ()])
    assert ctx.steady_iteration_ms == (11.0,) * 6  # 10 ms step - 1 ms own time + 2 ms wait
    assert steady_iterations(steps) == ctx.steady_iteration_ms
    assert steady_iterations(steps[4:], whole=False) == (11.0,) * 5  # a run's last steps
    assert ctx.steady_phase_ms == {"forward": 24.0, "gpuprof": 6.0}
    # every step's phases: the warm-up's (3 x 30 ms forward) and the steady ones
    assert ctx.phase_ms == {"forward": 114.0, "gpuprof": 6.0}
    assert (ctx.world_size, ctx.tokens_per_step, ctx.samples_per_step) == (4, 8192, 16)
    assert ctx.history_iteration_ms == ((12.0, 13.0), ())


def test_a_shape_declared_badly_is_not_taken():
    run = {"run_name": "r", "status": "finished", "options": {"samples_per_step": "16"}}
    ctx = build_context(run, [_step(0, 10.0, 0.0)])
    assert (ctx.world_size, ctx.tokens_per_step, ctx.samples_per_step) == (1, None, None)


def test_iteration_and_loader_sums_are_the_loops() -> None:
    """RunContext's per-step sums (``map``) are a loop's values and types,
    and figures of different lengths are an error, as ``zip(strict=True)``."""
    import dataclasses

    from gpuprof.insights.base import _pairwise_sums

    step = (1.5, 2, 0.1, 1e300)
    wait = (0.25, 3, 0.2, 1e300)
    got = _pairwise_sums(step, wait)
    assert got == tuple(s + w for s, w in zip(step, wait, strict=True))
    assert [type(v) for v in got] == [float, int, float, float]
    assert got[2] == 0.30000000000000004
    with pytest.raises(ValueError, match="different lengths"):
        _pairwise_sums(step, wait[:2])
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": 10**11}
    steps = [
        {"t0": i * 10**9 + 7 * i, "t1": (i + 1) * 10**9, "wait": 3 * i + 1, "phases": {}}
        for i in range(30)
    ]
    ctx = build_context(run, steps)
    assert ctx.iteration_ms == tuple(s + w for s, w in zip(ctx.step_ms, ctx.wait_ms, strict=True))
    # the context's thirds come from the same sums, made by numpy
    third = [s + w for s, w in zip(ctx.step_ms, ctx.wait_ms, strict=True)]
    assert ctx.iteration_ms_thirds == (stats.median(third[:10]), stats.median(third[-10:]))
    with_data = dataclasses.replace(ctx, data_ms=tuple(float(i) for i in range(30)))
    assert with_data.loader_ms == tuple(w + i for i, w in enumerate(ctx.wait_ms))


def _steps_with_host_work(explicit: bool) -> list[dict]:
    """5 steps of 10 ms; before each but the first 2 ms of timed loader wait,
    3 ms of evaluation (step 3) and 25 ms of host work (a checkpoint)."""
    steps, t = [], 0
    for i in range(5):
        ev = 3_000_000 if i == 3 else 0
        wait = 0 if i == 0 else 2_000_000
        t0 = t + (0 if i == 0 else wait + ev + 25_000_000)
        if not explicit and i:
            wait = t0 - t - ev  # gap mode: the wait is the whole gap
        steps.append(
            {
                "t0": t0,
                "t1": t0 + 10_000_000,
                "wait": wait,
                "explicit": explicit,
                "eval": ev,
                "phases": {},
                "traced": i == 2,
            }
        )
        t = t0 + 10_000_000
    return steps


def test_host_work_between_timed_steps_is_part_of_the_iteration():
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": None}
    ctx = build_context(run, _steps_with_host_work(explicit=True))
    # the traced step (2) left out; the first step has no gap before it
    assert ctx.gap_ms == (0.0, 25.0, 25.0, 25.0)
    assert ctx.wait_ms == (0.0, 2.0, 2.0, 2.0)
    assert ctx.iteration_ms == (10.0, 37.0, 37.0, 37.0)
    # a loop without a timed loader: the wait already is the gap (eval apart)
    gap_mode = build_context(run, _steps_with_host_work(explicit=False))
    assert gap_mode.gap_ms == ()
    assert gap_mode.iteration_ms == (10.0, 37.0, 37.0, 37.0)


def test_steps_whose_clocks_overlap_have_no_host_gap():
    from gpuprof.insights.stepcols import step_columns

    steps = [
        {"t0": 0, "t1": 10, "wait": 0, "explicit": True, "phases": {}},
        {
            "t0": 8,
            "t1": 20,
            "wait": 5,
            "explicit": True,
            "phases": {},
        },  # a wait longer than the gap
        {"t0": 30, "t1": 40, "wait": 4, "explicit": True, "phases": {}},
    ]
    assert step_columns(steps).between_steps_ns().tolist() == [0, 0, 6]
