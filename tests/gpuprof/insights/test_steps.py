from __future__ import annotations

import dataclasses

import pytest

from gpuprof.insights import run_rules
from gpuprof.insights.frames import StackFrame
from gpuprof.insights.gpu import gpu_stats
from gpuprof.insights.steps import (
    compilation_warmup,
    cpu_bound_dataloader,
    dataloader_stall,
    first_step_outlier,
    high_step_variance,
    host_work_between_steps,
    stall_fraction,
)

from .conftest import make_ctx


def test_stall_fraction_excludes_step_zero_wait():
    # step 0's 1000 ms wait is start-up; the rest wait 25 of every 100 ms
    ctx = make_ctx([75] * 5, [1000, 25, 25, 25, 25])
    assert stall_fraction(ctx) == pytest.approx(0.25)


def test_dataloader_stall_fires_above_15_percent():
    ctx = make_ctx([80] * 10, [20] * 10)  # 20 %
    ins = dataloader_stall(ctx)
    assert ins is not None
    assert ins.severity == "MED"
    # no timed DataLoader: the gap between steps, not advice about num_workers
    assert ins.title.startswith("20% of step time spent between steps (inter-step gap)")
    assert "num_workers" not in ins.fix.split(";")[0] and "wrap_dataloader" in ins.fix
    assert ins.evidence["mean_wait_ms"] == pytest.approx(20.0)


def test_dataloader_stall_high_and_explicit_wording():
    ins = dataloader_stall(make_ctx([50] * 10, [50] * 10, explicit_wait=True))
    assert ins.severity == "HIGH"
    assert "timed next() calls" in ins.title


def test_dataloader_stall_silent_at_10_percent():
    assert dataloader_stall(make_ctx([90] * 10, [10] * 10)) is None


def busy_gpu(util_pct: float):
    """NVML's reading of a GPU that ran a kernel *util_pct* % of the time."""
    return gpu_stats([{"util_gpu": util_pct}] * 50)


def test_a_wait_the_gpu_did_not_feel_is_no_stall():
    # the H200 GPT loop: 4 ms of launches, then loss.item() waits 6 ms for
    # the queued work; NVML read the GPU 99 % busy all along
    ctx = make_ctx([4] * 50, [6] * 50, gpu=busy_gpu(99.0))
    assert stall_fraction(ctx) == pytest.approx(0.01)
    assert dataloader_stall(ctx) is None
    assert "dataloader_stall" not in {i.rule for i in run_rules(ctx)}


def test_a_starved_gpu_keeps_its_stall_and_says_what_it_felt():
    # the host waits 60 % of each step; NVML: the GPU idle 45 % of the time
    ctx = make_ctx([40] * 50, [60] * 50, gpu=busy_gpu(55.0))
    assert stall_fraction(ctx) == pytest.approx(0.45)
    ins = dataloader_stall(ctx)
    assert ins is not None and ins.severity == "HIGH"
    assert ins.title.startswith("45% of step time")
    assert ins.evidence["mean_wait_ms"] == pytest.approx(45.0)
    assert ins.evidence["host_wait_fraction"] == pytest.approx(0.6)
    assert "NVML read the GPU 55% busy" in ins.detail


def gap_frames(call: str, share: float, steps: int = 50) -> tuple[StackFrame, ...]:
    """Stack samples of the gap before each step: *share* of them in *call*
    at train.py:88, the rest in the user's own code at train.py:80."""
    return tuple(
        f
        for i in range(steps)
        for f in (
            StackFrame("main", i, "/w/train.py", 88, "train", call, round(100 * share)),
            StackFrame("main", i, "/w/train.py", 80, "train", "", round(100 * (1 - share))),
        )
    )


def test_a_gap_spent_in_a_device_sync_is_no_stall():
    # no NVML (a GPU this gpuprofd cannot read): the stacks say the gap was
    # loss.item() waiting on the queued work, 90 % of its samples
    ctx = make_ctx([40] * 50, [60] * 50, stack_frames=gap_frames("loss.item", 0.9))
    assert stall_fraction(ctx) == pytest.approx(0.06)
    assert dataloader_stall(ctx) is None


def test_a_gap_in_host_work_is_a_stall_and_a_partial_sync_is_taken_off():
    # torch.save is host work, not a sync: the whole gap stands
    ctx = make_ctx([40] * 50, [60] * 50, stack_frames=gap_frames("torch.save", 0.9))
    assert stall_fraction(ctx) == pytest.approx(0.6)
    assert dataloader_stall(ctx) is not None
    # half the gap in torch.cuda.synchronize(): 30 % stalls, and the finding says why
    ctx = make_ctx([40] * 50, [60] * 50, stack_frames=gap_frames("torch.cuda.synchronize", 0.5))
    ins = dataloader_stall(ctx)
    assert stall_fraction(ctx) == pytest.approx(0.3) and ins is not None
    assert ins.evidence["gap_sync_share"] == 0.5 and ins.evidence["mean_wait_ms"] == 30.0
    assert "50% of its sampled time was in a device sync" in ins.detail


