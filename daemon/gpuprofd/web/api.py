"""``/api/v1``: thin handlers. Each parses its request and calls the read
functions ``gpuprofctl`` uses (:mod:`gpuprofd.views.runs`,
:mod:`gpuprofd.storage.reads`) or the bucketed series reads
(:mod:`gpuprofd.storage.reads.series`); the shapes are in ``docs/dashboard.md``."""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from gpuprof.insights.base import WARMUP_STEPS
from gpuprof.insights.gains import findings_gains_block, ranked
from gpuprofd.storage import reads, unreadable
from gpuprofd.storage.reads import series
from gpuprofd.storage.upkeep import hostrollup, steprollup
from gpuprofd.views import kerneltable
from gpuprofd.views import rollups as rollviews
from gpuprofd.views.compare import load_compare, run_ref
from gpuprofd.views.runs import LIVE_NOTE, list_runs, load_group, phase_means_ms
from gpuprofd.web import runs as views
from gpuprofd.web.responses import ApiError, json_response
from gpuprofd.web.series import (
    DEFAULT_WIDTH,
    MAX_WIDTH,
    MIN_WIDTH,
    NS_PER_S,
    Buckets,
    bucket_as_rollup,
    gpu_series,
    host_series,
    merge_host_buckets,
    merge_step_rollups,
    steps_series,
)
from gpuprofd.web.state import STATE, WebState

STATUSES = ("running", "finished", "failed", "lost")
#: Runs listed when ``limit`` is not given, and the most a client may ask for.
DEFAULT_LIMIT, MAX_LIMIT = 200, 10_000
#: Kernels listed when ``top`` is not given, and the most.
DEFAULT_TOP, MAX_TOP = 20, 500
#: Runs one compare may hold: more do not fit side by side.
MAX_COMPARE = 8
#: Points per run of a compare's step-time curves.
COMPARE_POINTS = 2000
#: The largest id (SQLite's INTEGER PRIMARY KEY is 64-bit signed).
MAX_ID = 2**63 - 1


def _state(request: web.Request) -> WebState:
    return request.app[STATE]


def int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    """Query parameter *name* as an int in [*lo*, *hi*].

    Raises:
        ApiError: 400, not an integer or out of range.
    """
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ApiError(400, f"{name}={raw!r} is not an integer") from None
    if not lo <= value <= hi:
        raise ApiError(400, f"{name}={value} is out of range ({lo}-{hi})")
    return value


#: The latest time a window may name, unix seconds (the year 2096): past it,
#: nanoseconds no longer fit the database's 64-bit integers.
MAX_UNIX_S = 4e9


def float_param(request: web.Request, name: str) -> float | None:
    """Query parameter *name* as a finite float, or None when absent."""
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ApiError(400, f"{name}={raw!r} is not a number (unix seconds)") from None
    if not math.isfinite(value):
        raise ApiError(400, f"{name}={raw!r} is not a finite number")
    return value


def parse_id(text: str, what: str = "run id") -> int:
    """*text* as a positive run id.

    Raises:
        ApiError: 400 otherwise.
    """
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= MAX_ID:
        raise ApiError(400, f"{what} {text!r} is not a positive integer")
    return int(text)


def _run_id(request: web.Request) -> int:
    return parse_id(request.match_info["id"])


def time_param(request: web.Request, name: str) -> int | None:
    """Query parameter *name* as unix seconds, returned as wall ns (None: absent).

    Raises:
        ApiError: 400, not a number or outside 0-:data:`MAX_UNIX_S`.
    """
    value = float_param(request, name)
    if value is not None and not 0 <= value <= MAX_UNIX_S:
        raise ApiError(400, f"{name}={value:g} is not a time in unix seconds (0-{MAX_UNIX_S:g})")
    return None if value is None else int(value * NS_PER_S)


