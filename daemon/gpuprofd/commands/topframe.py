"""``gpuprofctl top``'s frame: the live runs, their top findings, the GPUs
and the host's CPU, from one ``node`` message of the live feed. Pure:
``(message, choices, size) -> rich Text``, so a frame is tested from a
controlled message; :mod:`gpuprofd.commands.screen` draws it.

Fits 80 columns: the name and GPU model columns take what the fixed ones
leave. Every string from a run goes through
:func:`gpuprofd.commands.termtext.safe`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from gpuprofd.commands.termtext import (
    cell,
    count_text,
    finding_line,
    fit,
    gib,
    ms_text,
    num,
    phase_bar,
    phase_legend,
    rate_text,
    safe,
)

#: The sort keys, in the order ``s`` cycles through them, with their names.
SORTS = {
    "id": "run id",
    "name": "name",
    "rate": "steps/s",
    "iter": "iteration",
    "wait": "loader wait",
    "cpu": "CPU",
}
#: Columns of a run's row: header, width (cells), right-aligned.
PHASE_CELLS = 10
KEYS_LINE = "s sort  r reverse  ↑↓ pick  enter watch  q quit"


@dataclass
class TopChoices:
    """What the viewer chose: the sort key (:data:`SORTS`), its direction,
    and the run picked (its id; None: the first)."""

    sort: str = "id"
    descending: bool = True
    picked: int | None = None

    def next_sort(self) -> None:
        keys = list(SORTS)
        self.sort = keys[(keys.index(self.sort) + 1) % len(keys)]


def _sort_value(run: Mapping[str, Any], key: str) -> Any:
    w = run.get("window") or {}
    value: Any = {
        "id": run.get("id"),
        "name": safe(run.get("name")).lower(),
        "rate": w.get("steps_per_s"),
        "iter": w.get("mean_ms"),
        "wait": (w.get("pct") or {}).get("loader_wait"),
        "cpu": run.get("cpu_cores"),
    }[key]
    return (value is not None, value if value is not None else 0)


def sorted_runs(runs: Sequence[Mapping[str, Any]], choices: TopChoices) -> list[Mapping[str, Any]]:
    """*runs* in the chosen order (unknown values last either way, then by id)."""
    by_id = sorted(runs, key=lambda r: r.get("id") or 0, reverse=True)
    known = [r for r in by_id if _sort_value(r, choices.sort)[0]]
    unknown = [r for r in by_id if not _sort_value(r, choices.sort)[0]]
    known.sort(key=lambda r: _sort_value(r, choices.sort)[1], reverse=choices.descending)
    return known + unknown


def picked_run(runs: Sequence[Mapping[str, Any]], choices: TopChoices) -> Mapping[str, Any] | None:
    """The run the choices pick among *runs* (sorted): the one of
    ``picked``, else the first; None without runs."""
    for r in runs:
        if r.get("id") == choices.picked:
            return r
    return runs[0] if runs else None


def move_pick(runs: Sequence[Mapping[str, Any]], choices: TopChoices, by: int) -> None:
    """Pick the run *by* rows below (negative: above) the picked one, kept in range."""
    if not runs:
        return
    ids = [r.get("id") for r in runs]
    now = ids.index(choices.picked) if choices.picked in ids else 0
    choices.picked = ids[max(0, min(len(ids) - 1, now + by))]


def rank_text(run: Mapping[str, Any]) -> str:
    """``rank/world size`` (``0/8``); ``-`` when unknown."""
    rank, world = run.get("rank"), run.get("world_size")
    if rank is None:
        return "-"
    return f"{rank}/{world}" if world is not None else str(rank)


def _row(cells: Sequence[tuple[str | Text, int, bool]]) -> Text:
    """Cells of given widths, one space apart (a Text cell is cut to its width)."""
    out = Text()
    for i, (value, width, right) in enumerate(cells):
        if i:
            out.append(" ")
        if isinstance(value, Text):
            part = value.copy()
            part.truncate(width, pad=True)
            out.append_text(part)
        else:
            out.append(cell(value, width, right))
    out.rstrip()
    return out


#: The narrowest the name columns get before others are dropped.
MIN_NAME = 10
#: Run columns dropped, in this order, from a terminal too narrow for all.
RUN_DROPS = ("MEDIAN", "DROP", "MFU", "USER", "RANK", "STEPS")
GPU_DROPS = ("TEMP", "SM MHz", "POWER W")


def _fit_columns(
    fixed: list[tuple[str, int, bool]], width: int, drops: Sequence[str]
) -> list[tuple[str, int, bool]]:
    """*fixed* (header, width, right-aligned; ``NAME`` width 0) with NAME
    taking what the others leave, dropping columns in the order *drops*
    says while NAME would get less than :data:`MIN_NAME`."""
    cols = list(fixed)
    for name in ("", *drops):
        cols = [c for c in cols if c[0] != name]
        used = sum(w for _, w, _ in cols) + len(cols) - 1
        if width - used >= MIN_NAME:
            break
    name_w = max(MIN_NAME, width - used)
    return [(h, name_w if h == "NAME" else w, r) for h, w, r in cols]


def _run_columns(runs: Sequence[Mapping[str, Any]], width: int) -> list[tuple[str, int, bool]]:
    """The run table's (header, width, right-aligned), the name taking the rest."""
    id_w = max([3, *(len(str(r.get("id"))) for r in runs)])
    fixed = [
        ("RUN", id_w, True),
        ("NAME", 0, False),
        ("USER", 7, False),
        ("RANK", 5, False),
        ("STEPS", 6, True),
        ("STEP/S", 6, True),
        ("MEAN", 6, True),
        ("MEDIAN", 6, True),
        ("PHASES", PHASE_CELLS, False),
        ("MFU", 4, True),
        ("DROP", 4, True),
    ]
    return _fit_columns(fixed, width, RUN_DROPS)