def test_timed_next_calls_are_the_loaders_whatever_the_stacks_say():
    frames = gap_frames("loss.item", 0.9)
    ctx = make_ctx([40] * 50, [60] * 50, explicit_wait=True, stack_frames=frames)
    assert stall_fraction(ctx) == pytest.approx(0.6)


def test_an_unused_or_unsampled_gpu_leaves_the_host_wait():
    for gpu in (None, busy_gpu(0.0)):  # no NVML, or a GPU the run never used
        ctx = make_ctx([40] * 50, [60] * 50, gpu=gpu)
        assert stall_fraction(ctx) == pytest.approx(0.6)
        ins = dataloader_stall(ctx)
        assert ins is not None and "host_wait_fraction" not in ins.evidence


def test_cpu_bound_fires_with_pegged_cpu_and_hides_plain_stall():
    ctx = make_ctx(
        [60] * 10,
        [40] * 10,
        host_cpu_pct=95.0,
        cpu_count=16,
        run_cpu_cores=15.0,
        explicit_wait=True,
    )
    ins = cpu_bound_dataloader(ctx)
    assert ins is not None and ins.severity == "HIGH"
    assert "host CPU 95% across 16 cores" in ins.title
    assert ins.title.startswith("40% of step time waiting on the loader; the workers are CPU-bound")
    rules = [i.rule for i in run_rules(ctx)]
    assert "cpu_bound_dataloader" in rules and "dataloader_stall" not in rules


@pytest.mark.parametrize(
    "kw",
    [
        {"host_cpu_pct": 50.0},  # CPU has headroom
        {"host_cpu_pct": None},  # not sampled: stay silent, don't guess
        {"host_cpu_pct": 95.0, "host_disk_read_bps": 900e6},  # the disk is the busy part
    ],
)
def test_cpu_bound_silent_without_pegged_cpu(kw):
    ctx = make_ctx([60] * 10, [40] * 10, **kw)
    assert cpu_bound_dataloader(ctx) is None
    assert "dataloader_stall" in [i.rule for i in run_rules(ctx)]


def test_cpu_bound_fix_sends_work_to_a_gpu_only_when_the_run_has_one():
    kw = {"host_cpu_pct": 95.0, "cpu_count": 16, "run_cpu_cores": 15.0, "explicit_wait": True}
    on_cpu = cpu_bound_dataloader(make_ctx([60] * 10, [40] * 10, **kw))
    assert on_cpu.fix.startswith("Precompute the augmentations") and "GPU" not in on_cpu.fix
    gpu = cpu_bound_dataloader(
        make_ctx([60] * 10, [40] * 10, gpu_model="NVIDIA H100", gpu_count=1, **kw)
    )
    assert gpu.fix.startswith("Move augmentations to the GPU")


def test_cpu_bound_silent_without_a_timed_dataloader():
    # the same pegged host and stall, but the wait is an untimed gap between the
    # steps (host work in the training process, no DataLoader): no "workers"
    # to call CPU-bound; the gap finding speaks
    kw = {"host_cpu_pct": 95.0, "cpu_count": 16, "run_cpu_cores": 15.0}
    assert cpu_bound_dataloader(make_ctx([60] * 10, [40] * 10, explicit_wait=True, **kw))
    ctx = make_ctx([60] * 10, [40] * 10, **kw)
    assert cpu_bound_dataloader(ctx) is None
    stall = {i.rule: i for i in run_rules(ctx)}["dataloader_stall"]
    assert "between steps (inter-step gap)" in stall.title


def test_cpu_bound_silent_without_stall():
    assert cpu_bound_dataloader(make_ctx([95] * 10, [5] * 10, host_cpu_pct=99.0)) is None


def test_compilation_warmup_fires_between_3x_and_10x():
    ctx = make_ctx([500, 350, 120] + [100] * 10)
    ins = compilation_warmup(ctx)
    assert ins is not None
    assert ins.evidence["steady_median_ms"] == pytest.approx(100.0)
    assert ins.evidence["warmup_steps"] == 2  # steps 0 and 1 are > 3x, step 2 is not
    assert first_step_outlier(ctx) is None


def test_compilation_warmup_silent_on_flat_run():
    assert compilation_warmup(make_ctx([250] + [100] * 12)) is None


def test_warmup_findings_silent_when_the_extra_time_is_negligible():
    # 4x and 40x ratios, but 3 ms and 39 ms of one-off time: true and useless
    assert compilation_warmup(make_ctx([4.0] + [1.0] * 12)) is None
    assert first_step_outlier(make_ctx([40.0] + [1.0] * 12)) is None


def test_first_step_outlier_on_h200_compiled_mlp(h200_steps):
    step_ms = [s * 1e3 for s in h200_steps["compile_warmup"]["step_s"]]
    ctx = make_ctx(step_ms)
    ins = first_step_outlier(ctx)
    assert ins is not None
    assert ins.evidence["first_step_ms"] == pytest.approx(step_ms[0], rel=1e-3)
    assert ins.evidence["first_step_ms"] / ins.evidence["median_rest_ms"] > 1000
    # the outlier supersedes the generic warm-up finding
    rules = [i.rule for i in run_rules(ctx)]
    assert "first_step_outlier" in rules and "compilation_warmup" not in rules


