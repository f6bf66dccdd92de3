// uPlot helpers: every chart a view makes shares the view's sync key (one
// crosshair moves on all), shows hover values in its legend, and turns a
// dragged range into a callback (the view re-fetches that window at full
// resolution) instead of zooming on its own.

/* global uPlot */

import { h } from "./dom.js";
import { clock, DASH, tickDigits } from "./format.js";

let keys = 0;

/** A fresh sync key: one per page view, shared by all its charts. */
export function newSyncKey() {
  keys += 1;
  return `gpuprof-${keys}`;
}

function cssVar(name, fallback) {
  const v = getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  return v || fallback;
}

/** The palette, read from style.css (light or dark). */
export function palette() {
  return {
    fg: cssVar("--fg", "#222"),
    muted: cssVar("--muted", "#777"),
    grid: cssVar("--grid", "rgba(128,128,128,0.18)"),
    series: [1, 2, 3, 4, 5, 6, 7, 8].map((i) => cssVar(`--c${i}`, "#1f77b4")),
    phase: {
      loader_wait: cssVar("--ph-wait", "#d62728"),
      between_steps: cssVar("--ph-between", "#bcbd22"),
      forward: cssVar("--ph-fwd", "#1f77b4"),
      backward: cssVar("--ph-bwd", "#2ca02c"),
      comm: cssVar("--ph-comm", "#9467bd"),
      optimizer: cssVar("--ph-opt", "#ff7f0e"),
      other: cssVar("--ph-other", "#8c8c8c"),
    },
    warn: cssVar("--warn", "#e6a100"),
    bad: cssVar("--bad", "#d62728"),
  };
}

