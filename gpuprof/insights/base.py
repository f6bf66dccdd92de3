"""The insight record, the run context rules read, and the rule registry.

A rule is a pure function ``(RunContext) -> Insight | None``. It reads
aggregates, never raw rows, and says nothing when its inputs are missing
(a CPU-only run has no MFU; a run with no host samples has no CPU figure).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, NamedTuple, TypeVar

from gpuprof.insights.aggregates import GpuStats, KernelStats
from gpuprof.insights.frames import StackFrame
from gpuprof.stats import median

SEVERITIES = ("HIGH", "MED", "LOW")

#: The keys a finding's gain adds to :meth:`Insight.to_dict`
#: (:mod:`gpuprof.insights.gains` computes them); all None on a finding that
#: costs no time.
GAIN_KEYS = (
    "gain_ms_per_iteration",
    "gain_pct",
    "gain_speedup_max",
    "gain_run_s",
    "gain_usd",
    "gain_method",
    "gain_iteration_ms",
    "gain_parts_ms",
    "gain_label",
)

#: Steps treated as warm-up (torch.compile, cuDNN/cuBLAS autotune, allocator
#: growth): the H200 fixture's compiled MLP spent 3.2 s in step 0 and was
#: steady from step 1; eager runs settle within 2-3 steps.
WARMUP_STEPS = 3

T = TypeVar("T")


def steady(values: Sequence[T]) -> Sequence[T]:
    """*values* (one per step, in step order) without the first
    :data:`WARMUP_STEPS`, kept whole when the run is too short to spare
    them (:data:`WARMUP_STEPS` × 2 steps or fewer): the steps runs are
    compared by."""
    return values[WARMUP_STEPS:] if len(values) > 2 * WARMUP_STEPS else values


#: Mean micro-batches per step this close (relative) are one shape: a
#: last, shorter accumulation window moves the mean by a step's worth.
MICRO_REL_TOL = 0.01


def same_shape(world_a: int, micro_a: float, world_b: int, micro_b: float) -> bool:
    """Whether two runs do one shape of iteration: the same world size and
    mean micro-batches per step (within :data:`MICRO_REL_TOL`)."""
    return world_a == world_b and math.isclose(micro_a, micro_b, rel_tol=MICRO_REL_TOL)


def mean_micro(micro: Sequence[int]) -> float:
    """Mean micro-batches per step of *micro* (one per step, in step order)
    over its :func:`steady` steps; 1 when none were counted."""
    got = steady(micro)
    return sum(got) / len(got) if got else 1.0


@dataclass(frozen=True)
class Insight:
    """One finding: ``title`` is the one sentence with the number that matters,
    ``fix`` the concrete thing to do, ``evidence`` the figures behind it."""

    rule: str
    severity: str
    title: str
    detail: str
    fix: str
    evidence: Mapping[str, Any] = field(default_factory=dict)
    gain: Mapping[str, Any] | None = None
    """What fixing it is worth, :data:`GAIN_KEYS` (:mod:`gpuprof.insights.gains`);
    None: it costs no time (or gains were not computed)."""

    def to_dict(self) -> dict[str, Any]:
        """The finding as a plain dict: its fields, with the gain's
        :data:`GAIN_KEYS` at the top level (None where it has no gain)."""
        d = asdict(self)
        d["evidence"] = dict(self.evidence)
        gain = d.pop("gain") or {}
        d.update({k: gain.get(k) for k in GAIN_KEYS})
        return d


class WorkerPool(NamedTuple):
    """One DataLoader iterator's worker processes (a new pool each epoch
    unless ``persistent_workers``) and the CPU each used."""

    loader_seq: int
    """The training process's number for the pool, 0, 1, 2... in start order."""
    cpu_s: tuple[tuple[int, float], ...]
    """(worker id, user + system CPU seconds) per worker, by worker id."""
    span_s: float | None = None
    """Seconds from the pool's start to its workers' last CPU reading (None: unknown)."""
    involuntary_share: float | None = None
    """Share (0-1) of the workers' context switches that were preemptions
    (they wanted the CPU) rather than sleeps or waits; None when unknown."""
    voluntary: int | None = None
    """The workers' voluntary context switches (each a sleep, a wait or a
    blocking read), all workers together; None when unknown."""

    @property
    def cores_per_worker(self) -> float | None:
        """Mean cores each worker used over :attr:`span_s`; None when unknown."""
        if not self.cpu_s or not self.span_s or self.span_s <= 0:
            return None
        return sum(c for _, c in self.cpu_s) / len(self.cpu_s) / self.span_s