def test_first_step_outlier_silent_on_h200_eager_gpt(h200_steps):
    ctx = make_ctx([s * 1e3 for s in h200_steps["trace_sdpa"]["step_s"]])
    assert first_step_outlier(ctx) is None
    assert compilation_warmup(ctx) is None
    assert high_step_variance(ctx) is None


def test_high_step_variance_fires_on_periodic_spikes():
    steady = [10.0] * 30
    steady[10] = steady[20] = steady[29] = 40.0  # checkpoint every 10 steps
    ins = high_step_variance(make_ctx([10, 10, 10] + steady))
    assert ins is not None
    assert ins.evidence["p50_ms"] == pytest.approx(10.0)
    assert ins.evidence["p99_ms"] == pytest.approx(40.0)


def test_high_step_variance_ignores_warmup_and_short_runs():
    assert high_step_variance(make_ctx([500, 300, 100] + [10.0] * 30)) is None
    assert high_step_variance(make_ctx([10.0] * 10 + [50.0])) is None  # too few steps


def test_one_or_two_slow_steps_are_not_periodic_variance():
    steady = [10.0] * 60
    steady[17] = 84.0  # one GC pause in a 60-step run: p99 is that one step
    assert high_step_variance(make_ctx([10, 10, 10] + steady)) is None
    steady[40] = 30.0
    assert high_step_variance(make_ctx([10, 10, 10] + steady)) is None
    steady[55] = 30.0  # a third: periodic
    assert high_step_variance(make_ctx([10, 10, 10] + steady)).evidence["slow_steps"] == 3


def test_cpu_bound_needs_the_run_itself_to_use_the_cpu():
    # host pegged at 95 % of 2 cores, but the run's processes use 0.3 core: another tenant
    other = make_ctx(
        [60] * 10, [40] * 10, host_cpu_pct=95.0, cpu_count=2, run_cpu_cores=0.3, explicit_wait=True
    )
    assert cpu_bound_dataloader(other) is None
    # ... named beside the stall, which stays: a cause never erases the finding
    fired = {i.rule for i in run_rules(other)}
    assert {"host_cpu_contention", "dataloader_stall"} <= fired
    # the run's main process + workers use 1.9 of the 1.9 busy cores: its own workers
    own = make_ctx(
        [60] * 10, [40] * 10, host_cpu_pct=95.0, cpu_count=2, run_cpu_cores=1.9, explicit_wait=True
    )
    assert cpu_bound_dataloader(own).evidence["run_cpu_cores"] == 1.9
    assert cpu_bound_dataloader(own).evidence["cause"] == "own"


def test_stall_counts_loader_time_between_micro_batches():
    # 4 micro-batches per step: only the first one's loading is before the step
    ctx = make_ctx([100] * 10, [5] * 10, data_ms=[30] * 10)
    assert stall_fraction(ctx) == pytest.approx(35 / 105)
    assert dataloader_stall(ctx).evidence["mean_wait_ms"] == pytest.approx(35.0)
    assert dataloader_stall(make_ctx([100] * 10, [5] * 10)) is None  # without it: 5 %


def test_warmup_wording_matches_its_step_count():
    one = compilation_warmup(make_ctx([500] + [100] * 12))
    assert one.fix == "Exclude step 0 from throughput measurements."
    outlier = first_step_outlier(make_ctx([2000, 900] + [10] * 12))
    assert outlier.fix.startswith("Filter steps 0–1 out of timing")


def test_first_step_outlier_and_warmup_agree_on_excess():
    # 115x a 0.8 ms median: both rules see the same 91 ms of one-off time, below the floor
    ctx = make_ctx([92.0] + [0.8] * 20)
    assert first_step_outlier(ctx) is None and compilation_warmup(ctx) is None
    big = make_ctx([230.0] + [2.0] * 20)  # 115x, 228 ms extra: the outlier, not warm-up
    assert [i.rule for i in run_rules(big) if i.rule != "estimated_cost"] == ["first_step_outlier"]


def test_cpu_bound_stall_leaves_erratic_steps_their_own_finding():
    steady = [10.0] * 30
    steady[10] = steady[20] = steady[29] = 40.0
    ctx = make_ctx(
        [10, 10, 10] + steady,
        [20.0] * 33,
        host_cpu_pct=97.0,
        cpu_count=2,
        run_cpu_cores=1.9,
        explicit_wait=True,
    )
    rules = {i.rule for i in run_rules(ctx)}
    assert {"cpu_bound_dataloader", "high_step_variance"} <= rules
    # a pegged host, the run's own CPU unmeasured: whose CPU it is is unknown
    unknown = make_ctx([60] * 10, [40] * 10, host_cpu_pct=99.0, cpu_count=2)
    assert cpu_bound_dataloader(unknown) is None
    assert "dataloader_stall" in {i.rule for i in run_rules(unknown)}


def test_high_step_variance_needs_the_slow_steps_to_cost_something():
    # the fresh-user case: 0.3 ms steps, a few at 1.6 ms: erratic, but 6.5 ms lost in all
    tiny = make_ctx([0.3] * 40 + [1.6] * 5)
    assert high_step_variance(tiny) is None
    # the same shape at 100x the scale loses 650 ms: a finding
    big = high_step_variance(make_ctx([30.0] * 40 + [160.0] * 5))
    assert big is not None and big.evidence["excess_ms"] == 650.0


