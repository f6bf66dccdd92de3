"""``gpuprofctl compare [DB] A B``: run B against run A, ending in one sentence."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import click

from gpuprof.compare import times
from gpuprof.stats import MIN_STEPS
from gpuprof.text import clean_text
from gpuprofd.commands.common import (
    DbOrUrl,
    echo_json,
    format_option,
    read_with,
    resolve_target,
    storage_url_option,
)
from gpuprofd.views.compare import load_compare, run_ref

#: Characters of a run name, and of a finding's title, in the text output.
NAME_CHARS, TITLE_CHARS = 40, 110


def _cell(v: float | None, fmt: str = "{:.1f}", unit: str = "") -> str:
    return "-" if v is None else fmt.format(v) + unit


def _signed(v: float | None, unit: str) -> str:
    return "" if v is None else f"{v or 0.0:+.1f}{unit}"  # -0.0 said +0.0


def _rows(table: list[tuple[str, ...]]) -> list[str]:
    """*table* aligned: the first column left, the others right."""
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in table
    ]


def _headline(data: Mapping[str, Any]) -> list[str]:
    a, b = data["a"], data["b"]
    unit = data["basis"]["unit"]

    def line(label: str, key: str, fmt: str = "{:.1f}", unit: str = "") -> tuple[str, ...]:
        va, vb = a.get(key), b.get(key)
        change = ""
        if va and vb is not None:
            change = f"{100 * (vb / va - 1):+.0f} %"
        return (label, _cell(va, fmt, unit), _cell(vb, fmt, unit), change)

    table = [
        ("", "A", "B", "B vs A"),
        line("mean iteration", "mean_iteration_ms", unit=" ms"),
        line("median iteration", "median_iteration_ms", unit=" ms"),
        line("steps/s", "steps_per_s", "{:.2f}"),
    ]
    if unit != "iteration":
        table.append(line(f"{unit}s/s", "units_per_s", "{:,.0f}"))
    mfu = [None if r["mfu"] is None else 100 * r["mfu"] for r in (a, b)]
    table.append(("MFU", _cell(mfu[0], unit=" %"), _cell(mfu[1], unit=" %"), ""))
    table.append(line("TFLOP/s per GPU", "achieved_tflops"))
    table.append(
        (
            "shape",
            f"{a['world_size']} rank(s) × {a['micro_batches_per_step']:g} micro",
            f"{b['world_size']} rank(s) × {b['micro_batches_per_step']:g} micro",
            "",
        )
    )
    return _rows(table)


def _phases(data: Mapping[str, Any]) -> list[str]:
    table = [("phase (per iteration)", "A", "", "B", "", "B - A")]
    for p in data["phases"]:
        if p["a_pct"] is None and p["b_pct"] is None:
            continue
        change = _signed(p["delta_pct"], " pp")
        if p["delta_ms"] is not None:
            change = f"{p['delta_ms']:+.2f} ms  {change}"
        table.append(
            (
                p["label"],
                _cell(p["a_ms"], "{:.2f}", " ms"),
                _cell(p["a_pct"], unit=" %"),
                _cell(p["b_ms"], "{:.2f}", " ms"),
                _cell(p["b_pct"], unit=" %"),
                change,
            )
        )
    return _rows(table)


def _predicted(gain: Mapping[str, Any] | None) -> str:
    """`` (predicted: up to 2.3× faster)`` from a finding's gain, when it has one."""
    x = (gain or {}).get("gain_speedup_max")
    return f" (predicted: up to {times(x)} faster)" if isinstance(x, int | float) else ""