async def runs_list(request: web.Request) -> web.Response:
    status = request.query.get("status") or None
    if status is not None and status not in STATUSES:
        raise ApiError(400, f"status={status!r}: give one of {', '.join(STATUSES)}")
    limit = int_param(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    start, end = time_param(request, "from"), time_param(request, "to")
    if start is not None and end is not None and end < start:
        raise ApiError(400, f"from={start / NS_PER_S:g} is after to={end / NS_PER_S:g}")
    rows = await list_runs(
        _state(request).reader,
        name=request.query.get("name") or None,
        status=status,
        node=request.query.get("node") or None,
        user=request.query.get("user") or None,
        project=request.query.get("project") or None,
        tag=request.query.get("tag") or None,
        from_ns=start,
        to_ns=end,
        limit=limit,
    )
    return json_response({"runs": [views.with_times(r) for r in rows]})


async def nodes_list(request: web.Request) -> web.Response:
    rows = await reads.run_nodes(_state(request).reader)
    nodes = [
        {
            "node": r["node"],
            "host": r["host"],
            "runs": int(r["runs"]),
            "last_start_s": None
            if r["last_start_wall_ns"] is None
            else round(r["last_start_wall_ns"] / NS_PER_S, 3),
        }
        for r in rows
    ]
    return json_response({"nodes": nodes})


async def run_detail(request: web.Request) -> web.Response:
    view, summary = await views.run_view(_state(request), _run_id(request))
    return json_response({"run": view, "summary": summary})


async def insights_payload(
    db: Any, run_id: int, live: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``/runs/{id}/insights``: the stored findings (a running run's: the
    daemon's latest live pass), ranked by gain, each with its ``gain_*``
    fields; ``gains`` (what fixing them all is worth: the summary's, *live*'s
    for a running run, else
    :func:`gpuprof.insights.gains.findings_gains_block` of them); when
    computed; the summary's notes."""
    run = await reads.get_run(db, run_id)
    found = [dict(i) for i in ranked(await reads.stored_insights(db, run_id))]
    at = await reads.insights_computed_ns(db, run_id)
    notes: list[str] = [LIVE_NOTE] if run["status"] == "running" else []
    gains = (live or {}).get("gains") if run["status"] == "running" else None
    if run.get("summary"):
        stored = unreadable.json_cell(run["summary"], "runs.summary", run_id)
        if stored:  # else not a JSON object (counted)
            notes = [n for n in stored.get("notes") or [] if isinstance(n, str)]
            gains = stored.get("gains")
    return {
        "insights": found,
        "gains": gains if isinstance(gains, dict) else findings_gains_block(found),
        "notes": notes,
        "computed_s": None if at is None else at / NS_PER_S,
    }


async def run_insights(request: web.Request) -> web.Response:
    state, run_id = _state(request), _run_id(request)
    return json_response(await insights_payload(state.reader, run_id, state.live_summary(run_id)))


#: The parts of a run's series, in the order a response lists them.
SERIES_PARTS = ("steps", "gpus", "host")


def parts_param(request: web.Request) -> tuple[str, ...]:
    """Query parameter ``parts``: which of :data:`SERIES_PARTS` to read
    (comma-separated; default all), in their order.

    Raises:
        ApiError: 400, a part that is not one of them, or none.
    """
    raw = request.query.get("parts")
    if raw is None:
        return SERIES_PARTS
    asked = {p.strip() for p in raw.split(",") if p.strip()}
    unknown = sorted(asked - set(SERIES_PARTS))
    if unknown or not asked:
        said = ", ".join(map(repr, unknown)) if unknown else "nothing"
        raise ApiError(400, f"parts={raw!r} names {said}: give some of {', '.join(SERIES_PARTS)}")
    return tuple(p for p in SERIES_PARTS if p in asked)


async def run_series(request: web.Request) -> web.Response:
    state = _state(request)
    run_id = _run_id(request)
    width = int_param(request, "width", DEFAULT_WIDTH, MIN_WIDTH, MAX_WIDTH)
    parts = parts_param(request)
    start, end = float_param(request, "from"), float_param(request, "to")
    for name, value in (("from", start), ("to", end)):
        if value is not None and not 0 <= value <= MAX_UNIX_S:
            raise ApiError(
                400, f"{name}={value:g} is not a time in unix seconds (0-{MAX_UNIX_S:g})"
            )
    run = await reads.get_run(state.reader, run_id)
    clock = views.clock_of(run)
    lo, hi = await views.window_of(state, run)
    if start is not None and end is not None and end <= start:
        raise ApiError(400, f"from={start} is not before to={end}")
    # a window reaching past the run reads what the run has (nothing lies outside it)
    lo = max(lo, clock.to_mono(start)) if start is not None else lo
    hi = min(hi, clock.to_mono(end)) if end is not None else hi
    if hi <= lo:
        raise ApiError(400, f"the window from={start} to={end} holds none of the run")
    b = Buckets.for_width(lo, hi, width)
    return json_response(await series_payload(state, run, b, parts))


async def series_payload(
    state: WebState, run: dict[str, Any], b: Buckets, parts: tuple[str, ...] = SERIES_PARTS
) -> dict[str, Any]:
    """``/runs/{id}/series`` of *run* over the buckets *b*: the *parts* asked
    for (:data:`SERIES_PARTS`), each with its tier."""
    db, clock = state.reader, views.clock_of(run)
    out: dict[str, Any] = {
        "window": {"from": clock.to_s(b.lo_ns), "to": clock.to_s(b.hi_ns)},
        "buckets": b.count,
        "tier": {},
    }
    if "steps" in parts:
        step_rows, out["tier"]["steps"] = await step_buckets(db, run["id"], b)
        out["steps"] = steps_series(step_rows, clock)
    if "gpus" in parts:
        gpus, out["tier"]["gpus"] = await gpu_buckets(state, run, b)
        out["gpus"] = gpus
    if "host" in parts:
        host_rows, out["tier"]["host"] = await host_buckets(db, run, b)
        out["host"] = host_series(host_rows, clock)
    return out


async def gpu_buckets(
    state: WebState, run: dict[str, Any], b: Buckets
) -> tuple[list[dict[str, Any]], str]:
    """One ``gpus`` entry per GPU of the run over the buckets *b*, and the
    tier read: the raw samples when the window is narrower than one second
    per bucket and raw rows still cover it, else the per-second rollups."""
    db, clock = state.reader, views.clock_of(run)
    gpus, tier = [], "rollup"
    for gpu in await views.gpus_of(state, run, b.lo_ns, b.hi_ns):
        raw_from = await series.gpu_raw_start(db, gpu.key) if b.span_s < b.count else None
        if raw_from is not None and raw_from <= b.lo_ns:  # narrow, and raw rows cover it
            rows = await series.gpu_raw_buckets(db, gpu.key, b.lo_ns, b.hi_ns, b.width_ns)
            tier = "raw"
        else:
            rows = await series.gpu_rollup_buckets(
                db, gpu.key, run.get("boot_id"), b.lo_ns, b.hi_ns, b.width_ns
            )
        gpus.append(gpu_series(rows, clock, gpu.info))
    return gpus, tier


async def host_buckets(
    db: Any, run: dict[str, Any], b: Buckets
) -> tuple[list[dict[str, Any]], str]:
    """The host's readings over the buckets *b* and the tier they came from:
    with buckets at least one :data:`gpuprofd.storage.upkeep.hostrollup.HOST_BLOCK_NS`
    wide, the run's host rollups with the samples outside the rolled blocks
    (the window's edges, a live run's newest seconds); else the samples."""
    run_id, boot = run["id"], run.get("boot_id")

    def raw(start: int, end: int) -> Any:
        return series.host_buckets(db, run_id, boot, b.lo_ns, b.width_ns, start, end)

    rolled = []
    if b.width_ns >= hostrollup.HOST_BLOCK_NS:
        rolled = await hostrollup.rollup_buckets(db, run_id, b.lo_ns, b.hi_ns, b.width_ns)
    if not rolled:
        return await raw(b.lo_ns, b.hi_ns), "raw"
    first = min(r["first_block"] for r in rolled) * hostrollup.HOST_BLOCK_NS
    end = (max(r["last_block"] for r in rolled) + 1) * hostrollup.HOST_BLOCK_NS
    head = await raw(b.lo_ns, first) if b.lo_ns < first else []
    tail = await raw(end, b.hi_ns) if end < b.hi_ns else []
    return merge_host_buckets(head, rolled, tail), "rollup"


#: Rollup blocks per bucket from which a window reads the step rollup tier
#: (below it, the raw steps: a zoomed window at full resolution).
ROLLUP_BLOCKS_PER_BUCKET = 0.25


async def step_buckets(db: Any, run_id: int, b: Buckets) -> tuple[list[dict[str, Any]], str]:
    """The run's steps in the buckets *b* and the tier they came from: the
    step rollups (one row per :data:`gpuprofd.storage.upkeep.steprollup.STEP_BLOCK`
    steps) with the raw steps after the last rolled block, when the window
    holds enough blocks; else the raw steps."""
    rolled = await steprollup.rollup_rows(db, run_id, b.lo_ns, b.hi_ns)
    if len(rolled) < ROLLUP_BLOCKS_PER_BUCKET * b.count:
        return await series.step_buckets(db, run_id, b.lo_ns, b.hi_ns, b.width_ns), "raw"
    last = max(r["last_step"] for r in rolled)
    since = max(r["t0_ns"] for r in rolled)  # the last block's start: the tail starts later
    tail = await series.step_buckets(
        db, run_id, b.lo_ns, b.hi_ns, b.width_ns, after_step=last, from_ns=since
    )
    return merge_step_rollups([*rolled, *map(bucket_as_rollup, tail)], b), "rollup"


async def run_kernels(request: web.Request) -> web.Response:
    db = _state(request).reader
    run_id = _run_id(request)
    top = int_param(request, "top", DEFAULT_TOP, 1, MAX_TOP)
    run = await reads.get_run(db, run_id)
    windows = await reads.kernel_windows(db, run_id)
    shown = None
    if "evidence" in request.query:  # a finding's evidence window, by its request id
        rid = request.query["evidence"]
        found = [e for e in await reads.evidence_windows(db, run_id) if e["request_id"] == rid]
        wid = found[0]["window_id"] if found else None
        windows = [(w, rows) for w, rows in windows if w["id"] == wid]
        if not windows:
            raise ApiError(404, f"run {run_id} has no evidence window {rid[:64]!r}")
        w, rows = windows[0]
        kind = "kernel" if any(r.kind == "kernel" and r.total_ns > 0 for r in rows) else "op"
        table = kerneltable.build_table(windows, w["source"], kind)
        shown = {"id": w["id"], "source": w["source"], "steps": w["steps"], "kind": kind}
    else:
        table = kerneltable.build_table(windows)
        if not table.lines:  # a CPU-only run's windows: its operators, by self CPU time
            ops = kerneltable.build_table(windows, kind="op")
            table = ops if ops.lines else table
    data = table.to_dict(top)
    kernels = [
        {
            "name": k["name"],
            "cls": k["cls"],
            "kind": table.kind,
            "share": k["share"],
            "ms_per_step": k["per_step_ms"],
            "count": k["count"],
            "mean_us": k["mean_us"],
        }
        for k in (data["kernels"] if table.lines else [])
    ]
    return json_response(
        {
            "kernels": kernels,
            "source": table.source if table.lines else None,
            "windows": table.windows if table.lines else 0,
            "mfu": run.get("mfu"),
            "achieved_tflops": run.get("achieved_tflops"),
            # with ?evidence=REQUEST_ID: that evidence window ({id, source, steps,
            # kind}: op rows when it holds no kernel time, a CPU-only run's)
            "window": shown,
        }
    )


async def compare_pair(request: web.Request) -> dict[str, Any]:
    """``?a=&b=``: run B against run A (:func:`gpuprofd.views.compare.load_compare`),
    each a run id or a run name (its latest run).

    Raises:
        ApiError: 400, a or b missing, or given with ids.
    """
    a, b = request.query.get("a", "").strip(), request.query.get("b", "").strip()
    if "ids" in request.query:
        raise ApiError(400, "give ids= (runs side by side) or a= and b= (B against A), not both")
    if not a or not b:
        raise ApiError(400, "give a= and b=: two runs, each a run id or a run name")
    return await load_compare(_state(request).reader, run_ref(a), run_ref(b))


async def compare(request: web.Request) -> web.Response:
    if "a" in request.query or "b" in request.query:
        return json_response(await compare_pair(request))
    state = _state(request)
    raw = request.query.get("ids") or ""
    ids = [parse_id(part.strip()) for part in raw.split(",") if part.strip()]
    if not 2 <= len(ids) <= MAX_COMPARE:
        raise ApiError(400, f"ids={raw!r}: give 2 to {MAX_COMPARE} run ids, comma-separated")
    runs, curves = [], []
    for run_id in ids:
        view, summary = await views.run_view(state, run_id)
        agg = (await reads.run_overview(state.reader, run_id))["agg"]
        runs.append(
            {
                "run": view,
                "phases_ms": phase_means_ms(agg),
                "insights": summary.get("insights") or [],
            }
        )
        top = await reads.max_step(state.reader, run_id)
        per = max(1, math.ceil(((top or 0) + 1) / COMPARE_POINTS))
        rows = await series.step_index_buckets(state.reader, run_id, per)
        curves.append(
            {
                "id": run_id,
                "step": [r["step"] for r in rows],
                "step_ms": [round(r["iter_mean"] / 1e6, 4) for r in rows],
                "step_ms_min": [round(r["iter_min"] / 1e6, 4) for r in rows],
                "step_ms_max": [round(r["iter_max"] / 1e6, 4) for r in rows],
            }
        )
    return json_response({"runs": runs, "steps": curves})


async def group(request: web.Request) -> web.Response:
    state = _state(request)
    db = state.reader
    data = await load_group(db, request.match_info["group"], state.live_summary)
    ranks = []
    for r in data["ranks"]:
        steps = r["summary"].get("steps") or 0
        skip = WARMUP_STEPS if steps > 2 * WARMUP_STEPS else 0
        worst = await reads.worst_iteration_ns(db, r["run_id"], skip)
        comm = r.get("comm") or {}
        offset = comm.get("clock_offset_ns")
        ranks.append(
            {
                "rank": r["rank"],
                "run_id": r["run_id"],
                "host": r["host"],
                "status": r["status"],
                "median_step_ms": r["median_step_ms"],
                "worst_step_ms": None if worst is None else round(worst / 1e6, 3),
                "comm_ms": comm.get("median_exposed_ms"),
                "grad_bytes": comm.get("bytes_per_step"),
                "clock_offset_ms": None if offset is None else round(offset / 1e6, 3),
            }
        )
    return json_response(
        {
            "group": data["group"],
            "status": data["status"],
            "counts": data["counts"],
            "ranks": ranks,
            "insights": data["insights"],
            "gains": data.get("gains"),
            "missing": data["missing_ranks"],
            "note": data["runs_note"],
            "comm_missing": data["comm_missing"],
        }
    )


async def rollups(request: web.Request) -> web.Response:
    """The team's GPU-hours: ``by`` (user, project, node, run, finding;
    default project), ``since`` (``7d``, ``30d``, ... or unix s; default
    7d), ``until`` (unix s; default now); JSON, or CSV with ``format=csv``
    or ``Accept: text/csv``."""
    by = request.query.get("by") or "project"
    if by not in rollviews.BY_CHOICES:
        raise ApiError(400, f"by={by!r}: give one of {', '.join(rollviews.BY_CHOICES)}")
    until = float_param(request, "until")
    try:
        out = await rollviews.team_rollup(
            _state(request).reader, by, request.query.get("since") or "7d", until
        )
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    fmt = request.query.get("format")
    if fmt == "csv" or (fmt is None and "text/csv" in request.headers.get("Accept", "")):
        return web.Response(
            text=rollviews.to_csv(out),
            content_type="text/csv",
            headers={"Content-Disposition": f'attachment; filename="gpu-hours-by-{by}.csv"'},
        )
    return json_response(out)


def add_routes(app: web.Application) -> None:
    """Mount every ``/api/v1`` JSON endpoint on *app*."""
    r = app.router
    r.add_get("/api/v1/runs", runs_list)
    r.add_get("/api/v1/nodes", nodes_list)
    r.add_get("/api/v1/runs/{id}", run_detail)
    r.add_get("/api/v1/runs/{id}/insights", run_insights)
    r.add_get("/api/v1/runs/{id}/series", run_series)
    r.add_get("/api/v1/runs/{id}/kernels", run_kernels)
    r.add_get("/api/v1/compare", compare)
    r.add_get("/api/v1/groups/{group}", group)
    r.add_get("/api/v1/rollups", rollups)
