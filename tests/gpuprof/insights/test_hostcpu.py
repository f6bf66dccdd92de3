"""Host CPU aligned to steps: each iteration gets the samples it overlaps."""

from __future__ import annotations

import pytest

from gpuprof.insights import build_context
from gpuprof.insights.hostcpu import intervals, step_cpu

MS = 1_000_000
RUN = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "cpu_count": 2}


def _host(*pcts: float, every_ms: int = 500):
    """Host samples every *every_ms* from t = every_ms, with these cpu_pct."""
    return [
        {"mono_ns": (i + 1) * every_ms * MS, "cpu_pct": p, "cpu_count": 2}
        for i, p in enumerate(pcts)
    ]


def _own(*cores: float, every_ms: int = 500):
    return [{"mono_ns": (i + 1) * every_ms * MS, "cores": c} for i, c in enumerate(cores)]


def test_each_step_gets_the_samples_its_iteration_overlaps():
    spans = intervals(_host(50.0, 100.0), _own(0.5, 0.8))
    # sample 1 covers (0, 500] ms, sample 2 (500, 1000] ms
    windows = [(100 * MS, 200 * MS), (400 * MS, 600 * MS), (700 * MS, 900 * MS)]
    cpu = step_cpu(windows, spans, 2)
    assert cpu.host_pct == pytest.approx((50.0, 75.0, 100.0))
    assert cpu.own_cores == pytest.approx((0.5, 0.65, 0.8))
    # others: busy cores − own: 1.0 − 0.5; half of each sample; 2.0 − 0.8
    assert cpu.other_cores == pytest.approx((0.5, 0.85, 1.2))


def test_steps_outside_every_sample_or_unsampled_runs_read_none():
    spans = intervals(_host(50.0), _own(0.5))
    cpu = step_cpu([(2_000 * MS, 2_100 * MS)], spans, 2)
    assert cpu == ((None,), (None,), (None,))
    assert step_cpu([(0, 1)], [], 2) == ((), (), ())
    # a host sample without the run's own figure: host known, others unknown
    cpu = step_cpu([(100 * MS, 200 * MS)], intervals(_host(50.0), []), 2)
    assert cpu.host_pct == (50.0,) and cpu.other_cores == (None,)


def test_the_job_s_other_ranks_are_not_other_processes():
    spans = intervals(_host(100.0), _own(0.8))
    cpu = step_cpu([(100 * MS, 200 * MS)], spans, 2, sibling_cores=0.8)
    assert cpu.other_cores == pytest.approx((0.4,))


def _steps(n: int, every_ms: int = 100):
    return [
        {
            "t0": i * every_ms * MS + 10 * MS,
            "t1": (i + 1) * every_ms * MS,
            "wait": 10 * MS,
            "explicit": True,
            "micro": 1,
            "phases": {},
        }
        for i in range(n)
    ]


def test_build_context_takes_the_host_cpu_during_the_steps_only():
    # 2 s of steps from t = 0; a busy sample long after the last step is left out
    host = _host(90.0, 90.0, 90.0, 90.0) + [{"mono_ns": 9_000 * MS, "cpu_pct": 0.0, "cpu_count": 2}]
    ctx = build_context(RUN, _steps(20), host, run_cpu=_own(1.8, 1.8, 1.8, 1.8))
    assert ctx.host_cpu_pct == pytest.approx(90.0)
    assert ctx.run_cpu_cores == pytest.approx(1.8)
    assert len(ctx.step_other_cores) == 20
    assert ctx.step_other_cores[0] == pytest.approx(0.0)
    # rows without times (an older reader): plain means, no per-step figures
    flat = build_context(RUN, _steps(20), [{"cpu_pct": 40.0}], run_cpu=[{"cores": 1.0}])
    assert (flat.host_cpu_pct, flat.run_cpu_cores, flat.step_other_cores) == (40.0, 1.0, ())