def _findings(data: Mapping[str, Any]) -> list[str]:
    changes = data["findings"]
    lines = []

    def title(e: Mapping[str, Any], side: str) -> str:
        text = clean_text(e.get(f"title_{side}") or "", 10_000)
        return text if len(text) <= TITLE_CHARS else text[: TITLE_CHARS - 1] + "…"

    for e in changes["resolved"]:
        label = clean_text(e["label"], 60)
        lines.append(f"  resolved   [{e['severity_a']}] {label}{_predicted(e['gain_a'])}")
        lines.append(f"             was: {title(e, 'a')}")
    for e in changes["new"]:
        lines.append(f"  new        [{e['severity_b']}] {clean_text(e['label'], 60)}")
        lines.append(f"             {title(e, 'b')}")
    for e in changes["changed"]:
        sev = f"[{e['severity_a']} → {e['severity_b']}]"
        lines.append(f"  changed    {sev} {clean_text(e['label'], 60)}")
        lines.append(f"             A: {title(e, 'a')}")
        lines.append(f"             B: {title(e, 'b')}")
    for e in changes["unchanged"]:
        lines.append(f"  unchanged  [{e['severity_b']}] {clean_text(e['label'], 60)}")
        if title(e, "a") != title(e, "b"):  # the same severity, other figures: both said
            lines.append(f"             A: {title(e, 'a')}")
        lines.append(f"             B: {title(e, 'b')}")
    # runs of different names: each judged against its own name's earlier
    # runs; a run too short for the rules: the other's findings not looked for
    unjudged = _unjudged_why(data)
    for kind in ("history", "unjudged"):
        for e in changes.get(kind, ()):
            for side in ("a", "b"):
                if f"severity_{side}" in e:
                    who, label = side.upper(), clean_text(e["label"], 60)
                    why = f"against {who}'s own earlier runs" if kind == "history" else unjudged
                    lines.append(f"  {who} only     [{e[f'severity_{side}']}] {label} ({why})")
                    lines.append(f"             {title(e, side)}")
    return lines or ["  none in either run"]


def _unjudged_why(data: Mapping[str, Any]) -> str:
    """Why a finding of one run only is not called resolved or new: a run too
    short for the rules, else a running run gpuprofd has not judged yet."""
    steps = [data[s]["steady_steps"] for s in ("a", "b")]
    if min(steps) < MIN_STEPS:
        return f"too few steady steps to judge: {steps[0]} and {steps[1]}"
    running = [s.upper() for s in ("a", "b") if data[s]["status"] == "running"]
    return f"{' and '.join(running) or 'a run'} running, not judged yet"


def format_compare(data: Mapping[str, Any]) -> str:
    """The comparison as text: which runs are A and B, their headline side
    by side, the phase split, the findings resolved / new / changed /
    unchanged, and the verdict."""
    lines = []
    for side in ("a", "b"):
        r = data[side]
        name = clean_text(r["run_name"], NAME_CHARS)
        lines.append(
            f"{side.upper()}: run {r['run_id']}  {name}  ({r['status']}, {r['steps']} steps)"
        )
    basis = data["basis"]
    if basis["note"]:
        lines.append(f"Note: {clean_text(basis['note'], 400)}")
    lines += ["", *_headline(data), "", *_phases(data), "", "Findings:", *_findings(data), ""]
    lines.append(clean_text(data["verdict"], 1000))
    return "\n".join(lines)


@click.command("compare", short_help="Run B against run A: speed-up, phases, findings.")
@click.argument("args", nargs=-1, metavar="[DB] A B")
@storage_url_option
@format_option
def compare_cmd(args: tuple[str, ...], storage_url: str | None, fmt: str) -> None:
    """Compare run B with run A: their speed (B's speed-up with a 95 %
    confidence interval, or "within noise"), phase split and findings
    (resolved, new, changed), ending in one sentence.

    \b
    Example:
      gpuprofctl compare 1 2        # run 2 (B) against run 1 (A) in ./gpuprof.db

    A and B are run ids (gpuprofctl runs lists them) or run names, each
    meaning the latest run of that name (gpuprofctl compare gpuprof.db
    digits-mlp digits-mlp-noaug). DB defaults to GPUPROF_DB or
    ./gpuprof.db; --storage-url URL reads sqlite:///path.db or
    postgres://user@host/db instead. Runs of different shapes (world
    size, micro-batches, declared samples or tokens per step) are compared
    per sample, token or micro-batch, and the output says which.

    Every field of --format json: docs/gpuprofctl.md.
    """
    if len(args) == 2:
        db, refs = None, args
    elif len(args) == 3:
        db, refs = DbOrUrl().convert(args[0], None, None), args[1:]
    else:
        raise click.UsageError(f"give [DB] A B: two runs to compare, got {len(args)} argument(s)")
    ref_a, ref_b = run_ref(refs[0]), run_ref(refs[1])
    target = resolve_target(db, storage_url)
    data = read_with(target, lambda reader: load_compare(reader, ref_a, ref_b))
    if fmt == "json":
        echo_json(data)
    else:
        click.echo(format_compare(data))
