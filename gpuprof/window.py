"""A live run's recent steps summed up: the figures ``gpuprofctl top`` and
``watch`` show of the last window (pure; the daemon's live feed and the
terminal views use this one definition)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuprof.stats import mean, median

#: The phases an iteration splits into, as the live feed keys them: the
#: loader wait (with the loader time between micro-batches), the named
#: phases, and the step's unlabelled rest; they add up to the iteration.
PHASES = ("loader_wait", "forward", "backward", "comm", "optimizer", "other")


def window_figures(rows: Sequence[Mapping[str, Any]], unit_s: float) -> dict[str, Any]:
    """The figures of a window of steps.

    Each row holds ``iter`` (the iteration: loader wait + step) and each of
    :data:`PHASES`, in units of *unit_s* seconds (1e-9: ns, 1e-3: ms), and
    flags ``traced`` (a profiler window ran in the step), ``eval``
    (evaluation before it) and ``skipped`` (its optimizer update was
    skipped). Traced steps are left out of the timings (their profiler
    overhead is not the loop's, as the summary leaves them out).

    Returns ``steps`` (timed steps), ``mean`` and ``median`` of the
    iteration (in the rows' unit), ``steps_per_s`` (1 / mean), ``pct`` each
    phase's share of the iteration time (%, ``comm`` None when no step timed
    a collective), and the counts of rows ``eval``, ``skipped``, ``traced``.
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
    if not any(r.get("comm") for r in timed):
        out["pct"]["comm"] = None
    return out
