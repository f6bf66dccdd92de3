"""A live run's recent steps summed up: the figures ``gpuprofctl top`` and
``watch`` show of the last window (pure; the daemon's live feed and the
terminal views use this one definition)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof.stats import mean, median

#: The phases an iteration splits into, as the live feed keys them: the
#: loader wait (with the loader time between micro-batches), the host time
#: between steps outside it (:func:`between_steps_ns`), the named phases, and
#: the step's unlabelled rest; they add up to the iteration.
PHASES = ("loader_wait", "between_steps", "forward", "backward", "comm", "optimizer", "other")


def between_steps_ns(
    prev_t1: int | None, t0: int, wait: int | None, eval_ns: int | None, explicit: bool
) -> int:
    """The host time between the previous step's end *prev_t1* and this
    step's start *t0* that neither its timed loader wait nor its evaluation
    holds (a checkpoint, logging, a ``time.sleep``), ns: part of the
    iteration. 0 for a first step (*prev_t1* None), for a step whose wait was
    not timed by a wrapped DataLoader (*explicit* False: its ``wait`` is then
    already that whole gap) and where the clocks overlap.

    The one definition of the figure: the rules' context computes it over
    numpy columns (``StepColumns.between_steps_ns``) and the daemon's step
    reads in SQL (``gpuprofd.storage.reads.series.step_exprs``) with this
    same arithmetic."""
    if prev_t1 is None or not explicit:
        return 0
    return max(t0 - prev_t1 - (wait or 0) - (eval_ns or 0), 0)


def window_figures(rows: Sequence[Mapping[str, Any]], unit_s: float) -> dict[str, Any]:
    """The figures of a window of steps.

    Each row holds ``iter`` (the iteration: loader wait + the host time
    between steps + step) and each of
    :data:`PHASES`, in units of *unit_s* seconds (1e-9: ns, 1e-3: ms), and
    flags ``traced`` (a profiler window ran in the step), ``eval``
    (evaluation before it) and ``skipped`` (its optimizer update was
    skipped). Traced steps are left out of the timings (their profiler
    overhead is not the loop's, as the summary leaves them out).

    Returns ``steps`` (timed steps), ``mean`` and ``median`` of the
    iteration (in the rows' unit), ``steps_per_s`` (1 / mean), ``pct`` each
    phase's share of the iteration time (%, ``comm`` None when no step timed
    a collective, ``between_steps`` None when no step had time between
    steps outside a timed loader's wait), and the counts of rows ``eval``, ``skipped``, ``traced``.
    Timings and shares are None without a timed step.
    """
    timed = [r for r in rows if not r.get("traced")]
    out: dict[str, Any] = {
        "steps": len(timed),
        "mean": None,
        "median": None,
        "steps_per_s": None,
        "pct": dict.fromkeys(PHASES),
        "eval": sum(1 for r in rows if r.get("eval")),
        "skipped": sum(1 for r in rows if r.get("skipped")),
        "traced": len(rows) - len(timed),
    }
    iters = [float(r.get("iter") or 0) for r in timed]
    total = sum(iters)
    if not timed or total <= 0:
        return out
    avg = mean(iters)
    out["mean"] = avg
    out["median"] = median(iters)
    out["steps_per_s"] = 1.0 / (avg * unit_s)
    for p in PHASES:
        out["pct"][p] = 100.0 * sum(float(r.get(p) or 0) for r in timed) / total
    for p in ("comm", "between_steps"):  # a part the loop never had: not "0 %"
        if not any(r.get(p) for r in timed):
            out["pct"][p] = None
    return out