def positive_count(x: Any) -> int | None:
    """*x* when a positive int (a declared count), else None."""
    return x if type(x) is int and x > 0 else None


class DeclaredWork(NamedTuple):
    """What a run declared one iteration does (``gpuprof.profile``'s
    ``tokens_per_step`` / ``samples_per_step``, per rank; None: not declared)
    and its world size. :class:`RunContext` has the same three fields."""

    tokens_per_step: int | None
    samples_per_step: int | None
    world_size: int


def common_unit(
    a: DeclaredWork | RunContext, b: DeclaredWork | RunContext
) -> tuple[str, int, int] | None:
    """(``token`` or ``sample``, A's, B's work of an iteration in it: the
    declared count times the world size) for the first unit both runs
    declare; None when they declare none in common."""
    for unit in ("token", "sample"):
        da, db = (x.tokens_per_step if unit == "token" else x.samples_per_step for x in (a, b))
        if da and db:
            return unit, da * max(a.world_size, 1), db * max(b.world_size, 1)
    return None


class LoaderConfig(NamedTuple):
    """One DataLoader's settings as the shim read them from its iterator."""

    num_workers: int
    persistent_workers: bool
    pin_memory: bool
    prefetch_factor: int | None
    """Batches each worker loads ahead; None with ``num_workers=0``."""


class CommTotals(NamedTuple):
    """A run's timed DDP gradient buckets (``comm_steps``), summed."""

    steps: int
    """Steps with at least one bucket timed."""
    buckets: int
    """Bucket collectives timed (rows) over those steps."""
    bytes: int
    """Their gradient bytes, summed."""


