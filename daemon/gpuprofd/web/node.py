"""The live feed's node view (``{"node": true}``): every running run's last
window, the GPUs and which run's rank uses each, and the host's CPU split,
as one ``node`` message about once a second (``gpuprofctl top`` reads it;
shapes in ``docs/dashboard.md``).

Each message is a snapshot bounded by the runs (at most :data:`MAX_RUNS`),
never by their length: per run, a count of the steps since the last look
and its last :data:`WINDOW_STEPS` steps (kept between looks, only the new
ones read) by the ``(run_id, step)`` index; the newest per-second rollup of
each GPU and the newest host sample, each found by an index read backwards.
The run list, findings and counters are read again every
``insights_poll_s``. The figures are computed by the pure functions below.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpuprof.insights.base import SEVERITIES
from gpuprof.window import window_figures
from gpuprofd.sampling.nvml import normalize_uuid
from gpuprofd.storage import reads
from gpuprofd.storage.reads import series
from gpuprofd.web import runs as views
from gpuprofd.web.series import NS_PER_MS, NS_PER_S, RunClock
from gpuprofd.web.state import WebState

#: Steps a run's window holds: its iteration time, throughput and phase split
#: are over these (at most; fewer early in a run).
WINDOW_STEPS = 100
#: Running runs one message lists at most (newest first): more do not fit a terminal.
MAX_RUNS = 32
#: A ``node`` message is handed to every socket that asks within this, seconds
#: (each asks every second; the live view's refresh).
REUSE_S = 0.5
#: A reading older than this before now (a node) or before its runs' newest
#: step (a team server, which has no clock of the node) is not shown, seconds.
FRESH_S = 10.0


def window_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A run's last steps (:func:`gpuprofd.storage.reads.series.steps_after` rows,
    ns) as a ``node`` run's ``window``: :func:`gpuprof.window.window_figures`
    with the iteration's ``mean_ms`` / ``median_ms``, ``steps_per_s`` to
    0.001 and the phase shares ``pct`` to 0.1 %."""
    figs = window_figures([{**r, "eval": r.get("eval_ns")} for r in rows], unit_s=1e-9)

    def rounded(v: float | None, nd: int) -> float | None:
        return None if v is None else round(v, nd)

    return {
        "steps": figs["steps"],
        "mean_ms": rounded(figs["mean"] and figs["mean"] / NS_PER_MS, 3),
        "median_ms": rounded(figs["median"] and figs["median"] / NS_PER_MS, 3),
        "steps_per_s": rounded(figs["steps_per_s"], 3),
        "pct": {p: rounded(v, 1) for p, v in figs["pct"].items()},
        "eval": figs["eval"],
        "skipped": figs["skipped"],
        "traced": figs["traced"],
    }


