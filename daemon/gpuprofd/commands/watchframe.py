"""``gpuprofctl watch``'s frame: one run's iteration time as a scrolling
chart of its phases, its eval and traced steps marked, its GPU and CPU,
and its findings as the live insights pass produces them (with their
gains); the summary once it ended. Pure: ``(RunState, size) -> rich
Text``; :mod:`gpuprofd.commands.screen` draws it.

The chart: one column per step (the mean of a group of steps on a fast
loop, so a column stands for at least half a second and the chart moves
at a readable pace), its height the iteration time, its cells the phases
bottom up (loader wait, forward, backward, comm, optimizer, other). In a
terminal the cells are coloured blocks; as plain text, each phase's letter.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from gpuprof.insights.base import SEVERITIES
from gpuprof.stats import median
from gpuprof.summary import format_summary
from gpuprof.window import PHASES, window_figures
from gpuprofd.commands.livestate import RunState, StepPoint
from gpuprofd.commands.termtext import (
    PHASE_LETTER,
    PHASE_STYLE,
    SPARKS,
    count_text,
    finding_line,
    fit,
    gib,
    ms_text,
    num,
    phase_legend,
    rate_text,
    safe,
)
from gpuprofd.commands.topframe import rank_text

#: Steps the header's figures are over (as the daemon's ``top`` window).
WINDOW_STEPS = 100
#: Columns a second of training fills at most: a faster loop's steps are
#: grouped (a power of two per column) so the chart moves at a readable pace.
COLUMNS_PER_S = 2.0
#: Chart rows, fewest and most.
MIN_CHART_ROWS, MAX_CHART_ROWS = 3, 8
#: A column taller than this many times the median column is drawn clipped
#: (``↑`` on top), so one slow step (step 0's start-up) leaves the rest readable.
CLIP_OVER_MEDIAN = 2.5
WATCH_KEYS = "q quit"


@dataclass(frozen=True)
class Column:
    """One chart column: the steps it holds (first, count), their mean
    iteration and phases (ms), and whether any was traced, had evaluation
    before it, or skipped its update."""

    first: int
    n: int
    iter: float
    phases: tuple[float, ...]
    traced: bool
    eval: bool
    skipped: bool


def steps_per_column(steps_per_s: float | None) -> int:
    """The steps a column holds: 1, or the power of two that keeps the
    chart at no more than :data:`COLUMNS_PER_S` columns a second."""
    if not steps_per_s or steps_per_s <= COLUMNS_PER_S:
        return 1
    return 2 ** math.ceil(math.log2(steps_per_s / COLUMNS_PER_S))


def chart_columns(points: Sequence[StepPoint], count: int, per: int) -> list[Column]:
    """The last *count* columns of *points* (by step), *per* steps each, grouped
    by step index (``step // per``) so columns stay put as steps arrive."""
    groups: list[list[StepPoint]] = []
    for p in points:
        if groups and groups[-1][0].step // per == p.step // per:
            groups[-1].append(p)
        else:
            groups.append([p])
    out = []
    for g in groups[-count:]:
        n = len(g)
        out.append(
            Column(
                first=g[0].step,
                n=n,
                iter=sum(p.iter for p in g) / n,
                phases=tuple(sum(p.phases[i] for p in g) / n for i in range(len(PHASES))),
                traced=any(p.traced for p in g),
                eval=any(p.eval for p in g),
                skipped=any(p.skipped for p in g),
            )
        )
    return out


def chart_top(columns: Sequence[Column]) -> float:
    """The chart's full height, ms: the tallest column, or
    :data:`CLIP_OVER_MEDIAN` times the median one when that is lower."""
    heights = [c.iter for c in columns if c.iter > 0]
    if not heights:
        return 0.0
    return min(max(heights), CLIP_OVER_MEDIAN * median(heights))


def _phase_at(col: Column, level: float, scale: float) -> str:
    """The phase whose stacked span (bottom up, in rows) holds *level*."""
    acc = 0.0
    for p, ms in zip(PHASES, col.phases, strict=True):
        acc += ms * scale
        if level < acc:
            return p
    return "other"


def chart_rows(columns: Sequence[Column], rows: int, top: float, plain: bool) -> list[Text]:
    """The stacked chart, top row first: each column's height its iteration
    time over *top*, each cell the phase at its middle; in a terminal
    coloured blocks (the top cell an eighth-block), as *plain* text letters."""
    grid = [Text() for _ in range(rows)]
    for col in columns:
        scale = rows / top if top > 0 else 0.0
        total = col.iter * scale
        clipped = total > rows
        total = min(total, float(rows))
        if plain:
            total = float(round(total))
        phase_scale = total / (sum(col.phases) or 1.0) if col.iter > 0 else 0.0
        for r in range(rows):  # r = 0: the bottom row
            line = grid[rows - 1 - r]
            if total >= r + 1:
                level, glyph = r + 0.5, None
            elif total > r and not plain:
                frac = total - r
                level, glyph = r + frac / 2, SPARKS[max(0, math.ceil(frac * 8) - 1)]
            else:
                line.append(" ")
                continue
            phase = _phase_at(col, level, phase_scale)
            if clipped and r == rows - 1:
                line.append("↑", style="bold")
            elif plain:
                line.append(PHASE_LETTER[phase], style=PHASE_STYLE[phase])
            else:
                line.append(glyph or "█", style=PHASE_STYLE[phase])
    for line in grid:
        line.rstrip()
    return grid


def marks_row(columns: Sequence[Column]) -> Text:
    """Under each column: ``T`` a profiler window (traced), ``e`` evaluation
    before a step, ``s`` a skipped update; blank otherwise."""
    out = Text()
    for c in columns:
        if c.traced:
            out.append("T", style="magenta")
        elif c.eval:
            out.append("e", style="green")
        elif c.skipped:
            out.append("s", style="yellow")
        else:
            out.append(" ")
    out.rstrip()
    return out


def _between(left: str, right: str, width: int) -> str:
    """*left* and *right* on one line of *width* cells (*left* cut to fit)."""
    room = width - len(right) - 1
    if room < 1:
        return fit(right, width)
    return fit(left, room).ljust(room) + " " + right


def _gpu_line(gpu: dict[str, Any], sample: dict[str, Any] | None, width: int) -> Text:
    index = gpu.get("index")
    label = f"GPU {'-' if index is None else index} {safe(gpu.get('name'))}"
    if sample is None:
        return Text(fit(f"{label}: no sample yet", width), style="dim")
    total, limit = gpu.get("mem_total_bytes"), gpu.get("power_limit_w")
    memory = gib(sample.get("mem_used_bytes")) + (f"/{gib(total)}" if total else "") + " GiB"
    power = num(sample.get("power_w"), "{:.0f}") + (f"/{limit:.0f}" if limit else "") + " W"
    text = (
        f"{label}  util {num(sample.get('util_pct'), '{:.0f}')}%  mem {memory}  {power}  "
        f"{num(sample.get('sm_clock_mhz'), '{:.0f}')} MHz  {num(sample.get('temp_c'), '{:.0f}')}C"
    )
    return Text(fit(text, width))


def _cpu_line(host: dict[str, Any] | None, width: int) -> Text:
    if host is None:
        return Text(fit("CPU: no host sample yet", width), style="dim")
    of = f" of {host['cpu_count']}" if host.get("cpu_count") else ""
    text = (
        f"CPU  this run {num(host.get('run_cores'))} cores, "
        f"others {num(host.get('other_cores'))}{of}"
    )
    return Text(fit(text, width))


def watch_frame(
    state: RunState,
    width: int = 80,
    height: int = 24,
    *,
    plain: bool = False,
    clock: Callable[[float], str] | None = None,
    keys: str = WATCH_KEYS,
    notice: str | None = None,
) -> Text:
    """The frame of *state*, at most *height* lines of *width* cells (module
    doc). *plain*: letters for the phases, as text without a terminal;
    *clock* formats unix seconds (default: local ``HH:MM:SS``); *keys*: the
    last line, the keys that work; *notice*: a line under the header (the
    feed reconnecting)."""
    clock = clock or (lambda t: time.strftime("%H:%M:%S", time.localtime(t)))
    head = state.headline
    live = state.state
    name = safe(live.get("name") or head.get("name"))
    who = [f"#{state.run_id} {name}"]
    if head.get("user"):
        who.append(safe(head["user"]))
    if head.get("world_size") and head["world_size"] > 1:
        who.append(f"rank {rank_text(head)}")
    who.append(safe(live.get("status") or head.get("status") or "connecting"))
    newest = state.steps[-1].t if state.steps else None
    lines = [
        Text(
            _between("gpuprof watch · " + " · ".join(who), clock(newest) if newest else "", width),
            style="bold",
        )
    ]
    if state.error:
        lines.append(Text(fit(f"error: {safe(state.error)}", width), style="red"))
    if notice:
        lines.append(Text(fit(safe(notice), width), style="yellow"))
    figs = window_figures(state.window(WINDOW_STEPS), unit_s=1e-3)
    steps = state.step_count()
    stats = (
        f"{count_text(steps)} steps · {rate_text(figs['steps_per_s'])} steps/s · "
        f"{ms_text(figs['mean'])} ms/it mean, {ms_text(figs['median'])} median "
        f"(last {figs['steps']} steps)"
    )
    lines.append(Text(fit(stats, width)))
    # below the chart: marks, axis, phases, GPUs, CPU, findings' header, keys
    gpus = head.get("gpus") or []
    found = by_severity(state.insights)
    below = 4 + max(len(gpus), 0) + 1 + 1 + 1
    chart_h = max(MIN_CHART_ROWS, min(MAX_CHART_ROWS, height - len(lines) - 1 - below - 2))
    per = steps_per_column(figs["steps_per_s"])
    columns = chart_columns(list(state.steps), width, per)
    top = chart_top(columns)
    unit = "one column per step" if per == 1 else f"one column per {per} steps (their mean)"
    lines.append(Text(_between(f"ms/iteration, {unit}", f"top {ms_text(top)} ms", width)))
    lines.extend(chart_rows(columns, chart_h, top, plain))
    lines.append(marks_row(columns))
    if columns:
        first, last = columns[0].first, columns[-1].first + columns[-1].n - 1
        left, right = f"step {first}", f"step {last}"
        mid = "T traced · e eval · s skipped"
        gap = width - len(left) - len(right) - len(mid)
        if gap >= 2:
            axis = left + " " * (gap // 2) + mid + " " * (gap - gap // 2) + right
        else:
            axis = _between(left, right, width)
    else:
        axis = "no step yet"
    lines.append(Text(axis, style="dim"))
    legend = phase_legend(figs["pct"] if figs["steps"] else None)
    legend.truncate(width)
    lines.append(legend)
    for g in gpus:
        lines.append(_gpu_line(g, state.gpus.get(str(g.get("uuid"))), width))
    lines.append(_cpu_line(state.host, width))
    when = f", as of {clock(state.insights_s)}" if state.insights_s else ""
    if found:
        # the figures above are the last steps'; a finding and its gain, the whole run's
        head = f"Findings ({len(found)}, whole run{when}):"
        lines.append(Text(fit(head, width), style="bold"))
    elif state.insights_s:
        lines.append(Text(fit(f"Findings: none{when}", width), style="bold"))
    else:
        lines.append(
            Text(fit("Findings: none yet (the daemon looks every ~10 s)", width), style="bold")
        )
    room = max(height - len(lines) - 1, 0)
    for i, ins in enumerate(found[:room]):
        if i == room - 1 and len(found) > room:
            lines.append(Text(fit(f"  … {len(found) - i} more", width), style="dim"))
        else:
            lines.append(finding_line(ins, width, "  "))
    lines.append(Text(fit(keys, width), style="dim"))
    return Text("\n").join(lines[:height])


def by_severity(found: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings most severe first (``HIGH``, ``MED``, ``LOW``), in the order
    found among equals, so a short terminal cuts the least severe."""
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(found, key=lambda f: rank.get(f.get("severity"), len(rank)))


def summary_text(summary: dict[str, Any]) -> str:
    """The run's end-of-run summary block (:func:`gpuprof.summary.format_summary`)
    with every line made inert (:func:`gpuprof.commands.termtext.safe`)."""
    return "\n".join(safe(line) for line in format_summary(summary).split("\n"))
