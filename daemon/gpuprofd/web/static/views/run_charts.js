// The run view's charts, built from one /series response (the "model"),
// which live updates extend in place; `update()` redraws every chart from it.

import { alpha, chart, markerSeries, palette, stack } from "../charts.js";
import { h, userText } from "../dom.js";
import { bps, bytes, bytesOnAxis, DASH, int, num } from "../format.js";

export const PHASES = [
  ["loader_wait", "loader wait"],
  ["between_steps", "between steps"],
  ["forward", "forward"],
  ["backward", "backward"],
  ["comm", "comm"],
  ["optimizer", "optimizer"],
  ["other", "other"],
];

const fmtMs = (v, d) => (v === null || v === undefined ? DASH : `${num(v, d ?? (v >= 100 ? 0 : 1))} ms`);
const fmtPct = (v, d) => (v === null || v === undefined ? DASH : `${num(v, d ?? 0)}%`);
const fmtW = (v, d) => (v === null || v === undefined ? DASH : `${num(v, d ?? 0)} W`);
const fmtC = (v, d) => (v === null || v === undefined ? DASH : `${num(v, d ?? 0)} °C`);
const fmtMHz = (v, d) => (v === null || v === undefined ? DASH : d ? `${num(v, d)} MHz` : `${int(v)} MHz`);
const fmtBytes = (v, _d, splits) => (splits && v !== null && v !== undefined ? bytesOnAxis(v, splits) : bytes(v, v >= 1e9 ? 1 : 0));
const fmtCores = (v, d) => (v === null || v === undefined ? DASH : num(v, d ?? 1));

/** A GPU known by its UUID only (a team server has no device index): its
 * first 8 hex digits, as nvidia-smi -L users recognise them. */
const shortUuid = (uuid) => String(uuid ?? "?").replace(/^(mig-)?(gpu-)?/i, "").slice(0, 8);
const col = (xs) => (xs === null || xs === undefined ? null : xs);
const constant = (ts, v) => ts.map(() => v ?? null);
const mean = (m) => (m && !Array.isArray(m) ? m.mean : m) || [];
const max = (m) => (m && !Array.isArray(m) ? m.max : m) || [];

/**
 * Build the charts of `model` (a /series response, or the first of its parts)
 * into `root`: a section each for the steps, the GPUs and the host, in that
 * order, each drawn once its part is in the model (until then it says it is
 * loading); `fill(model)` draws the parts that came since.
 * ctx: {syncKey, onSelect(from, to), xRange(lo, hi) -> [from, to], torchGpu:
 * the GPU index torch's memory belongs to}. Returns {update(), fill(model), charts}.
 */