@dataclass(frozen=True)
class RunContext:
    """What the rules know about one run (one rank's process).

    Per-step tuples are in step order and of equal length. Times in ms.
    The per-step figures derived from them (:attr:`iteration_ms`, ...) are
    computed once per context: a day's rules read them many times.
    """

    run_name: str
    status: str
    step_ms: tuple[float, ...]
    """Step duration: first forward (or ``prof.step`` entry) to optimizer step end."""
    wait_ms: tuple[float, ...]
    """Loader wait before each step: timed DataLoader (or wrapped loader) ``next()``
    calls, or the inter-step gap for a loop over something else."""
    explicit_wait: bool = False
    gap_ms: tuple[float, ...] = ()
    """Per step of a run whose wait was timed (:attr:`explicit_wait`): the
    host time between the previous step and this one outside the loader wait
    and evaluation (a checkpoint, logging), ms; part of the iteration. Empty
    when the wait was not timed (``wait_ms`` is then that whole gap)."""
    data_ms: tuple[float, ...] = ()
    """Loader time inside each step (between micro-batches; the ``data``
    phase); empty when no step had any."""
    micro_batches: tuple[int, ...] = ()
    """Micro-batches (forward/backward passes before the update) of each step."""
    phase_ms: Mapping[str, float] = field(default_factory=dict)
    """Total time per phase over the run (forward, backward, optimizer, ...)."""
    duration_s: float = 0.0
    """Run wall time, start to end (or last event), in seconds."""
    host_cpu_pct: float | None = None
    """Mean host CPU use while the run was in its steps (its first loader wait
    to its last step's end; over the whole run when no step is known), % of
    all cores (0-100); None if unsampled."""
    host_disk_read_bps: float | None = None
    """Mean host disk read rate over the run, bytes/s; None if unsampled."""
    host_disk_read_bps_median: float | None = None
    """Median host disk read rate over the run's samples, bytes/s: above a
    rate, reads exceeded it for at least half the run."""
    host_disk_read_iops: float | None = None
    """Mean host disk read operations per second (IOPS); None if unsampled."""
    page_cache_fraction: float | None = None
    """Mean page-cache size as a share (0-1) of total RAM; None where the
    platform does not report the page cache."""
    host_swap_in_bps: float | None = None
    """Mean bytes swapped in from disk per second; None if unsampled."""
    disk_read_bps_thirds: tuple[float, float] | None = None
    """Mean host disk read rate (bytes/s) over the first and the last third of
    the host samples taken during the run's steps (time order); None with
    fewer than 3 samples."""
    iteration_ms_thirds: tuple[float, float] | None = None
    """Median iteration time (loader wait + step, ms) of the first and the last
    third of the steps; None with fewer than 3 steps. Iterations, not step
    compute: a cold cache slows the loader wait, not the step."""
    loader_ms_thirds: tuple[float, float] | None = None
    """Median loader time (:attr:`loader_ms`: the wait before the step plus its
    ``data`` phase, ms) of the first and the last third of the steps, as
    :attr:`iteration_ms_thirds`; None with fewer than 3 steps."""
    cpu_count: int | None = None
    run_cpu_cores: float | None = None
    """Mean CPU the run's own process tree (training process + DataLoader
    workers) used while in its steps (as :attr:`host_cpu_pct`), in cores
    (1.0 = one core busy); None if unsampled."""
    step_host_pct: tuple[float | None, ...] = ()
    """Per step (as ``step_ms``): host CPU use while its iteration (loader
    wait + step) ran, % of all cores (:mod:`gpuprof.insights.hostcpu`);
    None where no host sample covers it; empty when unsampled."""
    step_own_cores: tuple[float | None, ...] = ()
    """Per step: the run's own process tree's cores while it ran."""
    step_other_cores: tuple[float | None, ...] = ()
    """Per step: cores other processes used while it ran (host busy − the
    run's tree − the job's other ranks here)."""
    loaders: tuple[LoaderConfig, ...] = ()
    """The run's DataLoaders' settings (reported by the shim), in first-use
    order; empty when none was reported."""
    job_cpu_cores: float | None = None
    """Mean CPU of the run's job on this node, in cores: the process trees of
    its group's runs here (``runs.group_id``: the job's other ranks) summed
    at each of this run's sample times; None outside a group or unsampled."""
    job_ranks: int = 1
    """The most of the job's runs sampled together on this node (1: this run alone)."""
    worker_pools: tuple[WorkerPool, ...] = ()
    """The run's DataLoader worker pools in start order, with each worker's
    CPU seconds; empty without multi-process loaders (or unsampled)."""
    gpu_model: str | None = None
    """NVML name of the run's GPU; None on a CPU-only run."""
    gpu_count: int = 0
    flops_per_step: float | None = None
    """Model FLOP per optimizer step on one GPU (declared, from the arch, or
    counted by the shim); None: unknown."""
    flops_source: str | None = None
    """Where ``flops_per_step`` came from: ``"user"``, ``"arch"`` or ``"counter"``."""
    flops_counted: float | None = None
    """FLOP of one step counted by FlopCounterMode in the shim, if it ran."""
    arch: Mapping[str, Any] | None = None
    """The declared model (:meth:`gpuprof.flops.TransformerArch.to_dict`,
    validated by the protocol), e.g. ``arch["checkpointing"]``; None if none."""
    dtype: str | None = None
    history_median_step_ms: tuple[float, ...] = ()
    """Median step time of the previous runs of this name, newest first (≤ 3)."""
    gpu_rate_usd_per_hour: float | None = None
    """``GPUPROF_GPU_RATE`` override; None uses the price table."""
    skipped_updates: int = 0
    """Steps whose optimizer update was skipped (GradScaler found inf/NaN)."""
    optimizers: tuple[tuple[str, int, int, float, int], ...] = ()
    """Per optimizer over the run, in order of first step: (name, updates,
    skipped updates, time inside ``step()`` in ms, steps it stepped in)."""
    eval_ms: float = 0.0
    """Evaluation (no-grad forwards between steps and after the last) over the
    run, ms; not part of any step or loader wait."""
    gpu: GpuStats | None = None
    """NVML samples of the run's GPU taken during its steps, aggregated
    (:func:`gpuprof.insights.gpu.gpu_stats`); None when not sampled."""
    torch_peak_allocated_bytes: int | None = None
    """Peak memory torch's caching allocator handed to tensors on the run's
    CUDA device, bytes: the highest ``torch.cuda.max_memory_allocated`` the
    steps reported (a process-wide peak, since start or the user's last
    ``reset_peak_memory_stats``). None when no step reported torch memory."""
    torch_peak_reserved_bytes: int | None = None
    """Highest ``torch.cuda.memory_reserved`` the steps reported, bytes: what
    the allocator held from CUDA (tensors plus its cache). Read at step ends
    (one step per burst of events), so a spike inside a step can be missed.
    NVML's used memory exceeds it by the CUDA context, the driver's reserve
    and other processes: NVML used > reserved > allocated is normal."""
    kernels: KernelStats | None = None
    """The run's kernel windows (torch.profiler snapshots / continuous aggregates,
    nsys import), aggregated (:func:`gpuprof.insights.kernels.kernel_stats`);
    None when it has none."""
    checkpointing_declared: bool | None = None
    """Whether the declared architecture (run option ``arch``, a
    ``gpuprof.TransformerArch``) uses activation checkpointing; None when not declared."""
    traced_steps: int = 0
    """Steps a profiler snapshot ran in, left out of ``step_ms`` and the other
    per-step figures (so ``steps + traced_steps`` is the run's step count)."""
    step_numbers: tuple[int, ...] = ()
    """Per step (as ``step_ms``): its number in the run, the index it was
    recorded with. Steps left out (traced) or lost on the way (dropped
    events) leave gaps, so these are not the positions 0, 1, 2...; empty when
    unknown (:attr:`numbers` then gives the positions)."""
    traced_step_numbers: tuple[int, ...] = ()
    """The numbers (as :attr:`step_numbers`) of the steps a profiler snapshot
    of gpuprof's ran in (its trace windows), ascending; empty when none."""
    comm: CommTotals | None = None
    """The run's timed gradient buckets (DDP comm hook), summed; None when it
    timed none. The exposed comm time itself is the ``comm`` phase."""
    comm_ms: tuple[float, ...] = ()
    """Exposed comm (the ``comm`` phase) per step, in ``step_ms``' steps (0
    for a step without one); empty when no step had one."""
    steady_phase_ms: Mapping[str, float] = field(default_factory=dict)
    """Total time per phase over the steady steps (those of
    :attr:`steady_iteration_ms`), ms: the phase split runs are compared by."""
    world_size: int = 1
    """Ranks in the run's job (torchrun's ``WORLD_SIZE``; 1 outside one)."""
    tokens_per_step: int | None = None
    """Tokens per optimizer step on this rank, as declared to
    ``gpuprof.profile``; None when not declared."""
    samples_per_step: int | None = None
    """Samples per optimizer step on this rank, as declared; None when not."""
    stack_frames: tuple[StackFrame, ...] = ()
    """The shim's sampled stacks (:mod:`gpuprof.insights.frames`): samples
    per user frame and step; empty when the run sampled none
    (``profile(stacks=False)``, an older shim)."""
    history_iteration_ms: tuple[tuple[float, ...], ...] = ()
    """Per earlier run of this name (those of :attr:`history_median_step_ms`,
    in that order): its steady iteration times (ms), at most its last
    ``HISTORY_STEPS``; an empty tuple for a run whose steps are gone."""
    history_unit: str = "iteration"
    """``token`` or ``sample`` when an earlier run did other work an iteration
    (:func:`gpuprof.insights.history.work_scale`): the history's times are
    then scaled to this run's work; ``iteration`` when they are as measured."""

    @property
    def steps(self) -> int:
        """Steps in the timing figures (traced steps excluded)."""
        return len(self.step_ms)

    @cached_property
    def numbers(self) -> tuple[int, ...]:
        """:attr:`step_numbers`, or the positions 0, 1, 2... when unknown."""
        return self.step_numbers or tuple(range(self.steps))

    @cached_property
    def loader_ms(self) -> tuple[float, ...]:
        """Per-step loader time: the wait before the step plus its ``data`` phase."""
        if not self.data_ms:
            return self.wait_ms
        return _pairwise_sums(self.wait_ms, self.data_ms)

    @cached_property
    def iteration_ms(self) -> tuple[float, ...]:
        """Per-step loader wait + host time between steps (:attr:`gap_ms`) +
        step: the wall time one iteration costs."""
        it = _pairwise_sums(self.step_ms, self.wait_ms)
        return _pairwise_sums(it, self.gap_ms) if self.gap_ms else it

    @cached_property
    def steady_iteration_ms(self) -> tuple[float, ...]:
        """``iteration_ms`` without the warm-up steps (:func:`steady`): what
        runs are compared by (:mod:`gpuprof.compare`)."""
        return tuple(steady(self.iteration_ms))

    @cached_property
    def median_step_ms(self) -> float | None:
        """Median steady-state iteration time (ms): the runs table's
        MEDIAN_STEP_MS, and what the regression rule compares by once an
        earlier run's steps are gone."""
        it = self.steady_iteration_ms
        return median(it) if it else None