/** `color` with alpha `a` (0..1); accepts #rrggbb. */
export function alpha(color, a) {
  const m = /^#([0-9a-f]{6})$/i.exec(color);
  if (!m) return color;
  const n = parseInt(m[1], 16);
  return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${a})`;
}


const live = new Set();

// A drag on one chart is mirrored on every chart of its sync key, each firing
// setSelect: one callback per drag, for the range of the first to fire.
let pendingSelect = null;
function selected(onSelect, from, to) {
  if (pendingSelect) return;
  pendingSelect = setTimeout(() => {
    pendingSelect = null;
    onSelect(from, to);
  }, 0);
}

/** Destroy every chart made since the last call (a view is leaving). */
export function destroyCharts() {
  for (const c of live) c.destroy();
  live.clear();
}

/**
 * A chart in a new element appended to `parent`.
 *
 * spec: {title, series: [{label, color, width, fill, dash, points, paths,
 * value(v, i) -> legend text, raw}], data: [xs, ys...], fmt(v, digits?, splits?) -> y text (an axis tick gets its axis' splits)
 * (digits: what the axis' ticks need),
 * syncKey, onSelect(from, to) (x units), xRange: [from, to] or (dataMin,
 * dataMax) -> [from, to],
 * time: x is unix seconds (default true), height (px), bands, yRange,
 * xAxis: uPlot axis options for x}.
 * Returns the uPlot instance; its element is `u.root.parentElement`
 * (class "chart", with `.uplot` pointing back at it).
 */
export function chart(parent, spec) {
  const pal = palette();
  const fmt = spec.fmt || ((v) => String(v));
  const time = spec.time !== false;
  const el = h("div", { class: "chart", "data-title": spec.title || null });
  parent.append(el);
  // sizes follow the page's type (larger on a 4K screen): 1 at 14 px
  const scale = (parseFloat(getComputedStyle(document.documentElement).fontSize) || 14) / 14;
  const axis = {
    stroke: pal.muted,
    grid: { stroke: pal.grid, width: 1 },
    ticks: { stroke: pal.grid, width: 1 },
    font: `${Math.round(11 * scale)}px system-ui, sans-serif`,
  };
  const series = [
    {
      label: time ? "time" : spec.xLabel || "x",
      value: (u, v) => (v === null || v === undefined ? DASH : time ? clock(v) : String(v)),
    },
    ...spec.series.map((s, i) => ({
      label: s.label,
      stroke: s.color || pal.series[i % pal.series.length],
      width: s.width ?? 1.5,
      fill: s.fill || undefined,
      dash: s.dash || undefined,
      spanGaps: s.spanGaps ?? false,
      points: s.points || { show: false },
      paths: s.paths,
      show: s.show ?? true,
      value: (u, v, si, idx) => {
        const raw = s.raw ? s.raw[idx] : v;
        if (s.value) return s.value(raw, idx);
        return raw === null || raw === undefined ? DASH : fmt(raw);
      },
    })),
  ];
  const opts = {
    title: spec.title,
    width: Math.max(el.clientWidth || parent.clientWidth || 300, 200),
    height: Math.round((spec.height || 160) * scale),
    series,
    bands: spec.bands,
    scales: {
      x: {
        time,
        range: spec.xRange
          ? (u, lo, hi) => (typeof spec.xRange === "function" ? spec.xRange(lo, hi) : spec.xRange)
          : undefined,
      },
      y: { range: spec.yRange },
    },
    axes: [
      // time labels (":38.100") are ~60 px wide: ticks at least 100 px apart never touch
      { ...axis, size: Math.round(50 * scale), space: Math.round(100 * scale), ...(spec.xAxis || {}) },
      { ...axis, size: Math.round((spec.axisSize || 64) * scale), values: (u, splits) => splits.map((v) => fmt(v, tickDigits(splits), splits)) },
    ],
    cursor: {
      sync: spec.syncKey ? { key: spec.syncKey, setSeries: false } : undefined,
      drag: { x: !!spec.onSelect, y: false, setScale: false },
      y: false, // a y line means nothing on the other charts: time only
      points: { size: Math.round(6 * scale) },
    },
    legend: { live: true },
    hooks: {
      setSelect: [
        (u) => {
          if (!spec.onSelect || u.select.width < 4) return;
          const from = u.posToVal(u.select.left, "x");
          const to = u.posToVal(u.select.left + u.select.width, "x");
          u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
          selected(spec.onSelect, from, to);
        },
      ],
    },
  };
  const u = new uPlot(opts, spec.data, el);
  el.uplot = u;
  live.add(u);
  const ro = new ResizeObserver(() => {
    const w = el.clientWidth;
    if (w > 0 && Math.abs(w - u.width) > 1) u.setSize({ width: w, height: u.height });
  });
  ro.observe(el);
  const destroy = u.destroy.bind(u);
  u.destroy = () => {
    ro.disconnect();
    destroy();
  };
  return u;
}

/**
 * Stack `layers` (arrays of equal length; null as 0 where any layer has a
 * value) bottom to top: returns {stacked: cumulative arrays, bands} for
 * uPlot, series i filled down to series i-1 (the stacked-area demo's idiom).
 */
export function stack(layers) {
  const n = layers.length ? layers[0].length : 0;
  const acc = new Array(n).fill(0);
  const stacked = layers.map((layer) =>
    layer.map((v, i) => {
      const any = layers.some((l) => l[i] !== null && l[i] !== undefined);
      if (!any) return null;
      acc[i] += v ?? 0;
      return acc[i];
    }),
  );
  // uPlot series index = layer index + 1; a band fills between a layer and the one below
  const bands = [];
  for (let i = 1; i < layers.length; i++) bands.push({ series: [i + 1, i] });
  return { stacked, bands };
}

/** A marker-only series (eval / skipped steps): points, no line. */
export function markerSeries(label, color, raw) {
  return {
    label,
    color,
    width: 0,
    paths: () => null,
    points: { show: true, size: 7, fill: color, stroke: color },
    raw,
    value: (v) => (v ? String(v) : DASH),
  };
}