def run_row(run: Mapping[str, Any], columns: Sequence[tuple[str, int, bool]]) -> Text:
    """One run's line: id, name, user, rank, steps, the window's throughput,
    mean and median iteration (ms), phase bar, MFU (%), events dropped."""
    w = run.get("window") or {}
    mfu = run.get("mfu")
    values: dict[str, str | Text] = {
        "RUN": str(run.get("id")),
        "NAME": safe(run.get("name")),
        "USER": safe(run.get("user")),
        "RANK": rank_text(run),
        "STEPS": count_text(run.get("steps")),
        "STEP/S": rate_text(w.get("steps_per_s")),
        "MEAN": ms_text(w.get("mean_ms")),
        "MEDIAN": ms_text(w.get("median_ms")),
        "PHASES": phase_bar(w.get("pct") or {}, PHASE_CELLS),
        "MFU": "-" if mfu is None else f"{100 * mfu:.0f}%",
        "DROP": count_text(run.get("dropped_events")),
    }
    line = _row([(values[h], cw, r) for h, cw, r in columns])
    if run.get("dropped_events") and columns[-1][0] == "DROP":
        line.stylize("yellow", line.cell_len - len(values["DROP"]), line.cell_len)
    return line


def _gpu_columns(width: int) -> list[tuple[str, int, bool]]:
    fixed = [
        ("GPU", 3, True),
        ("NAME", 0, False),
        ("UTIL", 4, True),
        ("MEMORY GiB", 12, True),
        ("POWER W", 9, True),
        ("SM MHz", 6, True),
        ("TEMP", 4, True),
        ("RUN", 12, False),
    ]
    return _fit_columns(fixed, width, GPU_DROPS)


def gpu_row(
    gpu: Mapping[str, Any], columns: Sequence[tuple[str, int, bool]], many_hosts: bool
) -> Text:
    """One GPU's line: index, model (and host, when the GPUs are of several),
    utilization, memory used/total, power/limit, SM clock, temperature, and
    the runs whose rank reported it as its device (``#7 r0``)."""
    name = safe(gpu.get("name"))
    if many_hosts:
        name = f"{safe(gpu.get('host'))} {name}"
    used, total = gpu.get("mem_used_bytes"), gpu.get("mem_total_bytes")
    memory = f"{gib(used)}/{gib(total)}" if total is not None else gib(used)
    power, limit = gpu.get("power_w"), gpu.get("power_limit_w")
    watts = num(power, "{:.0f}") + (f"/{limit:.0f}" if limit is not None else "")
    runs = " ".join(
        f"#{u.get('id')} r{u.get('rank')}" if u.get("rank") is not None else f"#{u.get('id')}"
        for u in gpu.get("runs") or []
    )
    index = gpu.get("index")
    values = {
        "GPU": "-" if index is None else str(index),
        "NAME": name,
        "UTIL": num(gpu.get("util_pct"), "{:.0f}%"),
        "MEMORY GiB": memory,
        "POWER W": watts,
        "SM MHz": num(gpu.get("sm_clock_mhz"), "{:.0f}"),
        "TEMP": num(gpu.get("temp_c"), "{:.0f}C"),
        "RUN": runs or "-",
    }
    line = _row([(values[h], w, r) for h, w, r in columns])
    util = gpu.get("util_pct")
    if util is not None and util < 50 and gpu.get("runs"):  # a run's GPU half idle
        start = columns[0][1] + columns[1][1] + 2
        line.stylize("yellow", start, start + columns[2][1])
    return line


