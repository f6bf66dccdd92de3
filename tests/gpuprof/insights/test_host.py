"""Host rules: each must fire on its pattern and stay silent just outside it."""

from __future__ import annotations

import pytest

from gpuprof.insights import build_context, run_rules
from gpuprof.insights.base import LoaderConfig, WorkerPool
from gpuprof.insights.host import (
    WORKER_IMBALANCE_RATIO,
    WORKER_MIN_POOL_CPU_S,
    cache_thrashing,
    cold_cache,
    host_cpu_contention,
    host_memory_pressure,
    io_bound_dataloader,
    worker_imbalance,
)

from .conftest import make_ctx

GIB = 2**30

# --- io_bound_dataloader -----------------------------------------------------------


@pytest.mark.parametrize(
    "disk",
    [
        {"host_disk_read_bps": 900e6},  # streaming big files
        {"host_disk_read_bps": 40e6, "host_disk_read_iops": 9_000.0},  # many small reads
    ],
)
def test_io_bound_fires_on_a_stall_with_a_busy_disk_and_idle_cpu(disk):
    ctx = make_ctx([60] * 10, [40] * 10, host_cpu_pct=30.0, **disk)
    ins = io_bound_dataloader(ctx)
    assert ins is not None and ins.severity == "HIGH"  # 40 % > the 30 % HIGH share
    assert ins.evidence["stall_fraction"] == pytest.approx(0.4)
    rules = [i.rule for i in run_rules(ctx)]
    assert "io_bound_dataloader" in rules and "dataloader_stall" not in rules
    assert "cpu_bound_dataloader" not in rules


@pytest.mark.parametrize(
    "kw",
    [
        {"host_cpu_pct": 30.0, "host_disk_read_bps": 400e6, "host_disk_read_iops": 4_000.0},
        {"host_cpu_pct": 95.0, "host_disk_read_bps": 900e6},  # no CPU headroom
        {"host_cpu_pct": None, "host_disk_read_bps": 900e6},  # CPU unsampled: don't guess
        {"host_cpu_pct": 30.0},  # disk unsampled
    ],
)
def test_io_bound_silent_without_a_busy_disk_or_without_cpu_headroom(kw):
    ctx = make_ctx([60] * 10, [40] * 10, **kw)
    assert io_bound_dataloader(ctx) is None
    assert "dataloader_stall" in [i.rule for i in run_rules(ctx)]


def test_io_bound_silent_without_a_stall():
    ctx = make_ctx([90] * 10, [10] * 10, host_cpu_pct=30.0, host_disk_read_bps=900e6)
    assert io_bound_dataloader(ctx) is None


# --- cold_cache --------------------------------------------------------------------


def test_cold_cache_fires_when_reads_fall_off_and_iterations_speed_up():
    ctx = make_ctx(
        [50] * 30,
        [50] * 10 + [20] * 10 + [5] * 10,
        disk_read_bps_thirds=(600e6, 150e6),
        iteration_ms_thirds=(100.0, 55.0),
        loader_ms_thirds=(50.0, 5.0),
    )
    ins = cold_cache(ctx)
    assert ins is not None and ins.severity == "MED"
    assert "600 MB/s" in ins.title and "150 MB/s" in ins.title
    assert "the loader wait fell 50.0 → 5.0 ms per step" in ins.title
    assert ins.evidence["last_third_iteration_ms"] == 55.0
    assert ins.evidence["first_third_loader_share"] == 0.5
    assert (ins.evidence["first_third_loader_ms"], ins.evidence["last_third_loader_ms"]) == (
        50.0,
        5.0,
    )
    assert "50% of each iteration" in ins.detail


_FELL = {"disk_read_bps_thirds": (600e6, 150e6), "iteration_ms_thirds": (100.0, 55.0)}


