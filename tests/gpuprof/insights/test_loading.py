"""gpuprof.insights.loading: what a stalled loader's workers did with the CPU."""

from __future__ import annotations

from gpuprof.insights import run_rules
from gpuprof.insights.base import LoaderConfig, WorkerPool
from gpuprof.insights.frames import StackFrame
from gpuprof.insights.loading import loader_cpu
from gpuprof.insights.steps import dataloader_stall

from .conftest import make_ctx


def pool(seq: int, workers: int = 2, cores_each: float = 0.05, invol: float | None = 0.9):
    """A pool of *workers* using *cores_each* over 10 s, *invol* of their
    context switches preemptions (a busy host's: they wanted the CPU)."""
    return WorkerPool(
        seq, tuple((seq * 100 + w, cores_each * 10.0) for w in range(workers)), 10.0, invol
    )


def worker_frames(call: str, samples: int = 200) -> tuple[StackFrame, ...]:
    """The workers' stack samples, all at dataset.py:14 inside *call*."""
    return (StackFrame("loader", 3, "/w/dataset.py", 14, "collate", call, samples),)


def stalled(**kw):
    base = dict(
        explicit_wait=True,
        host_cpu_pct=86.0,
        cpu_count=2,
        run_cpu_cores=0.5,
        loaders=(LoaderConfig(2, False, False, 2),),
    )
    base.update(kw)
    return make_ctx([20.0] * 30, [12.0] * 30, **base)


def test_workers_sampled_asleep_sat_idle_whatever_their_preemptions_say():
    # the new user's loop: collate_fn sleeps 30 ms; a busy core beside it made
    # the workers' switches look preempted
    ctx = stalled(worker_pools=(pool(0),), stack_frames=worker_frames("time.sleep"))
    cpu = loader_cpu(ctx, 0.4)
    assert (cpu.busy, cpu.workers) == (False, 2)
    found = {i.rule: i for i in run_rules(ctx)}
    assert "cpu_bound_dataloader" not in found
    ins = dataloader_stall(ctx)
    assert ins is not None and "sat idle" in ins.detail and "time.sleep" in ins.detail


def test_workers_sampled_computing_keep_the_preemption_verdict():
    ctx = stalled(worker_pools=(pool(0),), stack_frames=worker_frames("PIL.Image.Image.resize"))
    assert loader_cpu(ctx, 0.4).busy is True
    ctx = stalled(worker_pools=(pool(0),))  # no stacks: the switches decide, as before
    assert loader_cpu(ctx, 0.4).busy is True


def test_a_loader_restarted_each_epoch_has_its_workers_not_their_sum():
    # num_workers=8, not persistent, 3 epochs: 3 pools of 8 processes
    pools = tuple(pool(seq, workers=8, invol=0.1) for seq in range(3))
    ctx = stalled(worker_pools=pools, stack_frames=worker_frames("time.sleep"))
    cpu = loader_cpu(ctx, 0.4)
    assert (cpu.busy, cpu.workers) == (False, 8)
    assert "Its 8 worker(s) sat idle" in dataloader_stall(ctx).detail


# --- a wait cheaper than a worker's hand-off ------------------------------------------


def tiny(wait_ms: float, step_ms: float, workers: int = 0, **kw):
    """The new user's TensorDataset loop: *wait_ms* per batch beside a
    *step_ms* step, 64 steps, its loader's *workers*."""
    cfg = LoaderConfig(workers, False, False, 2 if workers else None)
    return make_ctx(
        [step_ms] * 64, [wait_ms] * 64, explicit_wait=True, cpu_count=2, loaders=(cfg,), **kw
    )


def test_a_wait_cheaper_than_a_workers_hand_off_is_not_sent_to_workers_nor_high():
    # 0.07 ms of indexing per batch beside a 0.13 ms step: 35% of the iteration
    ins = dataloader_stall(tiny(0.07, 0.13))
    assert ins is not None and ins.severity == "MED"
    assert "num_workers=2" not in ins.fix and ins.fix.startswith("Keep num_workers=0")
    assert "cheaper than a batch through a worker process" in ins.detail
    assert ins.evidence["wait_per_batch_ms"] == 0.07
    # the loading's CPU measured busy: still no CPU-bound finding sending it to workers
    ctx = tiny(0.07, 0.13, run_cpu_cores=1.0)
    assert {i.rule for i in run_rules(ctx)} >= {"dataloader_stall"}
    assert "cpu_bound_dataloader" not in {i.rule for i in run_rules(ctx)}


