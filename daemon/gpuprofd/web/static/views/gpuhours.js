// The "GPU-hours" page (#/gpu-hours?since=7d): where the team's GPU-hours went
// in a period: totals, a stacked bar of the GPU-hours lost by finding per week,
// tables by user and by project (each linking to its runs and its worst runs)
// and the costliest recurring findings with their fix. The same figures as
// GET /api/v1/rollups and `gpuprofctl rollup`. Every name is text.

/* global uPlot */

import { api } from "../api.js";
import { chart, destroyCharts, newSyncKey, palette } from "../charts.js";
import { h, replace, userText } from "../dom.js";
import { DASH, num } from "../format.js";
import { errorBox } from "./panels.js";

const PERIODS = [
  ["7d", "the last 7 days"],
  ["30d", "the last 30 days"],
  ["90d", "the last 90 days"],
];

function hours(v) {
  return v === null || v === undefined ? DASH : num(v, v >= 100 ? 0 : 1);
}

function usd(v) {
  return v === null || v === undefined ? DASH : `$${num(v, v >= 100 ? 0 : 2)}`;
}

function share(v) {
  return v === null || v === undefined ? DASH : `${num(v * 100, 0)}%`;
}

function trend(v) {
  if (v === null || v === undefined) return DASH;
  const p = Math.round(v * 100);
  return `${p > 0 ? "+" : ""}${p}%`;
}

/** A group's table: key (a link to its runs), figures, its worst runs. */
function groupTable(id, by, groups) {
  const head = [by === "user" ? "User" : "Project", "Runs", "GPU-hours", "Cost", "Lost GPU-hours", "Lost", "Share", "Trend", "Worst runs"];
  return h("table", { class: "runs rollup", id },
    h("thead", {}, h("tr", {}, head.map((c, i) => h("th", { class: i > 0 && i < 8 ? "num" : null, scope: "col" }, c)))),
    h("tbody", {}, groups.map((g) => h("tr", {},
      h("td", { class: "key" }, g.key === null
        ? h("span", { class: "muted" }, "none")
        : h("a", { href: `#/runs?${by}=${encodeURIComponent(g.key)}`, class: "group-link cut" }, userText(g.key, "", true))),
      h("td", { class: "num" }, String(g.runs)),
      h("td", { class: "num" }, hours(g.gpu_hours)),
      h("td", { class: "num" }, usd(g.usd)),
      h("td", { class: "num" }, hours(g.lost_gpu_hours)),
      h("td", { class: "num" }, share(g.lost_share)),
      h("td", { class: "num" }, share(g.share)),
      h("td", { class: "num", title: "GPU-hours against the period before" }, trend(g.trend)),
      h("td", { class: "worst" }, (g.worst_runs || []).length
        ? (g.worst_runs || []).map((r) => h("a", { href: `#/run/${r.id}`, class: "worst-run cut", title: `${hours(r.lost_gpu_hours)} GPU-hours lost` },
          userText(r.run_name ?? `run ${r.id}`)))
        : DASH)))));
}

function findingsTable(findings) {
  return h("table", { class: "runs rollup", id: "gpuhours-findings" },
    h("thead", {}, h("tr", {}, ["Finding", "Runs", "Lost GPU-hours", "Lost", "Of all GPU-hours", "Fix"]
      .map((c, i) => h("th", { class: i > 0 && i < 5 ? "num" : null, scope: "col" }, c)))),
    h("tbody", {}, findings.map((f) => h("tr", { "data-rule": f.rule },
      h("td", {}, userText(f.rule)),
      h("td", { class: "num" }, String(f.runs)),
      h("td", { class: "num" }, hours(f.lost_gpu_hours)),
      h("td", { class: "num" }, usd(f.lost_usd)),
      h("td", { class: "num" }, share(f.share)),
      h("td", { class: "fix" }, f.fix ? userText(f.fix) : DASH)))));
}