@pytest.mark.parametrize(
    "kw",
    [
        {**_FELL, "disk_read_bps_thirds": (600e6, 250e6)},  # 2.4x
        {**_FELL, "iteration_ms_thirds": (100.0, 100.0)},  # flat
        {**_FELL, "disk_read_bps_thirds": (30e6, 1e6)},  # tiny reads
        {**_FELL, "disk_read_bps_thirds": None},  # unsampled
        {**_FELL, "loader_ms_thirds": None},  # loader unknown
    ],
)
def test_cold_cache_silent_without_both_the_read_drop_and_the_speed_up(kw):
    assert cold_cache(make_ctx([50] * 30, **{"loader_ms_thirds": (50.0, 5.0), **kw})) is None


@pytest.mark.parametrize(
    "loader",
    [
        (5.0, 4.0),  # 5 % of the iteration: the steps sped up (warm-up, a host quieting)
        (14.0, 2.0),  # just under the stall line
        (40.0, 40.0),  # the loader held the loop back, but no less at the end
        (30.0, 35.0),  # ... or more
        (16.0, 15.9),  # eased a little while the iterations sped up 45 ms: not the cache's
        (40.0, 29.0),  # 11 ms of the 45 ms speed-up: under a quarter of it
    ],
)
def test_cold_cache_silent_when_the_loader_was_not_the_bottleneck_that_eased(loader):
    ctx = make_ctx([50] * 30, **_FELL, loader_ms_thirds=loader)
    assert cold_cache(ctx) is None
    # at the stall line (15 % of the first third's iteration) and falling: it is
    assert cold_cache(make_ctx([50] * 30, **_FELL, loader_ms_thirds=(15.0, 2.0))) is not None
    # a quarter of the speed-up (11.25 of 45 ms) or more is the loader's: it is
    assert cold_cache(make_ctx([50] * 30, **_FELL, loader_ms_thirds=(40.0, 28.0))) is not None


def _rows(waits_ms: list[int], steps_ms: list[int]) -> tuple[list[dict], int]:
    steps, t = [], 0
    for wait_ms, step_ms in zip(waits_ms, steps_ms, strict=True):
        wait, step = wait_ms * 1_000_000, step_ms * 1_000_000
        steps.append({"t0": t + wait, "t1": t + wait + step, "wait": wait, "phases": {}})
        t += wait + step
    return steps, t


def _disk(reads: tuple[float, ...], start_ns: int, every_ns: int) -> list[dict]:
    host = [
        {"mono_ns": start_ns + k * every_ns, "cpu_pct": 20.0, "disk_read_bps": b}
        for k, b in enumerate(reads)
    ]
    host.insert(0, {"mono_ns": 1, "cpu_pct": 90.0, "disk_read_bps": 3e9})  # model load: before
    return host


def test_build_context_feeds_cold_cache_from_rows():
    """Host rows and steps → thirds → the rule, end to end (pure)."""
    # the loader waits on disk at first
    steps, t = _rows([60] * 3 + [5] * 6, [40] * 9)
    host = _disk((800e6, 700e6, 900e6, 0.0, 90e6, 10e6), 60_000_000, 100_000_000)
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": t}
    ctx = build_context(run, steps, host)
    assert ctx.disk_read_bps_thirds == (750e6, 50e6)  # first two, last two samples in steps
    assert ctx.iteration_ms_thirds == (100.0, 45.0)
    assert ctx.loader_ms_thirds == (60.0, 5.0)
    assert "cold_cache" in [i.rule for i in run_rules(ctx)]