def test_a_wait_dearer_than_a_workers_hand_off_is_sent_to_workers_and_high():
    # the same shares at 7 ms per batch: workers pay
    ins = dataloader_stall(tiny(7.0, 13.0))
    assert ins is not None and ins.severity == "HIGH"
    assert "load in worker processes (num_workers=2; it is 0 now)" in ins.fix


def test_idle_workers_waiting_about_a_hand_off_are_sent_back_in_process():
    # the user's fix followed: 2 workers, 1.0 ms per batch, the workers ~idle
    ctx = tiny(1.0, 0.4, workers=2, worker_pools=(pool(0, cores_each=0.05, invol=0.1),))
    ins = dataloader_stall(ctx)
    assert "sat idle meanwhile (0.05 core each), and the wait per batch (1.00 ms)" in ins.detail
    assert "hand-off from the workers" in ins.detail
    assert ins.fix.startswith("Load in the training process (num_workers=0)")
    # the workers unmeasured (a 0.2-s run): the wait alone says it
    ins = dataloader_stall(tiny(1.0, 0.4, workers=2))
    assert "meanwhile. The wait per batch (1.00 ms) is about what" in ins.detail
    assert ins.fix.startswith("Load in the training process (num_workers=0)")
    # 20 ms per batch from the same idle workers is a wait worth more workers
    ctx = tiny(20.0, 8.0, workers=2, worker_pools=(pool(0, cores_each=0.05, invol=0.1),))
    ins = dataloader_stall(ctx)  # each batch takes them ~2 x 28 ms: 7 hide it under 8 ms
    assert "hand-off" not in ins.detail and "raise num_workers from 2 to about 7" in ins.fix


# --- in-process loading that sleeps is not CPU-bound -----------------------------------


def main_frames(call: str, samples: int = 850) -> tuple[StackFrame, ...]:
    """The training thread's samples between steps, in __getitem__ inside *call*."""
    return (StackFrame("main", 3, "/w/train.py", 21, "__getitem__", call, samples),)


def sleepy0(run_cpu_cores: float, **kw):
    """The new user's run 3: num_workers=0, time.sleep per sample, 135 of 152 ms waiting."""
    return tiny(135.0, 17.0, host_cpu_pct=14.2, run_cpu_cores=run_cpu_cores, **kw)


def test_in_process_loading_sampled_asleep_waits_whatever_its_cores_say():
    # run 3: 0.22 core used, 0.11 beyond the compute's share, called CPU-bound
    ctx = sleepy0(0.22, stack_frames=main_frames("time.sleep"))
    assert loader_cpu(ctx, 0.89).busy is False
    assert "cpu_bound_dataloader" not in {i.rule for i in run_rules(ctx)}
    ins = dataloader_stall(ctx)
    assert "burned no CPU" in ins.detail and "time.sleep, called from train.py:21" in ins.detail
    # waiting workers are not bounded by the 2 cores: 135 ms per batch under a 17 ms step
    assert "load in worker processes (num_workers=8; it is 0 now)" in ins.fix
    # even a CPU-heavy step beside it (0.6 core) does not make the sleep compute
    assert loader_cpu(sleepy0(0.6, stack_frames=main_frames("time.sleep")), 0.89).busy is False
    # unsampled: judged by its cores against half a core through the wait
    assert loader_cpu(sleepy0(0.22), 0.89).busy is False


def test_in_process_loading_that_computes_stays_cpu_bound():
    # the same wait spent in a pure-Python collate: one core through the wait
    computing = main_frames("")
    ctx = sleepy0(0.98, stack_frames=computing)
    assert loader_cpu(ctx, 0.89).busy is True
    assert loader_cpu(sleepy0(0.98), 0.89).busy is True
    assert "cpu_bound_dataloader" in {i.rule for i in run_rules(ctx)}
