"""Run-vs-run compare: how much faster or slower run B is than run A, whether
that is beyond the noise of their step times, how the phase split moved, and
which findings went away, appeared or changed.

One definition for ``gpuprofctl compare``, the HTTP API's compare (the
dashboard's compare view) and the ``regression`` rule:
:func:`gpuprof.stats.speed_ratio` is the speed-up with its confidence
interval and noise test, :func:`compare_runs` the whole comparison ending
in one sentence (:func:`verdict`). Pure: the callers read the runs.

Runs are compared by their steady mean iteration time (loader wait + step,
warm-up steps left out; :attr:`RunContext.steady_iteration_ms`): the mean,
not the median, because throughput is what a run costs, and a fix that
removes a slow step every 100 leaves the median where it was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpuprof.insights.base import (
    RunContext,
    common_unit,
    folded,
    mean_micro,
    same_shape,
    steady,
)
from gpuprof.insights.contention import measured_under_contention
from gpuprof.protocol import DATA_PHASE
from gpuprof.stats import (
    CONFIDENCE,
    MAX_BLOCKS,
    MIN_STEPS,
    RESAMPLES,
    SEED,
    SpeedRatio,
    mean,
    median,
    speed_ratio,
)
from gpuprof.summary import held_text, mfu_figures

#: A phase whose share of the iteration moved by at least this many
#: percentage points is named in the verdict.
PHASE_SHIFT_PP = 5.0
#: A phase whose time per unit of work moved with the run's own change (grew
#: in a slower B, shrank in a faster one) by at least this many % of A's
#: iteration is named by its time even when its share moved the other way
#: (another phase moved more): twice :data:`PHASE_SHIFT_PP`, so a phase that
#: only followed a large change elsewhere stays out of the sentence.
PHASE_TIME_PCT = 2 * PHASE_SHIFT_PP
#: Findings named in the verdict, per kind (then "and N more").
NAMED_FINDINGS = 3

#: Rules that judge a run against earlier runs of its own name: between runs
#: of different names each has its own baseline, so their findings are
#: neither resolved nor new (``history`` in :func:`finding_changes`).
OWN_HISTORY_RULES = frozenset({"regression"})

#: Short names of the findings, for the verdict (the titles are sentences).
RULE_LABELS = {
    "dataloader_stall": "loader stall",
    "host_work_between_steps": "work between steps",
    "cpu_bound_dataloader": "CPU-bound loader",
    "io_bound_dataloader": "I/O-bound loader",
    "prefetch_queue_starved": "prefetch queue starved",
    "cold_cache": "cold page cache",
    "cache_thrashing": "page-cache thrashing",
    "host_memory_pressure": "host memory pressure",
    "worker_imbalance": "loader worker imbalance",
    "host_cpu_contention": "host CPU contention",
    "flops_mismatch": "FLOPs mismatch",
    "compilation_warmup": "slow warm-up",
    "first_step_outlier": "slow first step",
    "high_step_variance": "erratic step times",
    "low_mfu": "low MFU",
    "regression": "regression",
    "memory_pressure": "GPU memory pressure",
    "thermal_throttling": "thermal throttling",
    "power_capping": "power capping",
    "copy_bound_gpu": "copy-bound GPU",
    "pcie_saturation": "PCIe saturation",
    "small_batch": "small batch",
    "gpu_idle_between_steps": "GPU idle between steps",
    "sdpa_suboptimal": "slow attention kernel",
    "kernel_drift": "kernel drift",
    "kernel_launch_overhead": "kernel launch overhead",
    "gradient_checkpointing_detected": "gradient checkpointing",
    "straggler_rank": "straggler rank",
    "bucket_skew": "bucket skew",
    "comm_dominant": "exposed communication",
    "rank_skew": "rank skew",
    "estimated_cost": "estimated cost",
}

#: The phase split's rows: key, label (as ``gpuprofctl runs`` orders them).
PHASES = (
    ("loader_wait", "loader wait"),
    ("between_steps", "between steps"),
    ("forward", "forward"),
    ("backward", "backward"),
    ("comm", "exposed comm"),
    ("optimizer", "optimizer"),
    ("other", "other"),
)
_NAMED_PHASES = ("forward", "backward", "comm", "optimizer", DATA_PHASE)


# --- shapes ----------------------------------------------------------------------


def micro_per_step(ctx: RunContext) -> float:
    """Mean micro-batches per steady step (1 when none were counted)."""
    return mean_micro(ctx.micro_batches)


@dataclass(frozen=True)
class Basis:
    """What the two runs are compared per."""

    unit: str
    """``iteration``, ``sample``, ``token`` or ``micro-batch``."""
    units_a: float
    """The work one iteration of A does, in :attr:`unit`s, all ranks together."""
    units_b: float
    note: str | None
    """Why this basis, when it is not the plain per-iteration one."""


def _declared(ctx: RunContext, unit: str) -> int | None:
    return ctx.tokens_per_step if unit == "token" else ctx.samples_per_step


def compare_basis(a: RunContext, b: RunContext) -> Basis:
    """Per iteration when the runs have the same shape (world size,
    micro-batches per step, declared tokens or samples per step); else per
    token when both declare ``tokens_per_step``, per sample when both declare
    ``samples_per_step`` (each times the world size: the job's work); else
    per micro-batch on all ranks, assuming micro-batches of one size. The
    note says why, and when only one run declares its work."""
    shared = common_unit(a, b)
    if shared is not None:
        unit, ua, ub = shared
        if ua == ub:
            return Basis("iteration", 1.0, 1.0, None)
        why = f"A does {ua:,} {unit}s per iteration (all ranks), B {ub:,}"
        return Basis(unit, float(ua), float(ub), f"compared per {unit}: {why}")
    # one side alone declaring its work cannot normalise the other: said
    alone = [
        f"only {side} declares {unit}s_per_step"
        for unit in ("token", "sample")
        for side, mine, other in (("A", a, b), ("B", b, a))
        if _declared(mine, unit) and not _declared(other, unit)
    ]
    ma, mb = micro_per_step(a), micro_per_step(b)
    if same_shape(a.world_size, ma, b.world_size, mb):
        note = f"compared per iteration: {'; '.join(alone)}" if alone else None
        return Basis("iteration", 1.0, 1.0, note)
    ua, ub = ma * a.world_size, mb * b.world_size
    why = (
        f"A runs {ma:g} micro-batch(es) per step on {a.world_size} rank(s), "
        f"B {mb:g} on {b.world_size}; assumes micro-batches of one size (declare "
        "samples_per_step= or tokens_per_step= in gpuprof.profile to compare per sample or token)"
    )
    return Basis("micro-batch", ua, ub, f"compared per micro-batch: {why}")


# --- the parts ---------------------------------------------------------------------


def _r(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def headline(ctx: RunContext, run_id: int | None, basis: Basis, units: float) -> dict[str, Any]:
    """One run's figures: steps, steady mean and median iteration (ms),
    steps/s, MFU (0-1) and TFLOP/s per GPU where known, its shape, and its
    throughput per :attr:`Basis.unit` (per second, all ranks) when that is
    not per iteration."""
    iterations = ctx.steady_iteration_ms
    mean_ms = mean(iterations) if iterations else None
    compute = mfu_figures(ctx)
    return {
        "run_id": run_id,
        "run_name": ctx.run_name,
        "status": ctx.status,
        "steps": ctx.steps + ctx.traced_steps,
        "steady_steps": len(iterations),
        "mean_iteration_ms": _r(mean_ms),
        "median_iteration_ms": _r(median(iterations) if iterations else None),
        "steps_per_s": _r(1e3 / mean_ms if mean_ms else None),
        "units_per_s": _r(units * 1e3 / mean_ms if mean_ms and basis.unit != "iteration" else None),
        "mfu": compute["mfu"],
        "achieved_tflops": compute["achieved_tflops"],
        "world_size": ctx.world_size,
        "micro_batches_per_step": round(micro_per_step(ctx), 2),
        "tokens_per_step": ctx.tokens_per_step,
        "samples_per_step": ctx.samples_per_step,
    }


def phase_split(ctx: RunContext) -> dict[str, tuple[float, float] | None]:
    """Per phase of :data:`PHASES`: (mean ms per steady iteration, % of the
    steady iteration time). ``loader_wait`` is the wait before the step plus
    the ``data`` phase; ``between_steps`` the host work between the steps
    outside a timed loader's wait (None when the run had none: without a
    timed loader it is the loader wait); ``other`` the rest of the step
    (unlabelled time, the user's own phases); ``comm`` None when the run
    timed no collectives.
    All None without steady steps."""
    iterations = ctx.steady_iteration_ms
    total = math.fsum(iterations)
    if not iterations or total <= 0:
        return {key: None for key, _ in PHASES}
    phases = ctx.steady_phase_ms
    n = len(iterations)
    named = math.fsum(phases.get(p, 0.0) for p in _NAMED_PHASES)
    sums = {
        "loader_wait": math.fsum(steady(ctx.wait_ms)) + phases.get(DATA_PHASE, 0.0),
        "between_steps": math.fsum(steady(ctx.gap_ms)) if ctx.gap_ms else None,
        "forward": phases.get("forward", 0.0),
        "backward": phases.get("backward", 0.0),
        "comm": phases.get("comm", 0.0) if ctx.comm_ms else None,
        "optimizer": phases.get("optimizer", 0.0),
        "other": max(math.fsum(steady(ctx.step_ms)) - named, 0.0),
    }
    return {k: None if v is None else (v / n, 100.0 * v / total) for k, v in sums.items()}


def phase_deltas(a: RunContext, b: RunContext, basis: Basis) -> list[dict[str, Any]]:
    """The phase split of each side by side: ms per iteration (``a_ms``,
    ``b_ms``), % of the iteration (``a_pct``, ``b_pct``), B minus A
    (``delta_pct`` in points; ``delta_ms`` only on the per-iteration basis:
    ms of runs of different shapes do not subtract), ``time_ratio``: B's
    time in the phase per unit of work over A's (0.1: a tenth; None when
    A spent none) and ``change_pct``: B's time in the phase per unit of work
    less A's, in % of A's iteration per unit (-30: the phase saves B 30 % of
    A's iteration; what the verdict judges a phase by)."""
    sa, sb = phase_split(a), phase_split(b)
    same = basis.unit == "iteration"
    a_iteration = mean(a.steady_iteration_ms) / basis.units_a if a.steady_iteration_ms else 0.0
    out = []
    for key, label in PHASES:
        pa, pb = sa[key], sb[key]
        row: dict[str, Any] = {"phase": key, "label": label}
        row["a_ms"], row["a_pct"] = (_r(pa[0]), _r(pa[1], 1)) if pa else (None, None)
        row["b_ms"], row["b_pct"] = (_r(pb[0]), _r(pb[1], 1)) if pb else (None, None)
        row.update(delta_ms=None, delta_pct=None, time_ratio=None, change_pct=None)
        if pa is not None and pb is not None:
            row["delta_ms"] = _r(pb[0] - pa[0]) if same else None
            row["delta_pct"] = _r(pb[1] - pa[1], 1)
            per_a, per_b = pa[0] / basis.units_a, pb[0] / basis.units_b
            if pa[0] > 0:
                row["time_ratio"] = _r(per_b / per_a, 4)
            if a_iteration > 0:
                row["change_pct"] = _r(100.0 * (per_b - per_a) / a_iteration, 1)
        out.append(row)
    return out


def label_of(rule: str) -> str:
    """The finding's short name (:data:`RULE_LABELS`; else its rule, spaced)."""
    return RULE_LABELS.get(rule, rule.replace("_", " "))


def _gains(found: Mapping[str, Any]) -> dict[str, Any]:
    """The finding's gain figures (``gain_*`` fields), where it has them."""
    return {k: v for k, v in found.items() if k.startswith("gain_")}


def finding_changes(
    findings_a: Sequence[Mapping[str, Any]],
    findings_b: Sequence[Mapping[str, Any]],
    same_name: bool = True,
    judged: bool = True,
) -> dict[str, list[dict[str, Any]]]:
    """The findings matched by rule: ``resolved`` (A's only), ``new`` (B's
    only), ``changed`` (both, another severity) and ``unchanged`` (both,
    the same severity; their titles' figures may differ). Runs of different
    names (not *same_name*) put the findings of :data:`OWN_HISTORY_RULES`
    in ``history`` instead: each run's against its own earlier runs. When a
    run is too short for its rules to speak (not *judged*), a finding of one
    run alone is in ``unjudged``: its absence from the other says nothing. Each entry has
    ``rule``, ``label`` and each side's ``severity_a``/``title_a`` and
    ``severity_b``/``title_b`` it has, and any ``gain_*`` fields of A's
    finding (what fixing it was predicted to be worth) and B's."""
    by_a = {f["rule"]: f for f in findings_a}
    by_b = {f["rule"]: f for f in findings_b}
    out: dict[str, list[dict[str, Any]]] = {
        "resolved": [],
        "new": [],
        "changed": [],
        "unchanged": [],
        "history": [],
        "unjudged": [],
    }
    for rule in [*by_a, *(r for r in by_b if r not in by_a)]:
        fa, fb = by_a.get(rule), by_b.get(rule)
        entry: dict[str, Any] = {"rule": rule, "label": label_of(rule)}
        if fa is not None:
            entry.update(severity_a=fa.get("severity"), title_a=fa.get("title"), gain_a=_gains(fa))
        if fb is not None:
            entry.update(severity_b=fb.get("severity"), title_b=fb.get("title"), gain_b=_gains(fb))
        if not same_name and rule in OWN_HISTORY_RULES:
            kind = "history"
        elif not judged and (fa is None or fb is None):
            kind = "unjudged"
        elif fb is None:
            kind = "resolved"
        elif fa is None:
            kind = "new"
        else:
            kind = "changed" if fa.get("severity") != fb.get("severity") else "unchanged"
        out[kind].append(entry)
    _pair_refined(out, by_a, by_b)
    return out


def _history_unless_moved(out: dict[str, list[dict[str, Any]]], r: SpeedRatio) -> None:
    """A regression (:data:`OWN_HISTORY_RULES`) is resolved only when B is
    faster than A beyond noise, new only when slower: else it went or came
    with its baseline (the earlier runs it is judged against, which roll
    on: a slow run repeated stops being a regression once it is the
    baseline), and it moves to ``history``, each run's own."""
    faster = r.low is not None and r.low > 1.0
    slower = r.high is not None and r.high < 1.0
    for kind, moved in (("resolved", faster), ("new", slower)):
        own = [e for e in out[kind] if e["rule"] in OWN_HISTORY_RULES and not moved]
        out[kind] = [e for e in out[kind] if e not in own]
        out["history"].extend(own)


def _pair_refined(
    out: dict[str, list[dict[str, Any]]],
    by_a: Mapping[str, Mapping[str, Any]],
    by_b: Mapping[str, Mapping[str, Any]],
) -> None:
    """Move a resolved finding and a new one where one described the other
    (A's loader stall, B's CPU-bound loader: the stall is still there, its
    cause found; A's loader starved of CPU, B's host contention: the
    contention was there, folded into the stall) to ``changed``, as one
    entry: ``rule`` B's, ``rule_a`` A's, the label ``loader stall →
    CPU-bound loader`` (:func:`folded`, on the findings *by_a* and *by_b*
    by rule)."""
    paired_a: set[str] = set()
    paired_b: set[str] = set()
    for a in out["resolved"]:
        for b in out["new"]:
            ra, rb = a["rule"], b["rule"]
            if folded(rb, by_b[rb].get("evidence"), ra) or folded(ra, by_a[ra].get("evidence"), rb):
                entry = {**a, **b, "rule_a": a["rule"], "label": f"{a['label']} → {b['label']}"}
                out["changed"].append(entry)
                paired_a.add(a["rule"])
                paired_b.add(b["rule"])
    out["resolved"] = [e for e in out["resolved"] if e["rule"] not in paired_a]
    out["new"] = [e for e in out["new"] if e["rule"] not in paired_b]


# --- the sentence ---------------------------------------------------------------------


def _digits(x: float) -> int:
    """Decimals a factor is said with: two below 2× (1.05×, 1.25×), else one."""
    return 2 if x < 2 else 1


def times(x: float) -> str:
    """``2.9×``, ``1.25×`` (:func:`_digits`)."""
    return f"{x:.{_digits(x)}f}×"


def _interval(point: float, lo: float, hi: float) -> str:
    """``95 % CI 2.7–3.1``: at the decimals of *point* (:func:`_digits`),
    or more (up to three) until the two ends differ."""
    digits = _digits(point)
    while digits < 3 and f"{lo:.{digits}f}" == f"{hi:.{digits}f}" and lo != hi:
        digits += 1
    return f"{int(CONFIDENCE * 100)} % CI {lo:.{digits}f}–{hi:.{digits}f}"


def speed_clause(r: SpeedRatio, unit: str) -> str:
    """``B is 2.9× faster (95 % CI 2.7–3.1)``, ``B is 1.4× slower per sample
    (...)``, ``B is as fast as A within noise (1.02×, 95 % CI 0.97–1.08)``;
    a slow-down's interval is given as slow-down factors too."""
    per = "" if unit == "iteration" else f" per {unit}"
    if r.low is None or r.high is None:
        word, factor = ("faster", r.speedup) if r.speedup >= 1 else ("slower", 1 / r.speedup)
        why = f"too few steady steps for an interval: {r.steps_a} and {r.steps_b}"
        return f"B is {times(factor)} {word}{per} ({why})"
    if r.within_noise:
        interval = _interval(r.speedup, r.low, r.high)
        return f"B is as fast as A{per} within noise ({r.speedup:.2f}×, {interval})"
    if r.speedup >= 1:
        return f"B is {times(r.speedup)} faster{per} ({_interval(r.speedup, r.low, r.high)})"
    factor = 1 / r.speedup
    return f"B is {times(factor)} slower{per} ({_interval(factor, 1 / r.high, 1 / r.low)})"


def _names(entries: Sequence[Mapping[str, Any]]) -> str:
    quoted = [f'"{e["label"]}"' for e in entries[:NAMED_FINDINGS]]
    more = len(entries) - NAMED_FINDINGS
    if more > 0:
        quoted.append(f"{more} more")
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " and " + quoted[-1]


def _problems(entries: Sequence[Mapping[str, Any]], side: str) -> list[Mapping[str, Any]]:
    """*entries* but the cost line (a figure, not a problem), worst first."""
    order = {"HIGH": 0, "MED": 1, "LOW": 2}
    kept = [e for e in entries if e["rule"] != "estimated_cost"]
    return sorted(kept, key=lambda e: order.get(e.get(f"severity_{side}"), 3))


def _moved(p: Mapping[str, Any]) -> bool:
    """The phase's own time per unit of work moved by :data:`PHASE_SHIFT_PP`
    % of A's iteration or more (``change_pct``), and its share the same way
    by as many points: a share that rose while the phase's time barely moved
    (or fell) only says that other phases shrank."""
    shift, change = p["delta_pct"], p.get("change_pct")
    if shift is None or change is None or abs(change) < PHASE_SHIFT_PP:
        return False
    return abs(shift) >= PHASE_SHIFT_PP and (shift > 0) == (change > 0)


def _moved_in_time(p: Mapping[str, Any], slower: bool) -> bool:
    """The phase's time per unit of work moved with the run's change (grew
    when B is slower, shrank when B is faster) by :data:`PHASE_TIME_PCT` % of
    A's iteration or more while its share moved the other way by a point or
    more: a forward that took 3× as long in a B whose loader wait grew even
    more (the forward's share fell) still explains the slow-down."""
    shift, change, ratio = p["delta_pct"], p.get("change_pct"), p.get("time_ratio")
    if shift is None or change is None or not ratio or abs(change) < PHASE_TIME_PCT:
        return False
    # its share moved the other way: another phase moved more (a share that
    # held says no more than the headline does)
    return (change > 0) == slower and abs(shift) >= 1.0 and (shift > 0) != (change > 0)


def _phase_clause(p: Mapping[str, Any], unit: str) -> str:
    """``loader wait fell from 57 % to 4 %`` (by share, :func:`_moved`), or
    ``forward time per iteration rose 3.0×`` (by time, :func:`_moved_in_time`)."""
    if _moved(p):
        way = "fell" if p["delta_pct"] < 0 else "rose"
        return f"{p['label']} {way} from {p['a_pct']:.0f} % to {p['b_pct']:.0f} %"
    ratio = p["time_ratio"]
    way, factor = ("rose", ratio) if ratio >= 1 else ("fell", 1 / ratio)
    return f"{p['label']} time per {unit} {way} {times(factor)}"


def verdict(
    r: SpeedRatio, unit: str, phases: Sequence[Mapping[str, Any]], changes: Mapping[str, Any]
) -> str:
    """The comparison in one sentence: the speed (:func:`speed_clause`), the
    phases that moved (:func:`_moved` by share, :func:`_moved_in_time` by
    time; the largest change in time first, at most two), the findings
    resolved and new (the cost line left out).

    ``B is 2.9× faster (95 % CI 2.7–3.1): loader wait fell from 57 % to 4 %;
    "CPU-bound loader" is resolved.``"""
    slower = r.speedup < 1.0
    named = [p for p in phases if _moved(p) or _moved_in_time(p, slower)]
    parts = [_phase_clause(p, unit) for p in sorted(named, key=lambda p: -abs(p["change_pct"]))[:2]]
    resolved, new = _problems(changes["resolved"], "a"), _problems(changes["new"], "b")
    if resolved:
        parts.append(f"{_names(resolved)} {'is' if len(resolved) == 1 else 'are'} resolved")
    if new:
        parts.append(f"{_names(new)} {'is' if len(new) == 1 else 'are'} new")
    head = speed_clause(r, unit)
    return f"{head}: {'; '.join(parts)}." if parts else f"{head}."


def busy_host_clause(
    r: SpeedRatio, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None
) -> str | None:
    """What the host's load says of the ratio *r*, from each run's
    ``measured_under_contention`` (:func:`gpuprof.insights.measured_under_contention`;
    None: an idle host, or unsampled): ``B was measured on a busy host (other
    processes held 0.8 of 2 cores during 55 % of its steps): the slowdown may
    be the host's, not the code's``. None when the load cannot explain the
    difference: neither run contended, the ratio within noise, or only the
    faster run contended (its lead holds despite it)."""
    if (a is None and b is None) or r.within_noise:
        return None
    if a is not None and b is not None:
        return "both runs were measured on a busy host: the ratio carries its load as well"
    slower_b = r.speedup < 1.0
    side, got = ("B", b) if b is not None else ("A", a)
    if (side == "B") != slower_b:  # the faster run was the contended one
        return None
    what = "slowdown" if slower_b else "speed-up"
    return (
        f"{side} was measured on a busy host (other processes held {held_text(got)} during "
        f"{got['share_of_steps']:.0%} of its steps): the {what} may be the host's, "
        "not the code's"
    )


def compare_runs(
    a: RunContext,
    b: RunContext,
    findings_a: Sequence[Mapping[str, Any]],
    findings_b: Sequence[Mapping[str, Any]],
    a_id: int | None = None,
    b_id: int | None = None,
) -> dict[str, Any]:
    """Run B against run A: ``a`` and ``b`` (:func:`headline`), ``basis``
    (``unit``, ``units_a``/``units_b`` per iteration and a ``note`` when the
    shapes differ, :func:`compare_basis`), ``speedup`` with ``ci_low`` /
    ``ci_high`` (:data:`CONFIDENCE`; None with too few steps) and
    ``within_noise`` (:func:`speed_ratio`), ``method``, ``phases``
    (:func:`phase_deltas`), ``findings`` (:func:`finding_changes`: findings
    as ``Insight.to_dict()`` gives them), ``measured_under_contention`` (each
    run's, ``a`` and ``b``) and ``verdict`` (:func:`verdict`, with
    :func:`busy_host_clause` where the host's load may explain the ratio).

    Raises:
        ValueError: a run without steady iterations (nothing to compare).
    """
    for side, ctx, rid in (("A", a, a_id), ("B", b, b_id)):
        if not ctx.steady_iteration_ms:
            who = f"run {rid}" if rid is not None else f"run {side}"
            raise ValueError(f"{who} ({ctx.run_name!r}) has no timed steps to compare")
    basis = compare_basis(a, b)
    ratio = speed_ratio(a.steady_iteration_ms, b.steady_iteration_ms, basis.units_a, basis.units_b)
    phases = phase_deltas(a, b, basis)
    # most rules need more steps than a smoke run has: a finding missing
    # from a run of a few steps was not looked for, not resolved; nor from a
    # running run before gpuprofd's first live pass (every pass finds at
    # least the cost line)
    judged = min(len(a.steady_iteration_ms), len(b.steady_iteration_ms)) >= MIN_STEPS and all(
        found or ctx.status != "running" for ctx, found in ((a, findings_a), (b, findings_b))
    )
    changes = finding_changes(findings_a, findings_b, a.run_name == b.run_name, judged)
    _history_unless_moved(changes, ratio)
    busy = {"a": measured_under_contention(a), "b": measured_under_contention(b)}
    said = verdict(ratio, basis.unit, phases, changes)
    host = busy_host_clause(ratio, busy["a"], busy["b"])
    return {
        "a": headline(a, a_id, basis, basis.units_a),
        "b": headline(b, b_id, basis, basis.units_b),
        "basis": asdict(basis),
        "speedup": round(ratio.speedup, 4),
        "ci_low": _r(ratio.low, 4),
        "ci_high": _r(ratio.high, 4),
        "confidence": CONFIDENCE,
        "within_noise": ratio.within_noise,
        "method": (
            f"ratio of the steady mean iteration times per {basis.unit}; "
            f"{int(CONFIDENCE * 100)} % interval from a bootstrap of each run's steps "
            f"({RESAMPLES} resamples in at most {MAX_BLOCKS} contiguous blocks, seed {SEED})"
        ),
        "phases": phases,
        "findings": changes,
        "measured_under_contention": busy,
        "verdict": f"{said[:-1]}; {host}." if host else said,
    }