def test_build_context_keeps_cold_cache_silent_when_the_steps_sped_up_not_the_loader():
    # the same reads, the same speed-up, but from the steps (warm-up, a host
    # quieting): the loader waited 5 ms throughout
    steps, t = _rows([5] * 9, [95] * 3 + [40] * 6)
    host = _disk((800e6, 700e6, 900e6, 0.0, 90e6, 10e6), 60_000_000, 100_000_000)
    run = {"run_name": "r", "status": "finished", "start_mono_ns": 0, "end_mono_ns": t}
    ctx = build_context(run, steps, host)
    assert ctx.iteration_ms_thirds == (100.0, 45.0)
    assert ctx.loader_ms_thirds == (5.0, 5.0)
    assert (
        ctx.disk_read_bps_thirds is not None
        and ctx.disk_read_bps_thirds[0] >= 3 * (ctx.disk_read_bps_thirds[1])
    )
    assert "cold_cache" not in [i.rule for i in run_rules(ctx)]


# --- cache_thrashing ---------------------------------------------------------------


def test_cache_thrashing_fires_with_a_full_cache_and_sustained_reads():
    ins = cache_thrashing(
        make_ctx([50] * 10, page_cache_fraction=0.55, host_disk_read_bps_median=300e6)
    )
    assert ins is not None and "55% of RAM" in ins.title and "300 MB/s" in ins.title


@pytest.mark.parametrize(
    "kw",
    [
        {"page_cache_fraction": 0.30, "host_disk_read_bps_median": 300e6},  # cache has room
        {"page_cache_fraction": 0.55, "host_disk_read_bps_median": 80e6},  # reads are light
        {"page_cache_fraction": None, "host_disk_read_bps_median": 300e6},  # not reported
    ],
)
def test_cache_thrashing_silent_unless_both(kw):
    assert cache_thrashing(make_ctx([50] * 10, **kw)) is None


def test_build_context_page_cache_share_and_median_read():
    host = [
        {
            "cpu_pct": 10.0,
            "disk_read_bps": 200e6,
            "page_cache_bytes": 24 * GIB,
            "mem_total_bytes": 64 * GIB,
        },
        {
            "cpu_pct": 10.0,
            "disk_read_bps": 150e6,
            "page_cache_bytes": 40 * GIB,
            "mem_total_bytes": 64 * GIB,
        },
        {
            "cpu_pct": 10.0,
            "disk_read_bps": 0.0,
            "page_cache_bytes": None,
            "mem_total_bytes": 64 * GIB,
        },  # platform without the figure: left out, not 0
    ]
    ctx = build_context({"run_name": "r", "status": "running"}, [], host)
    assert ctx.page_cache_fraction == pytest.approx(0.5)  # mean of 0.375 and 0.625
    assert ctx.host_disk_read_bps_median == 150e6
    assert "cache_thrashing" in [i.rule for i in run_rules(ctx)]


# --- host_memory_pressure ----------------------------------------------------------


def test_host_memory_pressure_fires_above_1_mb_per_s_swap_in():
    ins = host_memory_pressure(make_ctx([50] * 10, host_swap_in_bps=4.5e6))
    assert ins is not None and ins.severity == "HIGH"
    assert "4.5 MB/s" in ins.title and ins.evidence["swap_in_bps"] == 4_500_000


@pytest.mark.parametrize("sin", [0.0, 0.9e6, None])
def test_host_memory_pressure_silent_at_or_below_1_mb_per_s(sin):
    assert host_memory_pressure(make_ctx([50] * 10, host_swap_in_bps=sin)) is None


def test_build_context_host_means_skip_missing_readings():
    host = [
        {"cpu_pct": 10.0, "disk_read_iops": 100.0, "swap_in_bps": 2e6},
        {"cpu_pct": 10.0, "disk_read_iops": None, "swap_in_bps": None},
        {"cpu_pct": 10.0, "disk_read_iops": 300.0, "swap_in_bps": 0.0},
    ]
    ctx = build_context({"run_name": "r", "status": "running"}, [], host)
    assert (ctx.host_disk_read_iops, ctx.host_swap_in_bps) == (200.0, 1e6)
    assert ctx.disk_read_bps_thirds is None and ctx.iteration_ms_thirds is None


# --- worker_imbalance --------------------------------------------------------------