# --- high_step_variance: periodic, bursts, or the host's -----------------------


def _slow_at(n: int, slow: list[int], fast_ms: float = 10.0, slow_ms: float = 60.0):
    return [slow_ms if i in slow else fast_ms for i in range(n)]


def test_variance_says_every_n_steps_only_when_the_slow_steps_recur_regularly():
    ctx = make_ctx(_slow_at(100, [20, 40, 60, 80]))
    ins = high_step_variance(ctx)
    assert ins.title.endswith("; slow every 20 steps")
    assert ins.evidence["period_steps"] == 20 and "every 20 steps" in ins.fix


def test_variance_names_irregular_bursts_and_never_says_periodic():
    ctx = make_ctx(_slow_at(60, [22, 29, 30, 31, 32, 38]))
    ins = high_step_variance(ctx)
    assert ins.title.endswith("; slow in bursts at steps 22, 29–32, 38")
    assert ins.evidence["period_steps"] is None
    assert "periodic" not in ins.detail and "every" not in ins.title + ins.fix


def test_variance_ties_bursts_to_other_processes_cpu_when_they_coincide():
    slow = [22, 29, 30, 31, 32, 38]
    others = tuple(0.85 if i in slow else 0.1 for i in range(60))
    host = tuple(100.0 if i in slow else 50.0 for i in range(60))
    ctx = make_ctx(
        _slow_at(60, slow),
        step_other_cores=others,
        step_host_pct=host,
        cpu_count=2,
        step_own_cores=(0.9,) * 60,
    )
    ins = high_step_variance(ctx)
    assert ins.title.endswith("; slow steps at 22, 29–32, 38 coincide with other processes' CPU")
    assert "0.85 cores during them against 0.10 in the rest" in ins.detail
    assert "periodic" not in ins.detail + ins.title
    assert ins.evidence["contended_loss_share"] == 1.0


def test_variance_on_a_host_busy_throughout_names_no_cause_in_the_loop():
    # others just as busy on every step: the slow ones coincide with nothing in
    # particular, and the host's share cannot be told apart from the loop's causes
    slow = [22, 29, 30, 31, 32, 38]
    flat = make_ctx(
        _slow_at(60, slow),
        step_other_cores=(0.85,) * 60,
        step_host_pct=(100.0,) * 60,
        cpu_count=2,
        step_own_cores=(0.9,) * 60,
    )
    ins = high_step_variance(flat)
    assert ins.title.endswith(
        "; slow in bursts at steps 22, 29–32, 38, on a host busy with other processes"
    )
    assert "coincide" not in ins.title
    assert "0.85 cores during them, 0.85 on the other steps" in ins.detail
    assert ins.fix.startswith("Measure on an idle node") and "GC" not in ins.fix
    assert ins.evidence["contended_loss_share"] == 1.0
    # the same steps on a host with cores to spare: the cause is the loop's own
    spare = make_ctx(
        _slow_at(60, slow),
        step_other_cores=(0.85,) * 60,
        step_host_pct=(70.0,) * 60,
        cpu_count=2,
        step_own_cores=(0.5,) * 60,
    )
    plain = high_step_variance(spare)
    assert plain.title.endswith("; slow in bursts at steps 22, 29–32, 38")
    assert "GC pauses" in plain.fix and plain.evidence["contended_loss_share"] == 0.0


def test_variance_weighs_the_tie_to_others_cpu_by_the_time_the_slow_steps_lost():
    # one heavy burst while others held the host, and many short slow steps
    # (a loaded scheduler's jitter) while they did not: most slow steps ran
    # uncontended, but the burst lost most of the time
    n, burst = 200, list(range(60, 70))
    jitter = [7, 19, 27, 35, 44, 88, 97, 105, 118, 126, 134, 141, 151, 157, 163, 171, 177, 183]
    step_ms = [200.0 if i in burst else 25.0 if i in jitter else 10.0 for i in range(n)]
    ctx = make_ctx(
        step_ms,
        step_other_cores=tuple(1.6 if i in burst else 0.2 for i in range(n)),
        step_host_pct=tuple(100.0 if i in burst else 50.0 for i in range(n)),
        cpu_count=2,
        step_own_cores=(0.4,) * n,
    )
    ins = high_step_variance(ctx)
    assert ins.evidence["slow_steps"] == len(burst) + len(jitter)
    assert "coincide with other processes' CPU" in ins.title, ins.title
    assert "60–69" in ins.title and ins.evidence["burst_count"] == len(jitter) + 1
    assert ins.evidence["other_cores_slow"] == round((1900 * 1.6 + 18 * 15 * 0.2) / 2170, 2)
    # the same jitter with the burst on a quiet host: nothing coincides
    quiet = make_ctx(
        step_ms,
        step_other_cores=(0.2,) * n,
        step_host_pct=(50.0,) * n,
        cpu_count=2,
        step_own_cores=(0.4,) * n,
    )
    assert "coincide" not in high_step_variance(quiet).title