/** Lost GPU-hours by finding per week, stacked bars (the biggest layer drawn first). */
function weeksChart(box, weeks, findings) {
  const pal = palette();
  const rules = findings.map((f) => f.rule);
  const xs = weeks.map((w) => w.start_s);
  const layers = rules.map((r) => weeks.map((w) => w.lost[r] ?? 0));
  const acc = new Array(xs.length).fill(0);
  const stacked = layers.map((l) => l.map((v, i) => (acc[i] += v)));
  const bars = uPlot.paths.bars({ size: [0.6, 120], align: 0 });
  const order = rules.map((_, i) => i).reverse(); // the tallest (the sum) first, each below over it
  chart(box, {
    title: "GPU-hours lost by finding, per week",
    time: true,
    syncKey: newSyncKey(),
    series: order.map((i) => ({
      label: rules[i],
      color: pal.series[i % pal.series.length],
      fill: pal.series[i % pal.series.length],
      paths: bars,
      raw: layers[i],
    })),
    fmt: (v) => hours(v),
    height: 240,
    xRange: xs.length ? [xs[0] - 4 * 86400, xs[xs.length - 1] + 4 * 86400] : null,
    yRange: (u, lo, hi) => [0, (hi || 1) * 1.1],
    data: [xs, ...order.map((i) => stacked[i])],
  });
}

export function render(root, { query }) {
  const since = PERIODS.some(([k]) => k === query.get("since")) ? query.get("since") : "7d";
  let gone = false;
  const pick = h("select", { id: "gpuhours-since", "aria-label": "Period" },
    PERIODS.map(([k, label]) => h("option", { value: k, selected: k === since }, label)));
  pick.addEventListener("change", () => { location.hash = `#/gpu-hours?since=${pick.value}`; });
  const body = h("div", { id: "gpuhours" }, h("p", { class: "muted" }, "Loading…"));
  replace(root,
    h("header", { class: "run-head" }, h("h1", {}, "GPU-hours")),
    h("div", { class: "filters" }, pick),
    body);
  document.title = "GPU-hours · gpuprof";

  (async () => {
    let byUser, byProject;
    try {
      [byUser, byProject] = await Promise.all([api.rollups({ by: "user", since }), api.rollups({ by: "project", since })]);
    } catch (err) {
      if (!gone) replace(body, errorBox(err));
      document.body.dataset.ready = "1";
      return;
    }
    if (gone) return;
    const t = byProject.totals;
    const chartBox = h("div", { class: "chart-row wide", id: "gpuhours-weeks" });
    replace(body,
      h("p", { class: "meta", id: "gpuhours-totals" },
        `${t.runs} run${t.runs === 1 ? "" : "s"} · ${hours(t.gpu_hours)} GPU-hours (${usd(t.usd)}) · `,
        h("strong", {}, `${hours(t.lost_gpu_hours)} GPU-hours lost`), ` (${usd(t.lost_usd)}, ${share(t.lost_share)})`),
      h("section", { class: "panel" }, h("h2", {}, "Lost GPU-hours by finding, per week"), chartBox),
      h("section", { class: "panel" }, h("h2", {}, "Costliest recurring findings"),
        byProject.findings.length ? h("div", { class: "table-wrap" }, findingsTable(byProject.findings)) : h("p", { class: "muted" }, "No finding cost time in this period.")),
      h("section", { class: "panel" }, h("h2", {}, "By project"), h("div", { class: "table-wrap" }, groupTable("gpuhours-projects", "project", byProject.groups))),
      h("section", { class: "panel" }, h("h2", {}, "By user"), h("div", { class: "table-wrap" }, groupTable("gpuhours-users", "user", byUser.groups))));
    if (byProject.findings.length) weeksChart(chartBox, byProject.weeks, byProject.findings);
    document.body.dataset.ready = "1";
  })();

  return () => {
    gone = true;
    destroyCharts();
  };
}
