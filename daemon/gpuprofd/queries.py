"""Read queries shared by the daemon (aiosqlite) and gpuprofctl (sqlite3),
with the converters from rows to the shapes :func:`build_context` reads.
Pure: no connection here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

#: How many earlier finished runs of the same name the regression rule sees.
HISTORY_RUNS = 3

STEPS_SQL = (
    "SELECT t0_ns, t1_ns, wait_ns, explicit, micro, phases, skipped, eval_ns, optimizers "
    "FROM steps "
    "WHERE run_id = ? ORDER BY t0_ns"
)
HOST_SQL = (
    "SELECT mono_ns, cpu_pct, cpu_count, disk_read_bps FROM host_samples "
    "WHERE mono_ns BETWEEN ? AND ? ORDER BY mono_ns"
)
RUN_CPU_SQL = "SELECT mono_ns, cores FROM run_cpu_samples WHERE run_id = ? ORDER BY mono_ns"
HISTORY_SQL = (
    "SELECT median_step_ms FROM runs WHERE run_name = ? AND id < ? AND status = 'finished' "
    "AND median_step_ms IS NOT NULL ORDER BY id DESC LIMIT ?"
)
INSIGHTS_SQL = (
    "SELECT rule, severity, title, detail, fix, evidence FROM insights WHERE run_id = ? "
    "ORDER BY rowid"
)


def step_from_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """A ``steps`` row as :func:`gpuprof.insights.build_context` reads it."""
    return {
        "t0": r["t0_ns"], "t1": r["t1_ns"], "wait": r["wait_ns"],
        "explicit": bool(r["explicit"]), "micro": r["micro"],
        "phases": orjson.loads(r["phases"]) if r["phases"] else {},
        "skipped": bool(r["skipped"]), "eval": r["eval_ns"] or 0,
        "optimizers": orjson.loads(r["optimizers"]) if r["optimizers"] else [],
    }  # fmt: skip


def run_from_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """A ``runs`` row as a dict with ``options`` parsed."""
    run = dict(r)
    run["options"] = orjson.loads(run["options"]) if run.get("options") else {}
    return run


def insight_from_row(r: Mapping[str, Any]) -> dict[str, Any]:
    """An ``insights`` row as ``Insight.to_dict()`` returns it."""
    d = {k: r[k] for k in ("rule", "severity", "title", "detail", "fix")}
    d["evidence"] = orjson.loads(r["evidence"]) if r["evidence"] else {}
    return d