def pool(*cpu_s: float, seq: int = 0) -> WorkerPool:
    return WorkerPool(seq, tuple(enumerate(cpu_s)))


def test_worker_imbalance_fires_on_one_hot_worker_and_names_it():
    ctx = make_ctx([50] * 10, worker_pools=(pool(0.2, 4.0, 0.2, 0.2),))
    ins = worker_imbalance(ctx)
    assert ins is not None and ins.severity == "MED"
    assert ins.evidence["worker_id"] == 1
    assert ins.evidence["fair_share_ratio"] == pytest.approx(4.0 / (4.6 / 4), abs=0.01)
    assert (ins.evidence["worker_cpu_s"], ins.evidence["pool_cpu_s"]) == (4.0, 4.6)
    assert "worker 1 did 3.5× its fair share" in ins.title
    assert "4.0 of 4.6 CPU-s across 4 workers" in ins.title
    assert "get_worker_info" in ins.fix and "shuffle=True" in ins.fix
    assert "worker_imbalance" in [i.rule for i in run_rules(ctx)]


def test_worker_imbalance_reports_the_worst_of_several_pools():
    pools = (pool(1.0, 1.0, 1.0), pool(3.0, 0.2, 0.2, seq=1), pool(0.1, 0.1, 5.0, seq=2))
    ins = worker_imbalance(make_ctx([50] * 10, worker_pools=pools))
    assert ins is not None
    assert (ins.evidence["loader_seq"], ins.evidence["worker_id"]) == (2, 2)
    assert (ins.evidence["pools_imbalanced"], ins.evidence["pools_judged"]) == (2, 3)
    assert "2 of 3 worker pools" in ins.detail


def test_worker_imbalance_fires_just_over_the_ratio_and_is_silent_at_it():
    # fair share 1.0 CPU-s: the hottest at exactly 2.5x is not "more than" 2.5x
    at = pool(WORKER_IMBALANCE_RATIO, 0.5, 0.5, 0.5)
    over = pool(2.6, 0.5, 0.5, 0.5)
    assert worker_imbalance(make_ctx([50] * 10, worker_pools=(at,))) is None
    assert worker_imbalance(make_ctx([50] * 10, worker_pools=(over,))) is not None


@pytest.mark.parametrize(
    "pools",
    [
        (),  # no multi-process loader, or not sampled
        (pool(1.1, 0.9, 1.0, 1.2),),  # balanced
        (pool(0.9 * WORKER_MIN_POOL_CPU_S, 0.0, 0.0, 0.0),),  # too little work to judge
        (pool(9.0),),  # one worker: nothing to compare
        (pool(9.0, 0.0),),  # two workers: the hottest is at most 2x the fair share
        (pool(1.0, 1.0, 1.0), pool(0.5, 0.1, 0.1, seq=1)),  # the skewed pool is tiny
    ],
)
def test_worker_imbalance_silent_on_balanced_small_or_unjudgeable_pools(pools):
    ctx = make_ctx([50] * 10, worker_pools=pools)
    assert worker_imbalance(ctx) is None
    assert "worker_imbalance" not in [i.rule for i in run_rules(ctx)]


def test_build_context_groups_worker_rows_into_pools_by_loader_seq():
    rows = [
        {"loader_seq": 1, "worker_id": 1, "pid": 12, "cpu_s": 0.2},
        {"loader_seq": 0, "worker_id": 0, "pid": 10, "cpu_s": 3.0},
        {"loader_seq": 1, "worker_id": 0, "pid": 11, "cpu_s": 0.3},
        {"loader_seq": 0, "worker_id": 1, "pid": 13, "cpu_s": None},  # never read: left out
    ]
    run = {"run_name": "r", "status": "finished"}
    ctx = build_context(run, [], workers=rows)
    assert ctx.worker_pools == (pool(3.0), pool(0.3, 0.2, seq=1))


# --- host_cpu_contention -----------------------------------------------------