def _reference(windows, spans):
    """Each window's time-weighted (host, own) cores, by the definition: a walk
    over every span."""
    out = []
    for t0, t1 in windows:
        t1 = max(t1, t0 + 1)
        w_all = w_own = 0
        host = own = 0.0
        for s in spans:
            w = min(s.t1_ns, t1) - max(s.t0_ns, t0)
            if w > 0:
                w_all += w
                host += s.host_cores * w
                if s.own_cores is not None:
                    w_own += w
                    own += s.own_cores * w
        out.append((host / w_all if w_all else None, own / w_own if w_own else None))
    return out


def test_every_window_reads_what_the_walk_over_the_spans_reads():
    import random

    rng = random.Random(7)
    for _ in range(200):
        t, host, own = 0, [], []
        for _ in range(rng.randint(1, 25)):
            t += rng.choice([0, 1, 5, 500, 1000]) * MS
            host.append({"mono_ns": t, "cpu_pct": rng.uniform(0, 100), "cpu_count": 4})
            if rng.random() < 0.7:
                own.append({"mono_ns": t, "cores": rng.uniform(0, 3)})
        spans = intervals(host, own)
        start = -1000 * MS
        windows = []
        for _ in range(rng.randint(1, 15)):
            start += rng.randint(0, 800) * MS
            windows.append((start, start + rng.choice([-3, 0, 1, 7 * MS, 300 * MS, 2000 * MS])))
        cpu = step_cpu(windows, spans, 4)
        for (host_c, own_c), pct, mine in zip(
            _reference(windows, spans), cpu.host_pct, cpu.own_cores, strict=True
        ):
            assert (pct is None) == (host_c is None) and (mine is None) == (own_c is None)
            if host_c is not None:
                assert pct == pytest.approx(min(100.0, 25.0 * host_c), rel=1e-12)
            if own_c is not None:
                assert mine == pytest.approx(own_c, rel=1e-12)


def test_an_instant_late_in_a_day_reads_its_sample_exactly():
    # 172,800 samples at 2 Hz: a 1 ns window at the end is not lost to rounding
    day = [
        {"mono_ns": (i + 1) * 500 * MS, "cpu_pct": 10.0 + i % 7, "cpu_count": 2}
        for i in range(172_800)
    ]
    spans = intervals(day, [{"mono_ns": day[-1]["mono_ns"], "cores": 0.25}])
    at = day[-1]["mono_ns"] - 100 * MS
    cpu = step_cpu([(at, at)], spans, 2)
    assert cpu.host_pct == pytest.approx((day[-1]["cpu_pct"],), rel=1e-12)
    assert cpu.own_cores == (0.25,)


def test_columns_from_tuples_keep_missing_times_and_cores() -> None:
    """Rows read as columns without a list per column: every time and
    reading kept, a missing time is untimed (0), a missing reading NaN."""
    import numpy as np

    from gpuprof.insights.hostcpu import cpu_columns_from_tuples, host_columns_from_tuples

    full = cpu_columns_from_tuples([(5, 1.5), (2**62, 2), (9, True)])
    assert full.mono_ns.tolist() == [5, 2**62, 9] and full.timed.all()
    assert full.cores.tolist() == [1.5, 2.0, 1.0]
    gaps = cpu_columns_from_tuples([(5, 1.5), (None, 3.0), (9, None)])
    assert gaps.mono_ns.tolist() == [5, 0, 9]
    assert gaps.timed.tolist() == [True, False, True]
    assert gaps.cores[:2].tolist() == [1.5, 3.0] and np.isnan(gaps.cores[2])
    host = host_columns_from_tuples([(10**18 + 1, 50.0, 8, None), (None, 1.0, None, 3.5)], {})
    assert host.mono_ns.tolist() == [10**18 + 1, 0]  # not rounded through a float
    assert host.timed.tolist() == [True, False]
    assert host.cpu_pct.tolist() == [50.0, 1.0]
    assert np.isnan(host.cpu_count[1]) and np.isnan(host.disk_read_bps[0])
    assert len(cpu_columns_from_tuples([])) == 0