# --- warm-up only when one-off -----------------------------------------------------


def test_warmup_silent_when_the_slowness_recurs_later():
    steps = [86.0] + [13.0] * 30 + [420.0, 13.0, 13.0, 390.0] + [13.0] * 10
    ctx = make_ctx(steps)
    assert compilation_warmup(ctx) is None and first_step_outlier(ctx) is None
    # a compiled step 0 that no later step approaches (a 200 ms checkpoint) is warm-up
    compiled = make_ctx([3200.0] + [10.0] * 30 + [200.0] + [10.0] * 10)
    assert first_step_outlier(compiled) is not None


def test_warmup_silent_when_the_slow_first_steps_were_contended():
    steps = [60.0] * 45 + [10.0] * 55
    host = (100.0,) * 45 + (40.0,) * 55
    others = (1.2,) * 45 + (0.1,) * 55
    kw = {"cpu_count": 2, "step_own_cores": (0.8,) * 100}
    busy = make_ctx(steps, step_host_pct=host, step_other_cores=others, **kw)
    assert compilation_warmup(busy) is None
    quiet = make_ctx(steps, step_host_pct=(40.0,) * 100, step_other_cores=(0.1,) * 100, **kw)
    assert compilation_warmup(quiet) is not None  # same steps, nobody else: one-off work


# --- the stall's fix fits what was seen --------------------------------------------


def _pool(cores_each: float, n: int = 2, seq: int = 0, span_s: float = 10.0):
    from gpuprof.insights.base import WorkerPool

    return WorkerPool(seq, tuple((w, cores_each * span_s) for w in range(n)), span_s)


def _loader(workers: int = 2, persistent: bool = True, pin: bool = False, prefetch=2):
    from gpuprof.insights.base import LoaderConfig

    return LoaderConfig(workers, persistent, pin, prefetch if workers else None)


def _waiting_workers(disk_read_bps: float):
    """50 ms steps, 50 ms waits on 2 idle persistent workers, 16 cores."""
    return make_ctx(
        [50] * 20,
        [50] * 20,
        explicit_wait=True,
        cpu_count=16,
        host_disk_read_bps=disk_read_bps,
        worker_pools=(_pool(0.01),),
        loaders=(_loader(persistent=True),),
    )


def test_waiting_workers_on_a_quiet_source_are_told_to_multiply_not_persist():
    # 2 idle workers deliver a batch per 100 ms iteration: each batch takes
    # them ~200 ms; hiding that under a 50 ms step takes 4 workers
    ctx = _waiting_workers(disk_read_bps=20e6)
    ins = dataloader_stall(ctx)
    assert "sat idle" in ins.detail and ins.evidence["loader_busy"] is False
    assert "the disk read 20 MB/s" in ins.detail and "will not make" not in ins.detail
    assert ins.fix.startswith("Keep more batches in flight: raise num_workers from 2 to about 4")
    assert "persistent_workers" not in ins.fix
    assert ins.evidence["loader"]["persistent_workers"] is True
    assert ins.evidence["source_saturated"] is False
    assert cpu_bound_dataloader(ctx) is None


def test_waiting_workers_on_a_saturated_disk_are_not_told_to_multiply():
    # the same loop while the disk reads 900 MB/s (io_bound_dataloader needs the
    # host CPU measured; unmeasured here, so the stall finding speaks)
    ins = dataloader_stall(_waiting_workers(disk_read_bps=900e6))
    assert "the source is saturated" in ins.detail and "900 MB/s" in ins.detail
    assert "num_workers" not in ins.fix and ins.fix.startswith("Read less")
    assert ins.evidence["source_saturated"] is True


def test_an_in_process_loader_is_told_to_use_workers():
    ctx = make_ctx(
        [50] * 20,
        [50] * 20,
        explicit_wait=True,
        cpu_count=8,
        run_cpu_cores=1.0,
        loaders=(_loader(workers=0, persistent=False),),
    )
    ins = dataloader_stall(ctx)  # its loading computes: one worker per spare core
    assert ins.evidence["loader_busy"] is True
    assert "num_workers=7; it is 0 now" in ins.fix
    assert "persistent_workers" not in ins.fix and "prefetch_factor" not in ins.fix
    # loading that waits (0.4 core: none beyond the step's) is not bounded by the
    # cores: a 50 ms wait per batch under a 50 ms step takes 2 workers waiting at once
    idle = dataclasses.replace(ctx, run_cpu_cores=0.4)
    ins = dataloader_stall(idle)
    assert ins.evidence["loader_busy"] is False
    assert "num_workers=2; it is 0 now" in ins.fix


