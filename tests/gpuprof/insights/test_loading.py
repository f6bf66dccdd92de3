"""gpuprof.insights.loading: what a stalled loader's workers did with the CPU."""

from __future__ import annotations

from gpuprof.insights import run_rules
from gpuprof.insights.base import LoaderConfig, WorkerPool
from gpuprof.insights.frames import StackFrame
from gpuprof.insights.loading import batch_making, loader_cpu
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


# --- the hand-off advice needs a batch measured cheap to make ---------------------------


def switching(workers: int, cores_each: float, per_batch: float, iteration_ms: float):
    """A pool of *workers* over 10 s at *cores_each*, switching voluntarily
    *per_batch* times per batch at one batch per *iteration_ms*."""
    vol = round(per_batch / (iteration_ms / 1000.0) * 10.0)
    cpu = tuple((w, cores_each * 10.0) for w in range(workers))
    return WorkerPool(0, cpu, 10.0, 0.05, vol)


def test_workers_waiting_on_latency_are_not_sent_back_in_process():
    # the new user's 5 workers, each __getitem__ sleeping 0.5 ms (32 a batch):
    # 1.35 ms wait beside a 4.2 ms step, ~30 voluntary switches a batch
    ctx = tiny(1.35, 4.2, workers=5, worker_pools=(switching(5, 0.07, 30.0, 5.55),))
    ins = dataloader_stall(ctx)
    assert "hand-off" not in ins.detail and "num_workers=0" not in ins.fix
    assert "raise num_workers from 5 to about" in ins.fix
    assert ins.evidence["making_switches_per_batch"] == 30.0


def test_workers_whose_batch_costs_more_cpu_than_a_hand_off_are_not_sent_back():
    # 0.3 core each x 5 x 5.55 ms: 8.3 ms of CPU a batch, no waits
    ctx = tiny(1.35, 4.2, workers=5, worker_pools=(switching(5, 0.3, 1.0, 5.55),))
    assert "num_workers=0" not in dataloader_stall(ctx).fix


def test_workers_measured_cheap_are_sent_back_in_process():
    # a TensorDataset a batch at a time: 1 switch, 0.07 core x 2 x 1.4 ms a batch
    ctx = tiny(1.0, 0.4, workers=2, worker_pools=(switching(2, 0.07, 1.0, 1.4),))
    ins = dataloader_stall(ctx)
    assert ins.fix.startswith("Load in the training process (num_workers=0)")
    assert ins.evidence["making_cpu_ms_per_batch"] == 0.196


def test_unmeasured_workers_are_not_sent_back_in_process():
    # a 0.2-s run: the wait alone does not say what a batch costs to make
    ins = dataloader_stall(tiny(1.0, 0.4, workers=2))
    assert ins.fix == "Time one run with num_workers=0 against this one."
    assert "the workers were not measured" in ins.detail


def test_tiny_batches_on_a_busy_host_get_the_hand_off_not_the_idle_node():
    # batches of 2 through 2 workers, others holding 1.0 of 2 cores: 1.7 ms
    # a batch, the workers preempted (busy) yet ~1 switch and 0.9 ms CPU a batch
    ctx = tiny(
        1.7,
        1.4,
        workers=2,
        host_cpu_pct=99.7,
        run_cpu_cores=0.95,
        worker_pools=(WorkerPool(0, ((0, 1.43), (1, 1.43)), 10.0, 0.7, 3226),),
    )
    found = {i.rule: i for i in run_rules(ctx)}
    assert "cpu_bound_dataloader" not in found
    assert found["dataloader_stall"].fix.startswith("Load in the training process")
    assert "(1.70 ms) is more than the workers' CPU to make one" in found["dataloader_stall"].detail
    assert "with 0.89 ms of CPU and no waits" in found["dataloader_stall"].detail
    # a CPU-bound collate on the same busy host: still starved, and the frame named
    hot = (StackFrame("loader", 3, "/w/train.py", 21, "cpu_collate", "math.sin", 200),)
    ctx = tiny(
        60.0,
        20.0,
        workers=2,
        host_cpu_pct=99.7,
        run_cpu_cores=0.9,
        stack_frames=hot,
        worker_pools=(WorkerPool(0, ((0, 3.0), (1, 3.0)), 10.0, 0.8, 500),),
    )
    found = {i.rule: i for i in run_rules(ctx)}
    stall = found["cpu_bound_dataloader"]
    assert "starved of CPU" in stall.title
    assert stall.fix.startswith("Make math.sin from train.py:21 cheaper. Run on an idle node")


def test_build_context_sums_the_workers_voluntary_switches_per_pool():
    from gpuprof.insights.context import build_context

    rows = [
        {"loader_seq": 0, "worker_id": w, "pid": 10 + w, "cpu_s": 0.03, "ctx_voluntary": v}
        | {"ctx_involuntary": 5, "first_mono_ns": 0, "last_mono_ns": 435_000_000}
        for w, v in enumerate((492, 476))
    ]
    ctx = build_context({"run_name": "r", "status": "finished"}, [], workers=rows)
    assert ctx.worker_pools[0].voluntary == 968
    rows = [{k: v for k, v in r.items() if k != "ctx_voluntary"} for r in rows]
    ctx = build_context({"run_name": "r", "status": "finished"}, [], workers=rows)
    assert ctx.worker_pools[0].voluntary is None


def test_the_making_cost_is_per_batch_with_micro_batches():
    # 4 micro-batches a step: the workers make 4 batches per 5.55-ms iteration,
    # 0.3 core x 5 of them: 2.1 ms of CPU a batch, not 8.3
    pools = (switching(5, 0.3, 1.0, 5.55 / 4),)
    ctx = tiny(1.35, 4.2, workers=5, worker_pools=pools, micro_batches=(4,) * 64)
    making = batch_making(ctx)
    assert round(making.cpu_ms or 0.0, 2) == 2.08 and round(making.switches or 0.0, 1) == 1.0