def top_insight(found: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The finding to show first: the most severe (``HIGH``, ``MED``,
    ``LOW``), the first found among equals (the rules' own order); None
    without findings."""
    if not found:
        return None
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    best = min(range(len(found)), key=lambda i: (rank.get(found[i].get("severity"), 99), i))
    return dict(found[best])


def gpu_reading(row: Mapping[str, Any] | None, clock: RunClock) -> dict[str, Any]:
    """A per-second rollup (:func:`gpuprofd.storage.reads.series.latest_gpu`) as a
    ``node`` GPU's readings: ``t`` (unix s, the second's start),
    ``util_pct``, ``mem_used_bytes``, ``power_w``, ``temp_c``,
    ``sm_clock_mhz``; each None when *row* is (nothing fresh)."""
    if row is None:
        return dict.fromkeys(
            ("t", "util_pct", "mem_used_bytes", "power_w", "temp_c", "sm_clock_mhz")
        )

    def num(v: Any, scale: float = 1.0, nd: int = 1) -> float | None:
        return None if v is None else round(float(v) * scale, nd)

    return {
        "t": round(clock.to_s(row["sec_ns"]), 3),
        "util_pct": num(row["util_mean"]),
        "mem_used_bytes": None if row["mem_used_max"] is None else int(row["mem_used_max"]),
        "power_w": num(row["power_mean_mw"], 1e-3),
        "temp_c": num(row["temp_max_c"], nd=0),
        "sm_clock_mhz": num(row["sm_mean_mhz"], nd=0),
    }


def host_split(
    sample: Mapping[str, Any] | None, run_cores: Mapping[int, float], clock: RunClock
) -> dict[str, Any]:
    """A host sample (:func:`gpuprofd.storage.reads.series.latest_host`) split
    between the runs and the rest: ``cpu_count``, ``busy_cores`` (the
    machine's), ``run_cores`` (the listed runs' process trees, summed),
    ``other_cores`` (busy less the runs', never below 0), ``t`` (unix s);
    each None without a sample."""
    keys = ("t", "cpu_count", "busy_cores", "run_cores", "other_cores")
    if sample is None or sample.get("cpu_pct") is None or not sample.get("cpu_count"):
        return dict.fromkeys(keys)
    busy = float(sample["cpu_pct"]) * int(sample["cpu_count"]) / 100.0
    runs = sum(run_cores.values())
    return {
        "t": round(clock.to_s(sample["mono_ns"]), 3),
        "cpu_count": int(sample["cpu_count"]),
        "busy_cores": round(busy, 2),
        "run_cores": round(runs, 2),
        "other_cores": round(max(busy - runs, 0.0), 2),
    }


@dataclass
class _RunFeed:
    """What the node view keeps of one running run between looks."""

    run: dict[str, Any]
    count: int = 0
    top: int = -1
    """The highest step index counted (the next count starts above it)."""
    window: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=WINDOW_STEPS))
    insights: list[dict[str, Any]] = field(default_factory=list)
    mfu: float | None = None

    async def look(self, db: Any) -> None:
        """Count the steps stored since the last look and read the new ones
        into the window (only its last :data:`WINDOW_STEPS` when more came)."""
        n, top = await series.steps_since(db, self.run["id"], self.top)
        if not n or top is None:
            return
        self.count += n
        self.top = top
        last = self.window[-1]["step"] if self.window else -1
        rows = await series.steps_after(db, self.run["id"], last, WINDOW_STEPS + 1)
        if len(rows) > WINDOW_STEPS:
            self.window.clear()
            rows = await series.steps_last(db, self.run["id"], WINDOW_STEPS)
        self.window.extend(rows)


class NodeFeed:
    """The app's node view, shared by every socket that follows it:
    :meth:`message` builds a ``node`` message, or hands out the one built
    less than :data:`REUSE_S` ago (ten viewers cost about what one does)."""

    def __init__(self, state: WebState) -> None:
        self.state = state
        self._runs: dict[int, _RunFeed] = {}
        self._next_slow = 0.0
        self._lock = asyncio.Lock()
        self._last: tuple[float, dict[str, Any]] | None = None

    async def message(self) -> dict[str, Any]:
        """The ``node`` message: runs, GPUs, hosts (module doc); one built by
        then for another socket when it is fresh enough."""
        async with self._lock:  # sockets waking together: one builds, the rest reuse it
            now = time.monotonic()
            if self._last is not None and now - self._last[0] < REUSE_S:
                return self._last[1]
            msg = await self._build()
            self._last = (time.monotonic(), msg)
            return msg

    async def _slow(self) -> None:
        """The running runs (newest first, at most :data:`MAX_RUNS`), their
        findings, counters and MFU (the daemon's latest live pass)."""
        db = self.state.reader
        running = (await reads.runs_with_status(db, "running"))[-MAX_RUNS:][::-1]
        kept = {}
        for run in running:
            feed = self._runs.get(run["id"]) or _RunFeed(run)
            feed.run = run
            feed.insights = await reads.stored_insights(db, run["id"])
            live = self.state.live_summary(run["id"]) or {}
            feed.mfu = run.get("mfu") if run.get("mfu") is not None else live.get("mfu")
            kept[run["id"]] = feed
        self._runs = kept

    def _clock(self, boot: str | None, runs: list[_RunFeed]) -> tuple[RunClock, int]:
        """Boot *boot*'s clock (unix from monotonic ns) and "now" on it: this
        node's own clock, or on a team server (or another boot) a run's
        anchor and its newest step's start."""
        state = self.state
        if state.now_mono_ns is not None and (boot == state.boot_id or not runs):
            mono = state.now_mono_ns()
            return RunClock(time.time_ns(), mono), mono
        clock = views.clock_of(runs[0].run)
        newest = [f.window[-1]["t0_ns"] for f in runs if f.window]
        return clock, max(newest) if newest else runs[0].run.get("start_mono_ns") or 0

    async def _build(self) -> dict[str, Any]:
        db, state = self.state.reader, self.state
        now = time.monotonic()
        if now >= self._next_slow:
            self._next_slow = now + state.insights_poll_s
            await self._slow()
        feeds = list(self._runs.values())
        for f in feeds:
            await f.look(db)
        by_boot: dict[str | None, list[_RunFeed]] = {}
        for f in feeds:
            by_boot.setdefault(f.run.get("boot_id"), []).append(f)
        if state.devices and state.boot_id not in by_boot:
            by_boot[state.boot_id] = []  # this node's GPUs and host with no run
        cores: dict[int, float] = {}
        hosts, gpus = [], []
        for boot, on_boot in by_boot.items():
            clock, mono = self._clock(boot, on_boot)
            lo = mono - int(FRESH_S * NS_PER_S)
            sample = await series.latest_host(db, boot, lo, mono + NS_PER_S)
            ids = [f.run["id"] for f in on_boot]
            at = await series.run_cores_at(db, ids, sample["mono_ns"]) if sample else {}
            cores.update(at)
            host = on_boot[0].run.get("host") if on_boot else None
            hosts.append({"host": host, **host_split(sample, at, clock)})
            gpus.extend(await self._gpus(boot, on_boot, clock, lo))
        return {
            "type": "node",
            "t": round(time.time(), 3),
            "window_steps": WINDOW_STEPS,
            "runs": [run_entry(f, cores.get(f.run["id"])) for f in feeds],
            "gpus": gpus,
            "hosts": hosts,
        }

    async def _gpus(
        self, boot: str | None, runs: list[_RunFeed], clock: RunClock, lo: int
    ) -> list[dict[str, Any]]:
        """The GPUs of boot *boot*: this node's devices (all of them), or on a
        team server the devices its runs reported; each with its newest
        reading and the runs (id, rank) that reported it as their device."""
        state = self.state
        users: dict[str, list[dict[str, Any]]] = {}
        for f in runs:
            want = normalize_uuid((f.run.get("cuda_uuid") or "").strip() or None)
            if want is not None:
                users.setdefault(want, []).append({"id": f.run["id"], "rank": f.run.get("rank")})
        known: list[tuple[str, dict[str, Any], Iterable[str]]] = []
        if state.devices and boot == state.boot_id:
            for d in state.devices:
                key = normalize_uuid(d.uuid) or d.uuid
                slices = [normalize_uuid(m) or m for m in d.mig_uuids]
                limit = d.power_limit_mw / 1e3 if d.power_limit_mw is not None else None
                info = {"index": d.index, "uuid": d.uuid, "name": d.name, "power_limit_w": limit}
                known.append((key, info, [key, *slices]))
        else:
            models = {}
            for f in runs:
                want = normalize_uuid((f.run.get("cuda_uuid") or "").strip() or None)
                if want is not None:
                    models[want] = f.run
            for key, run in sorted(models.items()):
                info = {
                    "index": None,
                    "uuid": run.get("cuda_uuid"),
                    "name": run.get("gpu_model"),
                    "power_limit_w": None,
                }
                known.append((key, info, [key]))
        host = runs[0].run.get("host") if runs else None
        out = []
        for key, info, keys in known:
            row = await series.latest_gpu(state.reader, key, boot, lo)
            total = row.get("mem_total_bytes") if row else None
            if total is None:
                total = await series.gpu_mem_total(state.reader, key)
            used_by = [u for k in keys for u in users.get(k, [])]
            out.append(
                {
                    **info,
                    "host": host,
                    **gpu_reading(row, clock),
                    "mem_total_bytes": total,
                    "runs": sorted(used_by, key=lambda u: u["id"]),
                }
            )
        return out


def run_entry(feed: _RunFeed, cpu_cores: float | None) -> dict[str, Any]:
    """One ``node`` run: who and where, its steps, the window's figures
    (:func:`window_stats`), MFU (0-1, None: unknown), events dropped (not
    sent plus not stored), its CPU (cores), its GPU, its top finding."""
    run = feed.run
    clock = views.clock_of(run)
    cuda = (run.get("cuda_uuid") or "").strip()
    return {
        "id": run["id"],
        "name": run["run_name"],
        "user": run.get("user_name"),
        "host": run.get("host"),
        "group": run.get("group_id"),
        "rank": run.get("rank"),
        "local_rank": run.get("local_rank"),
        "world_size": run.get("world_size"),
        "status": run["status"],
        "start_s": None if run.get("start_wall_ns") is None else run["start_wall_ns"] / NS_PER_S,
        "steps": feed.count,
        "last_step_s": round(clock.to_s(feed.window[-1]["t0_ns"]), 3) if feed.window else None,
        "window": window_stats(list(feed.window)),
        "mfu": feed.mfu,
        "dropped_events": (run.get("dropped_events") or 0) + (run.get("store_dropped_events") or 0),
        "cpu_cores": None if cpu_cores is None else round(cpu_cores, 2),
        "gpu_uuid": cuda or None,
        "insights": len(feed.insights),
        "top_insight": top_insight(feed.insights),
    }


#: The app's :class:`NodeFeed` (made with the app: :func:`gpuprofd.web.app.build_app`).
NODE_FEED = web.AppKey("node_feed", NodeFeed)