export function buildRunCharts(root, model, ctx) {
  const pal = palette();
  const made = [];
  const add = (parent, spec, data) => {
    const u = chart(parent, {
      syncKey: ctx.syncKey,
      onSelect: ctx.onSelect,
      xRange: ctx.xRange,
      ...spec,
      data: data(),
    });
    made.push({ u, data, spec });
  };
  const sections = {
    steps: h("section", { class: "panel", id: "steps" }, h("h2", {}, "Step time")),
    gpus: h("section", { class: "panel", id: "gpus" }, h("h2", {}, "GPUs")),
    host: h("section", { class: "panel", id: "host" }, h("h2", {}, "Host")),
  };
  const builders = { steps: buildSteps, gpus: buildGpus, host: buildHost };
  const drawn = new Set();
  for (const [part, el] of Object.entries(sections)) {
    root.append(el);
    el.append(h("p", { class: "muted loading" }, "Loading…"));
  }

  function fill(m) {
    for (const part of Object.keys(sections)) {
      if (drawn.has(part) || m[part] === undefined) continue;
      drawn.add(part);
      sections[part].querySelector(".loading")?.remove();
      builders[part](sections[part], m);
    }
  }

  /** A part that could not be read: its section says why instead of loading. */
  function failed(part, message) {
    if (drawn.has(part)) return;
    drawn.add(part);
    sections[part].querySelector(".loading")?.replaceWith(message);
  }

  // -- steps: the stacked phase breakdown, the slowest step per bucket, eval/skipped
  function buildSteps(steps, m) {
    const sm = m.steps;
    const stepRow = h("div", { class: "chart-row wide" });
    steps.append(stepRow);
    const stepData = () => {
      const layers = PHASES.map(([k]) => sm.phases_ms[k] || constant(sm.t, null));
      const { stacked } = stack(layers);
      const evalY = sm.t.map((_, i) => (sm.eval?.[i] ? sm.step_ms.max[i] : null));
      const skipY = sm.t.map((_, i) => (sm.skipped?.[i] ? sm.step_ms.max[i] : null));
      return [sm.t, ...stacked, sm.step_ms.max, evalY, skipY];
    };
    const stepSeries = () => {
      const layers = PHASES.map(([k, label]) => ({
        label,
        color: pal.phase[k],
        fill: alpha(pal.phase[k], 0.55),
        width: 1,
        raw: sm.phases_ms[k] || [],
      }));
      return [
        ...layers,
        { label: "slowest step", color: pal.fg, width: 1, dash: [4, 3], raw: sm.step_ms.max },
        markerSeries("eval", pal.warn, sm.eval),
        markerSeries("skipped", pal.bad, sm.skipped),
      ];
    };
    add(stepRow, {
      title: "Step time per step (ms): phases stacked, slowest step dashed",
      series: stepSeries(),
      bands: stack(PHASES.map(() => [])).bands,
      fmt: fmtMs,
      height: 260,
      yRange: (u, lo, hi) => [0, Math.max(hi ?? 1, 1e-3) * 1.05],
    }, stepData);
    // the legends' raw arrays are the model's own, which live updates extend in place

    if (sm.mem_allocated_bytes?.some((v) => v !== null) || sm.mem_reserved_bytes?.some((v) => v !== null)) {
      const memRow = h("div", { class: "chart-row wide" });
      steps.append(memRow);
      add(memRow, {
        title: "Torch memory (allocated, reserved)",
        series: [
          { label: "allocated", color: pal.series[0] },
          { label: "reserved", color: pal.series[1], dash: [5, 3] },
        ],
        fmt: fmtBytes,
        height: 140,
        yRange: (u, lo, hi) => [0, (hi || 1) * 1.05],
      }, () => [sm.t, sm.mem_allocated_bytes, sm.mem_reserved_bytes]);
    }
  }

  // -- one row per GPU (never an average across them)
  function buildGpus(gpus, m) {
    if (!m.gpus?.length) gpus.append(h("p", { class: "muted" }, "No GPU samples in this window."));
    for (const g of m.gpus || []) {
      const known = g.index !== null && g.index !== undefined;
      const row = h("div", { class: "gpu-row", "data-gpu": known ? g.index : g.uuid });
      const label = h("div", { class: "gpu-label" },
        h("div", { class: "gpu-index" }, known ? `GPU ${g.index}` : `GPU ${shortUuid(g.uuid)}`),
        h("div", { class: "muted small" }, userText(g.name)),
        h("div", { class: "muted small mono" }, userText(g.uuid)));
      const charts = h("div", { class: "chart-row gpu-charts" });
      row.append(label, charts);
      gpus.append(row);
      add(charts, {
        title: "utilization %",
        series: [
          { label: "mean", color: pal.series[0] },
          { label: "max", color: pal.series[0], width: 1, dash: [3, 3] },
        ],
        fmt: fmtPct,
        yRange: [0, 100],
      }, () => [g.t, mean(g.util_pct), max(g.util_pct)]);
      add(charts, {
        title: `memory used / ${fmtBytes(g.mem_total_bytes)}`,
        series: [
          { label: "used", color: pal.series[1] },
          { label: "total", color: pal.muted, width: 1, dash: [6, 4] },
        ],
        fmt: fmtBytes,
        yRange: (u, lo, hi) => [0, Math.max(hi || 1, g.mem_total_bytes || 0) * 1.02],
      }, () => [g.t, mean(g.mem_used_bytes), constant(g.t, g.mem_total_bytes)]);
      add(charts, {
        title: g.power_limit_w ? `power / ${fmtW(g.power_limit_w)} limit` : "power",
        series: [
          { label: "mean", color: pal.series[2] },
          { label: "max", color: pal.series[2], width: 1, dash: [3, 3] },
          { label: "limit", color: pal.bad, width: 1, dash: [6, 4] },
        ],
        fmt: fmtW,
        yRange: (u, lo, hi) => [0, Math.max(hi || 1, g.power_limit_w || 0) * 1.05],
      }, () => [g.t, mean(g.power_w), max(g.power_w), constant(g.t, g.power_limit_w)]);
      add(charts, {
        title: "temperature",
        series: [
          { label: "mean", color: pal.series[3] },
          { label: "max", color: pal.series[3], width: 1, dash: [3, 3] },
        ],
        fmt: fmtC,
      }, () => [g.t, mean(g.temp_c), max(g.temp_c)]);
      add(charts, {
        title: "SM clock",
        series: [{ label: "mean", color: pal.series[4] }],
        fmt: fmtMHz,
        axisSize: 76,
      }, () => [g.t, mean(g.sm_clock_mhz)]);
      if (col(g.pcie_rx_bps) || col(g.pcie_tx_bps)) {
        add(charts, {
          title: "PCIe",
          series: [
            // the slow loop reads once a second: join its readings across the fast buckets
            { label: "rx", color: pal.series[5], spanGaps: true },
            { label: "tx", color: pal.series[6], dash: [5, 3], spanGaps: true },
          ],
          fmt: bps,
          axisSize: 76,
        }, () => [g.t, g.pcie_rx_bps || constant(g.t, null), g.pcie_tx_bps || constant(g.t, null)]);
      }
      if (col(g.gpm_sm_occupancy_pct) || col(g.gpm_tensor_util_pct) || col(g.gpm_dram_bw_util_pct)) {
        add(charts, {
          title: "GPM activity %",
          series: [
            { label: "SM occupancy", color: pal.series[0], spanGaps: true },
            { label: "tensor", color: pal.series[2], spanGaps: true },
            { label: "DRAM bw", color: pal.series[5], spanGaps: true },
          ],
          fmt: fmtPct,
          yRange: [0, 100],
        }, () => [
          g.t,
          g.gpm_sm_occupancy_pct || constant(g.t, null),
          g.gpm_tensor_util_pct || constant(g.t, null),
          g.gpm_dram_bw_util_pct || constant(g.t, null),
        ]);
      }
    }
  }

  // -- the host: the run's own cores vs everything else, disk reads, page cache
  function buildHost(host, m) {
    const hm = m.host;
    if (!hm?.t?.length) {
      host.append(h("p", { class: "muted" }, "No host samples in this window."));
    } else {
      const row = h("div", { class: "chart-row host-charts" });
      host.append(row);
      add(row, {
        title: hm.cpu_count ? `CPU cores busy (of ${hm.cpu_count})` : "CPU cores busy",
        series: [
          { label: "this run", color: pal.series[0] },
          { label: "the rest", color: pal.series[3], dash: [5, 3] },
        ],
        fmt: fmtCores,
        yRange: (u, lo, hi) => [0, Math.max(hi || 1, 1) * 1.05],
      }, () => [hm.t, mean(hm.run_cores), mean(hm.other_cores)]);
      add(row, {
        title: "disk reads",
        series: [
          { label: "mean", color: pal.series[5] },
          { label: "max", color: pal.series[5], width: 1, dash: [3, 3] },
        ],
        fmt: bps,
        axisSize: 76,
      }, () => [hm.t, mean(hm.disk_read_bps), max(hm.disk_read_bps)]);
      add(row, {
        title: "page cache",
        series: [{ label: "size", color: pal.series[6] }],
        fmt: fmtBytes,
        axisSize: 76,
      }, () => [hm.t, mean(hm.page_cache_bytes)]);
    }
  }

  fill(model);
  return {
    get charts() {
      return made.map((m) => m.u);
    },
    fill,
    failed,
    update() {
      for (const m of made) {
        m.u.setData(m.data());
      }
    },
  };
}