def test_busy_workers_on_an_idle_host_are_told_to_spread_with_the_numbers():
    ctx = make_ctx(
        [50] * 20,
        [50] * 20,
        explicit_wait=True,
        cpu_count=16,
        host_cpu_pct=20.0,
        worker_pools=(_pool(0.95),),
        loaders=(_loader(persistent=False),),
    )
    ins = cpu_bound_dataloader(ctx)
    assert (
        ins.title
        == "50% of step time waiting on the loader; the loading is CPU-bound with 80% of the "
        "host idle"
    )
    assert "raise num_workers from 2 toward 15" in ins.fix
    assert "persistent_workers" not in ins.fix  # one pool: the workers never restarted
    pinned = make_ctx(
        [50] * 20,
        [50] * 20,
        explicit_wait=True,
        cpu_count=16,
        host_cpu_pct=20.0,
        gpu_model="NVIDIA H200",
        worker_pools=(_pool(0.95), _pool(0.95, seq=1)),
        loaders=(_loader(persistent=False, pin=True),),
    )
    fix = cpu_bound_dataloader(pinned).fix
    assert "persistent_workers=True" in fix and "pin_memory" not in fix


# --- high_step_variance: "every N steps" only through the whole steady run -------


def _contended_around(n: int, first: int, last: int, others: float = 1.2) -> dict:
    """Per-step host figures of a 2-core host that other processes held from
    step *first* to *last* (``others`` cores, host pegged) and left alone otherwise."""
    busy = range(first, last + 1)
    return {
        "step_other_cores": tuple(others if i in busy else 0.1 for i in range(n)),
        "step_host_pct": tuple(100.0 if i in busy else 50.0 for i in range(n)),
        "step_own_cores": (0.8,) * n,
        "cpu_count": 2,
    }


def test_slow_steps_n_apart_in_a_busy_host_episode_are_not_periodic():
    # a busy-host episode: five slow steps 5 apart, in the middle of 200 steps
    episode = [100, 105, 110, 115, 120]
    ctx = make_ctx(_slow_at(200, episode), **_contended_around(200, 95, 125))
    ins = high_step_variance(ctx)
    assert ins.title.endswith("; slow steps at 100–120 coincide with other processes' CPU")
    assert ins.evidence["period_steps"] is None and ins.evidence["period_repeats"] is None
    assert ins.evidence["slow_step_numbers"] == episode
    assert "every" not in ins.title + ins.fix and "periodic" not in ins.detail
    # on a quiet host too: slow steps 3 apart in one stretch are a burst
    quiet = high_step_variance(make_ctx(_slow_at(200, [60, 63, 66, 69, 72])))
    assert quiet.title.endswith("; slow in bursts at steps 60–72")
    assert quiet.evidence["period_steps"] is None
    # the same interval through the whole run is periodic
    whole = high_step_variance(make_ctx(_slow_at(200, list(range(5, 200, 5)))))
    assert whole.title.endswith("; slow every 5 steps")
    assert (whole.evidence["period_repeats"], whole.evidence["period_lattice_steps"]) == (39, 39)


def _contended_throughout(n: int) -> dict:
    """Per-step host figures of a 2-core host other processes held all run long."""
    return {
        "step_other_cores": (0.85,) * n,
        "step_host_pct": (100.0,) * n,
        "step_own_cores": (0.9,) * n,
        "cpu_count": 2,
    }


def test_every_n_steps_on_a_contended_host_needs_ten_repeats():
    nine = list(range(20, 200, 20))  # a 200-step run: 20, 40 ... 180
    ctx = make_ctx(_slow_at(200, nine), **_contended_throughout(200))
    ins = high_step_variance(ctx)
    assert ins.evidence["host_contended"] is True
    assert ins.evidence["period_min_repeats"] == 10
    assert ins.evidence["period_steps"] is None and "every" not in ins.title
    assert ins.title.endswith(", on a host busy with other processes")
    # eleven times over 240 steps: periodic, on the busy host too
    eleven_at = list(range(20, 240, 20))
    eleven = high_step_variance(make_ctx(_slow_at(240, eleven_at), **_contended_throughout(240)))
    assert eleven.title.endswith("; slow every 20 steps"), eleven.title
    assert (eleven.evidence["period_repeats"], eleven.evidence["period_lattice_steps"]) == (11, 11)
    assert "(steps 20 to 220, slow 11 of the 11 times)" in eleven.detail
    # nine times on a quiet host: four are enough there
    quiet = high_step_variance(make_ctx(_slow_at(200, nine)))
    assert quiet.title.endswith("; slow every 20 steps")
    assert quiet.evidence["host_contended"] is False
    assert (quiet.evidence["period_repeats"], quiet.evidence["period_min_repeats"]) == (9, 4)


def test_three_slow_steps_n_apart_are_not_every_n_steps():
    steady = [10.0] * 30
    steady[10] = steady[20] = steady[29] = 40.0  # 13, 23, 32: three, could be chance
    ins = high_step_variance(make_ctx([10, 10, 10] + steady))
    assert ins.evidence["period_steps"] is None
    assert ins.title.endswith("; slow in bursts at steps 13, 23, 32")


def test_the_interval_is_counted_in_the_runs_step_numbers():
    # a checkpoint every 25 steps; steps 90-129 were lost on the way (dropped
    # events): the positions of the steps kept are not their numbers
    kept = [n for n in range(300) if not 90 <= n < 130]
    step_ms = [60.0 if n % 25 == 0 and n else 10.0 for n in kept]
    ins = high_step_variance(make_ctx(step_ms, step_numbers=tuple(kept)))
    assert ins.title.endswith("; slow every 25 steps"), ins.title
    assert ins.evidence["slow_step_numbers"] == [25, 50, 75, 150, 175, 200, 225, 250, 275]
    assert (ins.evidence["period_repeats"], ins.evidence["period_lattice_steps"]) == (9, 9)
    # read by position, the same steps would not recur at one interval
    by_position = high_step_variance(make_ctx(step_ms))
    assert by_position.evidence["period_steps"] is None