def _contended(host_pct: float, run_cores: float | None, cpu_count: int = 16, stall: bool = True):
    return make_ctx(
        [10.0] * 30,
        [8.0 if stall else 0.0] * 30,
        host_cpu_pct=host_pct,
        run_cpu_cores=run_cores,
        cpu_count=cpu_count,
        explicit_wait=True,  # a timed DataLoader
    )


def test_host_cpu_contention_fires_when_others_peg_the_host():
    ctx = _contended(95.0, run_cores=2.0)
    ins = host_cpu_contention(ctx)
    assert ins is not None and ins.severity == "HIGH"  # 13.2 of 16 cores are others'
    assert ins.evidence["other_cores"] == 13.2
    fired = {i.rule: i for i in run_rules(ctx)}
    # the stall stays the headline, with contention as its cause and fix
    # ("raise num_workers" would be wrong advice); it carries the contention finding
    stall = fired["cpu_bound_dataloader"]
    assert stall.title == (
        "44% of step time waiting on the loader; the workers are starved of CPU: "
        "other processes hold 13.2 of 16 cores"
    )
    assert stall.evidence["cause"] == "contention" and "won't help" in stall.fix
    assert "host_cpu_contention" not in fired and "dataloader_stall" not in fired


def test_a_starved_loader_whose_workers_restart_each_epoch_is_told_to_keep_them():
    # 4 epochs of non-persistent workers on a pegged 2-core host: each
    # epoch's start waited on the cores too; keeping the workers needs no core
    def ctx(persistent: bool):
        return make_ctx(
            [10.0] * 30,
            [8.0] * 30,
            host_cpu_pct=99.0,
            run_cpu_cores=0.5,
            cpu_count=2,
            explicit_wait=True,
            loaders=(LoaderConfig(2, persistent, False, 2),),
            worker_pools=tuple(WorkerPool(i, ((0, 1.0), (1, 1.0)), 5.0) for i in range(4)),
        )

    stall = {i.rule: i for i in run_rules(ctx(False))}["cpu_bound_dataloader"]
    assert "starved of CPU" in stall.title
    assert "persistent_workers=True: the workers started anew 4 times" in stall.fix
    kept = {i.rule: i for i in run_rules(ctx(True))}["cpu_bound_dataloader"]
    assert "persistent_workers" not in kept.fix


def test_host_cpu_contention_silent_when_the_run_is_the_hog_or_the_host_is_free():
    assert host_cpu_contention(_contended(95.0, run_cores=14.0)) is None  # cpu_bound's case
    assert host_cpu_contention(_contended(60.0, run_cores=1.0)) is None  # headroom left
    assert host_cpu_contention(_contended(95.0, run_cores=None)) is None  # not measured
    # a run whose loader sleeps (I/O) uses no CPU: its stall is its own
    idle_run = _contended(100.0, run_cores=0.1)
    assert host_cpu_contention(idle_run) is None
    assert "dataloader_stall" in {i.rule for i in run_rules(idle_run)}
    # a 2-core box at 85 %: others' 0.9 of a core is under the 1-core floor
    assert host_cpu_contention(_contended(85.0, run_cores=0.8, cpu_count=2)) is None
    # ... the fresh-user case: 2 cores pegged, the run got half of one
    assert host_cpu_contention(_contended(99.9, run_cores=0.49, cpu_count=2)) is not None
    medium = host_cpu_contention(_contended(85.0, run_cores=6.0))
    assert medium is not None and medium.severity == "MED"  # others 7.6 of 16: HIGH needs 8


def test_host_cpu_contention_names_an_untimed_wait_the_gap_not_a_loader():
    # a loop without a DataLoader: its wait is the inter-step gap, and
    # "waiting on the loader" would send the user looking for one
    timed = host_cpu_contention(_contended(99.9, run_cores=0.7, cpu_count=2))
    assert timed is not None and "44% of step time waiting on the loader" in timed.detail
    gap = make_ctx([10.0] * 30, [8.0] * 30, host_cpu_pct=99.9, run_cpu_cores=0.7, cpu_count=2)
    ins = host_cpu_contention(gap)
    assert ins is not None and "44% of step time spent between steps" in ins.detail
    assert "loader" not in ins.detail.split("contention, not the training code")[1]