def host_line(
    host: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], width: int, many: bool
) -> Text:
    """``CPU 3.1 of 16 cores busy: runs 2.3 (#3 1.2, #5 1.1), others 0.8``
    (the host's name first when several hosts are shown)."""
    where = f" {safe(host.get('host'))}" if many else ""
    if host.get("cpu_count") is None:
        return Text(fit(f"CPU{where}: no recent host sample", width), style="dim")
    mine = [
        f"#{r.get('id')} {r['cpu_cores']:.1f}"
        for r in runs
        if r.get("cpu_cores") is not None and (not many or r.get("host") == host.get("host"))
    ]
    text = (
        f"CPU{where} {num(host.get('busy_cores'))} of {host['cpu_count']} cores busy: "
        f"runs {num(host.get('run_cores'))}"
        + (f" ({', '.join(mine)})" if mine else "")
        + f", others {num(host.get('other_cores'))}"
    )
    return Text(fit(text, width))


def top_frame(
    node: Mapping[str, Any] | None,
    choices: TopChoices,
    width: int = 80,
    height: int = 24,
    *,
    where: str = "",
    error: str | None = None,
    clock: Callable[[float], str] | None = None,
    keys: bool = True,
) -> Text:
    """The whole frame, at most *height* lines of at most *width* cells:
    a header, the runs sorted as *choices* say (the picked one
    highlighted), each run's top finding, the GPUs, the host's CPU, the
    keys. *where*: the feed's address; *error*: the feed's last error;
    *clock*: formats the message's time (default: local ``HH:MM:SS``);
    *keys*: end with the keys line (not when printed as plain text, where
    no key works)."""
    clock = clock or (lambda t: time.strftime("%H:%M:%S", time.localtime(t)))
    lines: list[Text] = []
    runs = sorted_runs((node or {}).get("runs") or [], choices)
    n = len(runs)
    head = f"gpuprof top · {safe(where)}" if where else "gpuprof top"
    if node is not None:
        head += f" · {n} live run{'' if n == 1 else 's'} · {clock(node.get('t') or 0)}"
    arrow = "▼" if choices.descending else "▲"
    right = f"sort: {SORTS[choices.sort]} {arrow}"
    room = width - len(right) - 1
    header = Text(fit(head, room).ljust(room) + " " + right, style="bold")
    lines.append(header)
    if error:
        lines.append(Text(fit(f"error: {safe(error)}", width), style="red"))
    if node is None:
        lines.append(Text(fit(f"waiting for the live feed of {safe(where)}…", width)))
        return Text("\n").join(lines)
    gpus = node.get("gpus") or []
    hosts = node.get("hosts") or []
    many_hosts = len({h.get("host") for h in hosts}) > 1 or len({g.get("host") for g in gpus}) > 1
    with_finding = [r for r in runs if r.get("top_insight")]
    # what always shows: header(s), the run table's header, a blank, the GPU
    # header, the hosts, the legend and the keys
    fixed = len(lines) + 1 + 1 + (1 if gpus else 0) + len(hosts) + 1 + keys
    # then, as room allows: the runs, two GPUs, the other GPUs, the findings
    room = max(height - fixed, 1)
    run_rows = max(1, min(max(n, 1), room - min(len(gpus), 2)))
    gpu_rows = max(0, min(len(gpus), room - run_rows))
    finding_rows = max(0, min(len(with_finding), room - run_rows - gpu_rows))
    columns = _run_columns(runs, width)
    lines.append(_row([(h, w, r) for h, w, r in columns]).copy())
    lines[-1].stylize("bold")
    picked = picked_run(runs, choices)
    if not runs:
        lines.append(Text(fit("no live runs: they show here as soon as one starts", width)))
    shown, hidden = list(runs), 0
    if n > run_rows:  # the first rows, the picked run among them, and a line saying how many more
        keep = max(run_rows - 1, 1)
        shown = runs[:keep]
        if picked is not None and picked not in shown:
            shown = [*runs[: keep - 1], picked]
        hidden = n - len(shown)
    for r in shown:
        line = run_row(r, columns)
        if r is picked:
            line.stylize("reverse")
        lines.append(line)
    if hidden and run_rows > 1:
        lines.append(Text(fit(f"… {hidden} more runs (↑↓ to pick)", width), style="dim"))
    for r in with_finding[:finding_rows]:
        prefix = f"{str(r.get('id')).rjust(columns[0][1])} "
        lines.append(finding_line(r["top_insight"], width, prefix))
    lines.append(Text())
    if gpus:
        gcols = _gpu_columns(width)
        lines.append(_row([(h, w, r) for h, w, r in gcols]))
        lines[-1].stylize("bold")
        for g in gpus[:gpu_rows]:
            lines.append(gpu_row(g, gcols, many_hosts))
        if len(gpus) > gpu_rows > 1:
            lines[-1] = Text(fit(f"… {len(gpus) - gpu_rows + 1} more GPUs", width), style="dim")
    for h in hosts:
        lines.append(host_line(h, runs, width, many_hosts))
    over = node.get("window_steps") or "few"
    legend = Text(f"ms/it, last {over} steps · ", style="dim")
    legend.append_text(phase_legend())
    legend.truncate(width)
    lines.append(legend)
    if keys:
        lines.append(Text(fit(KEYS_LINE, width), style="dim"))
    return Text("\n").join(lines[:height])