def _traced_run(n: int, traced: set[int], slow: set[int]) -> dict:
    """make_ctx arguments for an *n*-step run whose steps *traced* gpuprof
    profiled (left out) and whose steps *slow* took 60 ms (10 ms the rest)."""
    kept = [i for i in range(n) if i not in traced]
    return {
        "step_ms": [60.0 if i in slow else 10.0 for i in kept],
        "step_numbers": tuple(kept),
        "traced_step_numbers": tuple(sorted(traced)),
        "traced_steps": len(traced),
    }


def test_slow_steps_right_after_gpuprofs_trace_windows_are_put_on_the_tracing():
    # trace_every_n_steps=50 (and the warm-up snapshots 0, 1, 5): each step
    # after a window is slow
    traced = {0, 1, 5, 50, 100, 150, 200, 250}
    after = {51, 101, 151, 201, 251}
    ins = high_step_variance(make_ctx(**_traced_run(300, traced, after)))
    assert ins.title.endswith("; slow every 50 steps, right after gpuprof's own trace windows")
    assert ins.evidence["period_steps"] == 50
    assert (ins.evidence["after_trace_steps"], ins.evidence["after_trace_loss_share"]) == (5, 1.0)
    assert "periodic work" not in ins.detail and "not your training loop" in ins.detail
    assert "trace_every_n_steps" in ins.fix and "checkpointing" not in ins.fix
    # sampled windows at no fixed interval: the slow steps after them, named
    sampled = {37, 90, 151, 230}
    found = high_step_variance(make_ctx(**_traced_run(300, sampled, {38, 91, 152, 231})))
    assert found.title.endswith(
        "; slow steps at 38, 91, 152, 231 right after gpuprof's own trace windows"
    ), found.title
    assert found.evidence["period_steps"] is None


def test_trace_windows_are_found_when_the_loop_numbers_its_steps_with_a_stride():
    # prof.step(i * 32): the step before 51 * 32 is 50 * 32, not 51 * 32 - 1
    traced = {0, 1, 5, 50, 100, 150, 200, 250}
    after = {51, 101, 151, 201, 251}
    args = _traced_run(300, traced, after)
    args["step_numbers"] = tuple(32 * n for n in args["step_numbers"])
    args["traced_step_numbers"] = tuple(32 * n for n in args["traced_step_numbers"])
    ins = high_step_variance(make_ctx(**args))
    assert ins.title.endswith("; slow every 1600 steps, right after gpuprof's own trace windows"), (
        ins.title
    )
    assert (ins.evidence["after_trace_steps"], ins.evidence["after_trace_loss_share"]) == (5, 1.0)


def test_slow_steps_away_from_the_trace_windows_are_the_loops():
    # the same slow steps every 50, the windows elsewhere: the loop's own work
    traced = {0, 1, 5, 30, 80, 130, 180, 230}
    after = {51, 101, 151, 201, 251}
    ins = high_step_variance(make_ctx(**_traced_run(300, traced, after)))
    assert ins.title.endswith("; slow every 50 steps")
    assert (ins.evidence["after_trace_steps"], ins.evidence["after_trace_loss_share"]) == (0, 0.0)
    assert "periodic work inside the loop" in ins.detail and "gpuprof" not in ins.title
    # slow just before each window is not the tracing's either
    before = {49, 99, 149, 199, 249}
    prior = high_step_variance(
        make_ctx(**_traced_run(300, {0, 1, 5, 50, 100, 150, 200, 250}, before))
    )
    assert prior.title.endswith("; slow every 50 steps")
    assert prior.evidence["after_trace_steps"] == 0


def test_periodic_inter_step_gap_says_every_n_steps():
    # 200 steps of 5 ms, ~1 ms between steps, a 40 ms pause after every 20th step
    gaps = [40.0 if i % 20 == 19 else 1.0 for i in range(200)]
    ins = dataloader_stall(make_ctx([5.0] * 200, gaps))
    assert ins is not None
    assert "every 20 steps" in ins.title and "~40 ms" in ins.detail
    assert ins.evidence["every_steps"] == 20
    assert ins.evidence["periodic_gap_ms"] == pytest.approx(40.0)


def test_steady_inter_step_gap_keeps_its_wording():
    ins = dataloader_stall(make_ctx([5.0] * 200, [3.0] * 200))
    assert ins is not None and "every" not in ins.title and "every_steps" not in ins.evidence


# --- a CPU run's step slowed by its own busy loader workers --------------------------


def _bursty(**kw):
    """60 steps of 10 ms with two irregular bursts of 40 ms (steps 20-25, 41-44)
    on a 2-core CPU host 95% busy, no one else's CPU measured per step."""
    steps = [10.0] * 60
    for i in (*range(20, 26), *range(41, 45)):
        steps[i] = 40.0
    base = dict(cpu_count=2, host_cpu_pct=95.0, run_cpu_cores=1.9)
    base.update(kw)
    return make_ctx(steps, **base)


