// #/compare/<id>,<id>[,...]: two or more runs side by side: headline
// figures, the phase breakdown, each run's insights, step time overlaid.

import { api } from "../api.js";
import { chart, destroyCharts, newSyncKey, palette } from "../charts.js";
import { h, replace, userText } from "../dom.js";
import { DASH, int, ms, num, ratioPct } from "../format.js";
import { errorBox, insightList, statusBadge } from "./panels.js";
import { PHASES } from "./run_charts.js";

/** Merge per-run (step, value) curves onto one x axis (the union of steps). */
export function overlay(curves) {
  const xs = [...new Set(curves.flatMap((c) => c.step))].sort((a, b) => a - b);
  const at = new Map(xs.map((x, i) => [x, i]));
  const ys = curves.map((c) => {
    const y = new Array(xs.length).fill(null);
    c.step.forEach((s, i) => { y[at.get(s)] = c.step_ms[i]; });
    return y;
  });
  return [xs, ...ys];
}

export function render(root, { ids }) {
  let gone = false;
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  replace(root,
    h("header", { class: "run-head" },
      h("div", { class: "crumbs" }, h("a", { href: "#/runs" }, "Runs"), " / compare"),
      h("h1", {}, `Compare ${ids.length} runs`)),
    body);
  document.title = "Compare · gpuprof";

  (async () => {
    let data;
    try {
      data = await api.compare(ids);
    } catch (err) {
      if (!gone) replace(body, errorBox(err));
      document.body.dataset.ready = "1";
      return;
    }
    if (gone) return;
    const pal = palette();
    const runs = data.runs || [];
    const nameOf = (r) => r.run.name ?? r.run.run_name;
    const headCells = runs.map((r) => h("th", { scope: "col" },
      h("a", { href: `#/run/${r.run.id}` }, `#${r.run.id} `, userText(nameOf(r)))));
    const line = (label, f) => h("tr", {}, h("th", { scope: "row" }, label), runs.map((r) => h("td", { class: "num" }, f(r))));
    const figures = h("table", { class: "compare", id: "compare-figures" },
      h("thead", {}, h("tr", {}, h("th", {}, ""), headCells)),
      h("tbody", {},
        h("tr", {}, h("th", { scope: "row" }, "status"), runs.map((r) => h("td", {}, statusBadge(r.run.status)))),
        line("host", (r) => userText(r.run.host ?? DASH)),
        line("steps", (r) => int(r.run.steps)),
        line("median step", (r) => ms(r.run.median_step_ms)),
        line("mean step", (r) => ms(r.run.mean_step_ms)),
        line("steps/s", (r) => num(r.run.steps_per_s, 2)),
        line("MFU", (r) => (r.run.mfu === null || r.run.mfu === undefined ? DASH : ratioPct(r.run.mfu))),
        line("GPUs", (r) => String(r.run.gpus?.length ?? 0)),
      ));
    const maxPhase = Math.max(1e-9, ...runs.flatMap((r) => PHASES.map(([k]) => r.phases_ms?.[k] ?? 0)));
    const phases = h("table", { class: "compare", id: "compare-phases" },
      h("thead", {}, h("tr", {}, h("th", {}, "median ms per step"), headCells.map((c) => c.cloneNode(true)))),
      h("tbody", {}, PHASES.map(([k, label]) => h("tr", {},
        h("th", { scope: "row" }, h("span", { class: "swatch", style: { background: pal.phase[k] } }), label),
        runs.map((r) => {
          const v = r.phases_ms?.[k];
          return h("td", { class: "num bar-cell" },
            h("span", { class: "bar", style: { width: `${(70 * (v ?? 0)) / maxPhase}%`, background: pal.phase[k] } }),
            h("span", { class: "bar-value" }, v === null || v === undefined ? DASH : num(v, 2)));
        })))));
    const chartBox = h("div", { class: "chart-row wide", id: "compare-chart" });
    const insights = h("div", { class: "compare-insights" }, runs.map((r) => h("div", { class: "panel" },
      h("h3", {}, `#${r.run.id} `, userText(nameOf(r))), insightList(r.insights))));
    replace(body,
      h("section", { class: "panel" }, h("h2", {}, "Headline"), h("div", { class: "table-wrap" }, figures)),
      h("section", { class: "panel" }, h("h2", {}, "Phase breakdown"), h("div", { class: "table-wrap" }, phases)),
      h("section", { class: "panel" }, h("h2", {}, "Step time by step"), chartBox),
      h("section", {}, h("h2", {}, "Insights"), insights));
    const curves = (data.steps || []).map((c) => ({ ...c }));
    const byId = new Map(runs.map((r) => [r.run.id, r]));
    chart(chartBox, {
      title: "Step time (ms) by step index",
      time: false,
      xLabel: "step",
      syncKey: newSyncKey(),
      series: curves.map((c, i) => ({
        label: `#${c.id} ${String(byId.get(c.id) ? nameOf(byId.get(c.id)) : "").slice(0, 40)}`,
        color: pal.series[i % pal.series.length],
        spanGaps: true,
      })),
      fmt: (v) => `${num(v, v >= 100 ? 0 : 1)} ms`,
      height: 300,
      yRange: (u, lo, hi) => [0, (hi || 1) * 1.05],
      data: overlay(curves),
    });
    document.body.dataset.ready = "1";
  })();

  return () => {
    gone = true;
    destroyCharts();
  };
}
