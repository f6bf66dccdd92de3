// #/run/<id>: one run, live while it runs. The insights first, then the step
// time breakdown, one row per GPU, the host, top kernels. A window selector
// (last 5 min, 1 h, whole run, or a range dragged on any chart) re-fetches
// /series for that window at full resolution.

import { api } from "../api.js";
import { destroyCharts, newSyncKey } from "../charts.js";
import { h, replace, userText } from "../dom.js";
import { duration, int, ms, num, ratioPct, when, clock, DASH } from "../format.js";
import { live } from "../live.js";
import { errorBox, figure, insightList, statusBadge } from "./panels.js";
import { buildRunCharts, PHASES } from "./run_charts.js";

/** Live points appended since the last fetch before the window is re-fetched
 * (re-reduced on the server), so a page left open stays a few thousand points. */
const REFETCH_AFTER = 2000;
const WINDOWS = [
  ["5m", "Last 5 min", 300],
  ["1h", "Last 1 h", 3600],
  ["whole", "Whole run", null],
];

/** "steps raw, gpus rollup, host raw" from the series' tier (a word or one per part). */
function tierText(tier) {
  if (!tier || typeof tier !== "object") return String(tier ?? "");
  return Object.entries(tier).map(([k, v]) => `${k} ${v}`).join(", ");
}

const last = (xs) => (xs && xs.length ? xs[xs.length - 1] : null);

/** The cursors a /series response leaves the page at: its last step, and the
 * oldest of its streams' last samples (each stream's repeats are dropped). */
export function cursorsOf(model) {
  const s = model.steps;
  const i = s.t.length - 1;
  const step = i >= 0 ? s.first_step[i] + s.n[i] - 1 : -1;
  const ends = [...(model.gpus || []).map((g) => last(g.t)), last(model.host?.t)].filter(
    (t) => t !== null && t !== undefined,
  );
  return { step, t: ends.length ? Math.min(...ends) : 0 };
}

function pushStat(stat, v) {
  if (Array.isArray(stat)) stat.push(v);
  else if (stat) for (const k of ["min", "mean", "max"]) stat[k].push(v);
}