def test_bursts_beside_busy_loader_workers_name_the_workers_not_gc():
    # the new user's collate_fn: 2 workers at 0.5 core each on 2 cores
    ins = high_step_variance(_bursty(worker_pools=(_pool(0.5),)))
    assert ins.title.endswith("while the DataLoader workers held 1.0 of 2 cores"), ins.title
    assert "gets what the workers leave" in ins.detail and "gc.freeze" not in ins.fix
    assert "fewer workers" in ins.fix


def test_bursts_beside_idle_workers_or_on_a_gpu_keep_the_loops_own_leads():
    idle = high_step_variance(_bursty(worker_pools=(_pool(0.05),)))
    assert "DataLoader workers" not in idle.title and "gc.freeze" in idle.fix
    gpu = high_step_variance(_bursty(worker_pools=(_pool(0.5),), gpu_model="NVIDIA H200"))
    assert "DataLoader workers" not in gpu.title
    quiet = high_step_variance(_bursty(worker_pools=(_pool(0.5),), host_cpu_pct=60.0))
    assert "DataLoader workers" not in quiet.title


def test_a_cpu_bound_loader_says_its_workers_slow_the_step_too():
    ctx = make_ctx(
        [40] * 20,
        [60] * 20,
        explicit_wait=True,
        cpu_count=2,
        host_cpu_pct=95.0,
        run_cpu_cores=1.9,
        worker_pools=(_pool(0.7),),
        loaders=(_loader(),),
    )
    ins = cpu_bound_dataloader(ctx)
    assert "they held 1.4 of the 2 cores its compute runs on" in ins.detail
    assert ins.evidence["worker_cores_competing"] == 1.4
    on_gpu = cpu_bound_dataloader(dataclasses.replace(ctx, gpu_model="NVIDIA H200"))
    assert "held 1.4" not in on_gpu.detail and on_gpu.evidence["worker_cores_competing"] is None


# --- host work between the steps of a timed loader ------------------------------


def _between_ctx(gap_ms, stack_frames=()):
    """200 steps of 10 ms behind a timed DataLoader (1 ms wait each) with
    *gap_ms* of host work before each step."""
    n = len(gap_ms)
    rows = tuple(StackFrame("main", *f) for f in stack_frames)
    return make_ctx(
        [10.0] * n, [1.0] * n, explicit_wait=True, gap_ms=tuple(gap_ms), stack_frames=rows
    )


def test_host_work_between_steps_every_n_steps_is_named_with_its_frame():
    gaps = [0.0] + [250.0 if i % 10 == 0 else 0.2 for i in range(1, 200)]
    sleep = ("/u/train.py", 37, "checkpoint", "time.sleep")
    fetch = ("/u/train.py", 52, "main", "torch.utils.data.dataloader._BaseDataLoaderIter.__next__")
    frames = [(i, *sleep, 20) for i in range(10, 200, 10)] + [
        (i, *fetch, 30) for i in range(10, 200, 10)
    ]
    ins = host_work_between_steps(_between_ctx(gaps, frames))
    # 19 pauses of 250 ms over 197 steady iterations of 11 ms + their gaps
    total = 197 * 11.0 + sum(gaps[3:])
    assert ins.evidence["gap_fraction"] == pytest.approx(sum(gaps[3:]) / total, abs=1e-4)
    assert ins.severity == "HIGH" and ins.evidence["every_steps"] == 10
    assert ins.title.endswith(", every 10 steps: time.sleep from train.py:37")
    # the loader's own next() is its wait, not the host work: not named
    assert [f["line"] for f in ins.evidence["frames"]] == [37]
    assert ins.fix.startswith("Make time.sleep from train.py:37 cheaper")


def test_host_work_between_steps_is_silent_when_small_or_when_the_wait_is_the_gap():
    # 1.5 ms between 11 ms iterations: 12 %, under STALL_FRACTION
    assert host_work_between_steps(_between_ctx([1.5] * 200)) is None
    # no timed loader: the gap is the wait (dataloader_stall's inter-step gap)
    assert host_work_between_steps(make_ctx([10.0] * 200, [20.0] * 200)) is None
    # steady work each step, no frames: MED, the fix points at the loop's own code
    ins = host_work_between_steps(_between_ctx([3.0] * 200))
    assert ins.severity == "MED" and "every" not in ins.title
    assert ins.fix.startswith("Find the work your loop does after optimizer.step()")


def test_host_work_between_steps_gain_is_the_gap_and_compute_keeps_the_rest():
    ctx = _between_ctx([0.0] + [20.0] * 199)
    (ins,) = [i for i in run_rules(ctx) if i.rule == "host_work_between_steps"]
    d = ins.to_dict()
    # the steady iteration: 1 ms wait + 20 ms host work + 10 ms step
    assert d["gain_iteration_ms"] == pytest.approx(31.0)
    assert d["gain_parts_ms"] == {"host_gap": pytest.approx(20.0)}
    assert d["gain_speedup_max"] == pytest.approx(31.0 / 11.0, abs=0.01)