def _pairwise_sums(a: Sequence[float], b: Sequence[float]) -> tuple[float, ...]:
    """``a[i] + b[i]`` for each step, Python's own addition (the same values
    and types as a loop, in C: ``map``).

    Raises:
        ValueError: *a* and *b* differ in length (as ``zip(strict=True)``).
    """
    if len(a) != len(b):
        raise ValueError(f"per-step figures of different lengths ({len(a)} and {len(b)})")
    return tuple(map(operator.add, a, b))


Rule = Callable[[RunContext], "Insight | None"]

_REGISTRY: dict[str, Rule] = {}
_SUPERSEDES: dict[str, tuple[str, ...]] = {}
_FOLDS: dict[str, dict[str, tuple[str, object]]] = {}


def rule(
    name: str,
    supersedes: tuple[str, ...] = (),
    folds: Mapping[str, tuple[str, object]] | None = None,
) -> Callable[[Rule], Rule]:
    """Register a rule under *name* (its ``Insight.rule``).

    ``supersedes`` names more general rules that this one refines: when this
    one fires they are not reported (a CPU-bound stall is also a stall).
    ``folds`` maps a superseded rule it does not refine to the evidence
    (key, value) by which its finding says it described that rule's cause
    too (a loader starved of CPU: ``{"host_cpu_contention": ("cause",
    "contention")}``).
    """

    def deco(fn: Rule) -> Rule:
        if name in _REGISTRY:
            raise ValueError(f"rule {name!r} registered twice")
        _REGISTRY[name] = fn
        _SUPERSEDES[name] = supersedes
        _FOLDS[name] = dict(folds or {})
        return fn

    return deco


def registered_rules() -> dict[str, Rule]:
    """All rules by name (importing :mod:`gpuprof.insights` registers them)."""
    return dict(_REGISTRY)


def refines(specific: str, general: str) -> bool:
    """Whether rule *specific* tells rule *general*'s finding more exactly:
    the first rule it supersedes (a CPU-bound loader stall is a loader
    stall; the host contention it also covers is another finding)."""
    return _SUPERSEDES.get(specific, ())[:1] == (general,)


def folded(specific: str, evidence: Mapping[str, Any] | None, general: str) -> bool:
    """Whether a finding of rule *specific* with *evidence* described rule
    *general*'s finding too: it refines it (:func:`refines`), or its
    evidence says it carried that cause (``folds`` of :func:`rule`)."""
    if refines(specific, general):
        return True
    fold = _FOLDS.get(specific, {}).get(general)
    return fold is not None and evidence is not None and evidence.get(fold[0]) == fold[1]


def drop_superseded(found: list[Insight]) -> list[Insight]:
    """Remove findings that a more specific finding in *found* supersedes."""
    hidden = {old for i in found for old in _SUPERSEDES.get(i.rule, ())}
    return [i for i in found if i.rule not in hidden]