# --- a torchrun job's ranks on one host are the job's own CPU ----------------------


def _job(
    host_pct: float,
    run_cores: float,
    job_cores: float,
    ranks: int,
    cpu_count: int,
    stall: bool = True,
):
    return make_ctx(
        [10.0] * 30,
        [8.0 if stall else 0.0] * 30,
        host_cpu_pct=host_pct,
        run_cpu_cores=run_cores,
        job_cpu_cores=job_cores,
        job_ranks=ranks,
        cpu_count=cpu_count,
        explicit_wait=True,
    )


def test_sibling_ranks_are_not_other_processes():
    # 2 ranks on a 2-core box, each using 0.9: alone, a rank sees 1.1 cores of "others"
    alone = _job(99.0, run_cores=0.9, job_cores=0.9, ranks=1, cpu_count=2)
    assert host_cpu_contention(alone) is not None
    job = _job(99.0, run_cores=0.9, job_cores=1.8, ranks=2, cpu_count=2)
    assert host_cpu_contention(job) is None
    fired = {i.rule: i for i in run_rules(job)}
    assert "host_cpu_contention" not in fired
    # the job's loaders peg the host: the CPU-bound finding can fire now
    cpu_bound = fired["cpu_bound_dataloader"]
    assert (cpu_bound.evidence["own_cpu_cores"], cpu_bound.evidence["job_ranks"]) == (1.8, 2)
    assert cpu_bound.evidence["run_cpu_cores"] == 0.9


def test_job_sharing_the_host_with_real_other_load_still_contended():
    # 16 cores at 95 %: the job's 2 ranks use 2.0 of 15.2 busy, others 13.2
    ins = host_cpu_contention(_job(95.0, run_cores=1.0, job_cores=2.0, ranks=2, cpu_count=16))
    assert ins is not None and ins.severity == "HIGH"
    assert "this job's 2 ranks here used 2.0" in ins.title
    assert "outside this job" in ins.detail
    assert (ins.evidence["other_cores"], ins.evidence["job_ranks"]) == (13.2, 2)
    assert ins.evidence["run_cpu_cores"] == 1.0


def test_build_context_reads_the_jobs_cpu():
    run = {"run_name": "r", "status": "finished"}
    ctx = build_context(run, [], run_cpu=[{"cores": 0.9}], job_cpu=[{"cores": 1.8, "ranks": 2}])
    assert (ctx.run_cpu_cores, ctx.job_cpu_cores, ctx.job_ranks) == (0.9, 1.8, 2)
    alone = build_context(run, [], run_cpu=[{"cores": 0.9}])
    assert (alone.job_cpu_cores, alone.job_ranks) == (None, 1)


def test_host_cpu_contention_silent_when_the_loop_waits_on_idle_workers():
    from gpuprof.insights.base import WorkerPool

    idle = (WorkerPool(0, ((0, 0.5), (1, 0.5)), 10.0, 0.1),)  # 0.05 core each, mostly asleep
    kw = {"host_cpu_pct": 94.0, "run_cpu_cores": 0.3, "cpu_count": 2, "explicit_wait": True}
    sleeping = make_ctx([10.0] * 30, [60.0] * 30, worker_pools=idle, **kw)
    assert host_cpu_contention(sleeping) is None
    fired = {i.rule for i in run_rules(sleeping)}
    assert "dataloader_stall" in fired and "cpu_bound_dataloader" not in fired
    # the same host and run CPU without that idle loader: contention is named
    assert host_cpu_contention(make_ctx([10.0] * 30, [60.0] * 30, **kw)) is not None