export function render(root, { id }) {
  const state = {
    id,
    run: null,
    model: null,
    charts: null,
    window: { kind: "whole" },
    latest: 0,
    appended: 0,
    fetching: false,
    gone: false,
    loads: 0, // series fetches begun: a response to an older one is dropped
  };
  const head = h("header", { class: "run-head", id: "run-head" }, h("p", { class: "muted" }, "Loading run…"));
  const insights = h("section", { class: "panel", id: "insights" }, h("h2", {}, "Insights"));
  const windowBar = h("div", { class: "window-bar", id: "window" });
  const chartsBox = h("div", { class: "charts", id: "charts" });
  const kernels = h("section", { class: "panel", id: "kernels" }, h("h2", {}, "Top kernels"));
  replace(root, head, insights, windowBar, chartsBox, kernels);

  // -- headline
  function drawHead() {
    const r = state.run;
    document.title = `${r.name ?? r.run_name} · gpuprof`;
    const where = [r.host, r.world_size > 1 ? `rank ${r.rank} of ${r.world_size}` : null]
      .filter(Boolean).join(" · ");
    const dur = (r.end_s ?? Date.now() / 1000) - r.start_s;
    replace(
      head,
      h("div", { class: "crumbs" }, h("a", { href: "#/runs" }, "Runs"), " / ", `run ${r.id}`),
      h("h1", { class: "run-name" }, userText(r.name ?? r.run_name), " ", statusBadge(r.status)),
      h("div", { class: "meta muted" },
        userText(where), r.group ? [" · group ", h("a", { href: `#/group/${encodeURIComponent(r.group)}` }, userText(r.group))] : null,
        ` · started ${when(r.start_s)} · ${duration(dur)}`),
      r.error ? h("div", { class: "error" }, "Ended by: ", userText(r.error)) : null,
      h("div", { class: "figures" },
        h("div", { class: "figure", id: "run-steps", "data-steps": r.steps ?? 0 },
          h("div", { class: "fig-label" }, "steps"), h("div", { class: "fig-value" }, int(r.steps))),
        figure("median step", ms(r.median_step_ms)),
        figure("steps/s", num(r.steps_per_s, 2)),
        figure("MFU", r.mfu === null || r.mfu === undefined ? DASH : ratioPct(r.mfu)),
        figure("achieved", r.achieved_tflops ? `${num(r.achieved_tflops, 1)} TFLOP/s` : DASH),
        figure("dropped events", int(r.dropped_events ?? 0)),
        h("div", { class: "figure live-state" }, h("div", { class: "fig-label" }, "live"),
          h("div", { class: "fig-value", id: "live-state" }, r.status === "running" ? live.state : "ended")),
      ),
    );
  }

  function setSteps(n) {
    const el = head.querySelector("#run-steps");
    if (!el || n <= Number(el.dataset.steps)) return;
    el.dataset.steps = n;
    el.querySelector(".fig-value").textContent = int(n);
  }

  // -- insights, with the notes of what the daemon could not read of the run
  // (any answer's `unreadable`: damaged values, said once each)
  const unreadable = new Set();
  let lastInsights = null;
  function drawInsights(list, notes, gains = null) {
    lastInsights = [list, notes, gains];
    const all = [...(notes || []), ...unreadable];
    replace(insights, h("h2", {}, "Insights"), insightList(list, all, undefined, gains));
  }
  function said(answer) {
    const before = unreadable.size;
    for (const n of answer?.unreadable || []) unreadable.add(n);
    if (unreadable.size > before && lastInsights && !state.gone) drawInsights(...lastInsights);
    return answer;
  }

  // -- window selector
  function drawWindowBar() {
    const w = state.window;
    const m = state.model;
    replace(
      windowBar,
      h("span", { class: "muted" }, "Window:"),
      WINDOWS.map(([key, label]) =>
        h("button", {
          type: "button",
          "data-window": key,
          "aria-pressed": w.kind === key ? "true" : "false",
          onclick: () => setWindow({ kind: key }),
        }, label)),
      w.kind === "range"
        ? h("span", { class: "range", "data-window": "range", "aria-pressed": "true" },
          `${clock(w.from)} – ${clock(w.to)}`)
        : h("span", { class: "muted hint" }, "drag across a chart to zoom"),
      m ? h("span", { class: "muted small tier" }, `${tierText(m.tier)} · ${int(m.buckets)} buckets`) : null,
    );
  }

  function windowParams() {
    const w = state.window;
    const width = Math.min(4000, Math.max(200, Math.round(chartsBox.clientWidth || 1000)));
    if (w.kind === "range") return { from: w.from, to: w.to, width };
    const secs = WINDOWS.find(([k]) => k === w.kind)?.[2];
    if (!secs) return { width };
    const end = state.run?.end_s ?? Math.max(state.latest, Date.now() / 1000);
    return { from: Math.max(state.run?.start_s ?? 0, end - secs), to: end, width };
  }

  function xRange(lo, hi) {
    const w = state.window;
    if (w.kind === "range") return [w.from, w.to];
    const win = state.model.window;
    const to = Math.max(win.to ?? hi, state.latest);
    const secs = WINDOWS.find(([k]) => k === w.kind)?.[2];
    const from = secs ? Math.max(to - secs, state.run?.start_s ?? to - secs) : (win.from ?? lo);
    return from < to ? [from, to] : [lo, hi];
  }

  function setWindow(w) {
    state.window = w;
    drawWindowBar();
    loadSeries();
  }

  function following() {
    return state.run?.status === "running" && state.window.kind !== "range";
  }

  /** Fetch the window's series and redraw, the step chart first (the
   * cheapest read: step rollups), then the GPUs and the host over the same
   * window; `onSteps()` once the step chart is drawn (or could not be).
   * Returns the cursors it leaves (null when another fetch superseded it). */
  async function loadSeries(fromReset = false, onSteps = () => {}) {
    state.fetching = true;
    const params = windowParams();
    const load = ++state.loads;
    let model;
    try {
      model = said(await api.series(id, { ...params, parts: "steps" }));
    } catch (err) {
      if (!state.gone && load === state.loads) {
        replace(chartsBox, errorBox(err));
        state.fetching = false;
      }
      onSteps();
      return null;
    }
    if (state.gone) return null;
    if (load !== state.loads) { // a newer window was asked for meanwhile: its answer draws
      document.body.dataset.seriesStale = String(Number(document.body.dataset.seriesStale || 0) + 1);
      onSteps();
      return null;
    }
    state.model = model;
    state.appended = 0;
    state.latest = Math.max(0, last(model.steps.t) ?? 0);
    destroyCharts();
    chartsBox.replaceChildren();
    const charts = buildRunCharts(chartsBox, model, {
      syncKey: newSyncKey(),
      onSelect: (from, to) => setWindow({ kind: "range", from, to }),
      xRange,
    });
    state.charts = charts;
    drawWindowBar();
    if (!performance.getEntriesByName("gpuprof:first-chart").length) performance.mark("gpuprof:first-chart");
    onSteps();
    // the same window's GPUs and host (its end fixed: a running run's moves on)
    let rest;
    try {
      rest = said(await api.series(id, { from: model.window.from, to: model.window.to, width: params.width, parts: "gpus,host" }));
    } catch (err) {
      if (state.model === model && !state.gone) {
        for (const part of ["gpus", "host"]) charts.failed(part, errorBox(err));
        state.fetching = false;
      }
      return null;
    }
    if (state.gone || state.model !== model) return null; // a newer fetch owns the page
    model.gpus = rest.gpus;
    model.host = rest.host;
    model.tier = { ...model.tier, ...rest.tier };
    charts.fill(model);
    if (!performance.getEntriesByName("gpuprof:all-charts").length) performance.mark("gpuprof:all-charts");
    state.fetching = false;
    const ends = [...(model.gpus || []).map((g) => last(g.t)), last(model.host?.t)];
    state.latest = Math.max(state.latest, ...ends.filter((t) => t !== null && t !== undefined));
    drawWindowBar();
    document.body.dataset.seriesLoaded = String(Number(document.body.dataset.seriesLoaded || 0) + 1);
    const cursors = cursorsOf(model);
    if (following() && !fromReset) {
      if (live.run === id) {
        live.setCursors(cursors);
        live.hello();
      } else {
        live.watch(id, cursors, handlers);
      }
    }
    return cursors; // after a reset, live.js sends these itself
  }

  // -- live updates: appended to the model in place, charts redrawn
  let redraw = 0;
  function changed(n) {
    state.appended += n;
    if (state.appended > REFETCH_AFTER && !state.fetching) {
      loadSeries();
      return;
    }
    if (!redraw) {
      redraw = requestAnimationFrame(() => {
        redraw = 0;
        if (!state.gone) state.charts?.update();
      });
    }
  }

  const handlers = {
    state: (s) => {
      const el = head.querySelector("#live-state");
      if (el && state.run?.status === "running") el.textContent = s;
    },
    steps: (rows) => {
      if (!state.model || state.window.kind === "range") return;
      const s = state.model.steps;
      for (const r of rows) {
        s.t.push(r.t);
        s.first_step.push(r.step);
        s.n.push(1);
        for (const k of ["min", "mean", "max"]) s.step_ms[k].push(r.step_ms);
        for (const [k] of PHASES) (s.phases_ms[k] ||= s.t.slice(0, -1).map(() => null)).push(r.phases_ms?.[k] ?? null);
        s.eval?.push(r.eval ? 1 : 0);
        s.skipped?.push(r.skipped ? 1 : 0);
        s.mem_allocated_bytes?.push(r.mem_allocated_bytes ?? null);
        s.mem_reserved_bytes?.push(r.mem_reserved_bytes ?? null);
        state.latest = Math.max(state.latest, r.t);
      }
      setSteps(Math.max(...rows.map((r) => r.step)) + 1);
      changed(rows.length);
    },
    gpus: (samples) => {
      if (!state.model || state.window.kind === "range") return;
      const byUuid = new Map((state.model.gpus || []).map((g) => [g.uuid, g]));
      let n = 0;
      for (const x of samples) {
        const g = byUuid.get(x.uuid);
        if (!g || (g.t.length && x.t <= last(g.t))) continue;
        g.t.push(x.t);
        for (const k of ["util_pct", "mem_used_bytes", "power_w", "temp_c", "sm_clock_mhz"]) pushStat(g[k], x[k] ?? null);
        for (const k of ["pcie_rx_bps", "pcie_tx_bps", "gpm_sm_occupancy_pct", "gpm_tensor_util_pct", "gpm_dram_bw_util_pct"]) {
          if (Array.isArray(g[k])) g[k].push(x[k] ?? null);
        }
        state.latest = Math.max(state.latest, x.t);
        n++;
      }
      if (n) changed(n);
    },
    host: (samples) => {
      const hm = state.model?.host;
      if (!hm || state.window.kind === "range") return;
      let n = 0;
      for (const x of samples) {
        if (hm.t.length && x.t <= last(hm.t)) continue;
        hm.t.push(x.t);
        for (const k of ["run_cores", "other_cores", "disk_read_bps", "page_cache_bytes"]) pushStat(hm[k], x[k] ?? null);
        state.latest = Math.max(state.latest, x.t);
        n++;
      }
      if (n) changed(n);
    },
    insights: (list, gains) => drawInsights(list, [], gains),
    run: (run) => {
      const was = state.run?.status;
      state.run = { ...state.run, ...run };
      drawHead();
      if (was === "running" && run.status && run.status !== "running") {
        // ended: its final headline, findings and kernels, from the store
        live.stop();
        api.run(id).then((r) => {
          if (state.gone) return;
          said(r);
          state.run = r.run;
          drawHead();
        }, () => {});
        loadInsights();
        loadKernels();
      }
    },
    reset: () => loadSeries(true),
  };

  async function loadInsights() {
    try {
      const r = said(await api.insights(id));
      if (!state.gone) drawInsights(r.insights, r.notes, r.gains);
    } catch (err) {
      if (!state.gone) replace(insights, h("h2", {}, "Insights"), errorBox(err));
    }
  }

  // a finding's evidence link: that window's rows in the Top kernels panel
  insights.addEventListener("click", (e) => {
    const a = e.target.closest?.("a.evidence-window");
    if (!a) return;
    e.preventDefault();
    loadKernels(a.dataset.evidence);
    kernels.scrollIntoView();
  });
  kernels.addEventListener("click", (e) => {
    if (!e.target.closest?.("a.all-kernels")) return;
    e.preventDefault();
    loadKernels();
  });

  async function loadKernels(evidence = null) {
    let k;
    const title = evidence === null ? "Top kernels" : "Evidence window";
    try {
      k = said(await api.kernels(id, 20, evidence));
    } catch (err) {
      if (!state.gone) replace(kernels, h("h2", {}, title), errorBox(err));
      return;
    }
    if (state.gone) return;
    const win = k.window;
    const shown = win
      ? h("p", { class: "evidence-shown" },
        `${win.kind === "op" ? "Operators" : "Kernels"} of the profiler window of steps ${win.steps.join(", ")} ` +
        `(${win.source}), most time first · `,
        h("a", { href: "#kernels", class: "all-kernels" }, "all windows"))
      : null;
    const mfu = win ? null : [
      k.mfu !== null && k.mfu !== undefined ? `MFU ${ratioPct(k.mfu)}` : null,
      k.achieved_tflops ? `${num(k.achieved_tflops, 1)} TFLOP/s achieved` : null,
      k.windows ? `from ${int(k.windows)} trace window${k.windows === 1 ? "" : "s"}` : null,
    ].filter(Boolean).join(" · ");
    // a CPU-only run's windows hold operators (their self CPU time), not kernels
    const ops = !win && k.kernels?.length && k.kernels[0].kind === "op";
    replace(
      kernels,
      h("h2", {}, ops ? "Top operators" : title),
      shown,
      ops ? h("p", { class: "muted ops-note" }, "No GPU kernels in this run's trace windows: its operators, by self CPU time.") : null,
      mfu ? h("p", { class: "mfu" }, mfu) : null,
      k.kernels?.length
        ? h("div", { class: "table-wrap" }, h("table", { class: "kernels" },
          h("thead", {}, h("tr", {}, ["kernel", "class", "kind", "share", "ms/step", "count", "mean µs"].map((c, i) =>
            h("th", { class: i > 2 ? "num" : null }, c)))),
          h("tbody", {}, k.kernels.map((x) => h("tr", {},
            h("td", { class: "kname" }, userText(x.name)),
            h("td", {}, userText(x.cls)),
            h("td", {}, userText(x.kind)),
            h("td", { class: "num" }, ratioPct(x.share)),
            h("td", { class: "num" }, num(x.ms_per_step, 2)),
            h("td", { class: "num" }, int(x.count)),
            h("td", { class: "num" }, num(x.mean_us, 1))))),
        ))
        : h("p", { class: "muted" }, "No trace windows in this run: gpuprof.profile(..., trace_every_n_steps=N) records them."),
    );
  }

  (async () => {
    // the step chart's read first (it needs nothing from the headline, and
    // the daemon answers reads one at a time), everything else once it is drawn
    let stepsDone;
    const drawn = new Promise((resolve) => { stepsDone = resolve; });
    const series = loadSeries(false, () => stepsDone());
    await drawn;
    if (state.gone) return;
    const asked = api.run(id);
    const rest = Promise.all([loadInsights(), series, loadKernels()]);
    let r;
    try {
      r = said(await asked);
    } catch (err) {
      if (state.gone) return;
      replace(head, h("div", { class: "crumbs" }, h("a", { href: "#/runs" }, "Runs")), errorBox(err));
      for (const el of [insights, windowBar, chartsBox, kernels]) el.remove();
      document.body.dataset.ready = "1";
      return;
    }
    if (state.gone) return;
    state.run = r.run;
    drawHead();
    drawWindowBar();
    await rest;
    if (state.gone) return;
    if (following() && state.model && live.run !== id) live.watch(id, cursorsOf(state.model), handlers);
    document.body.dataset.ready = "1";
  })();

  return () => {
    state.gone = true;
    if (redraw) cancelAnimationFrame(redraw);
    live.stop();
    destroyCharts();
  };
}
