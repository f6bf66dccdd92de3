// #/group/<group>: a distributed job's ranks: each one's median and worst
// step and its comm, the straggler / bucket / comm findings.

/* global uPlot */

import { api } from "../api.js";
import { chart, destroyCharts, newSyncKey, palette } from "../charts.js";
import { bytes, DASH, ms, num } from "../format.js";
import { h, replace, userText } from "../dom.js";
import { errorBox, insightList, statusBadge } from "./panels.js";

export function render(root, { group }) {
  let gone = false;
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  replace(root,
    h("header", { class: "run-head" },
      h("div", { class: "crumbs" }, h("a", { href: "#/runs" }, "Runs"), " / group"),
      h("h1", {}, "Group ", userText(group))),
    body);
  document.title = "Group · gpuprof";

  (async () => {
    let g;
    try {
      g = await api.group(group);
    } catch (err) {
      if (!gone) replace(body, errorBox(err));
      document.body.dataset.ready = "1";
      return;
    }
    if (gone) return;
    const pal = palette();
    const ranks = [...(g.ranks || [])].sort((a, b) => a.rank - b.rank);
    const table = h("table", { class: "ranks", id: "group-ranks" },
      h("thead", {}, h("tr", {}, ["rank", "run", "host", "status", "median step", "worst step", "comm ms", "grad bytes", "clock offset"]
        .map((c, i) => h("th", { class: i === 0 || i > 3 ? "num" : null }, c)))),
      h("tbody", {}, ranks.map((r) => h("tr", { "data-rank": r.rank },
        h("td", { class: "num" }, String(r.rank)),
        h("td", {}, h("a", { href: `#/run/${r.run_id}` }, `run ${r.run_id}`)),
        h("td", {}, userText(r.host ?? DASH)),
        h("td", {}, statusBadge(r.status)),
        h("td", { class: "num" }, ms(r.median_step_ms)),
        h("td", { class: "num" }, ms(r.worst_step_ms)),
        h("td", { class: "num" }, num(r.comm_ms, 2)),
        h("td", { class: "num" }, bytes(r.grad_bytes)),
        h("td", { class: "num" }, r.clock_offset_ms === null || r.clock_offset_ms === undefined ? DASH : `${num(r.clock_offset_ms, 2)} ms`)))));
    const chartBox = h("div", { class: "chart-row wide", id: "group-chart" });
    replace(body,
      h("p", { class: "meta muted" }, statusBadge(g.status), ` ${ranks.length} rank${ranks.length === 1 ? "" : "s"}`),
      g.note ? h("p", { class: "note" }, userText(g.note)) : null,
      (g.missing || []).length ? h("div", { class: "warn-box" }, (g.missing || []).map((m) =>
        h("p", {}, userText(typeof m === "string" ? m : m.message ?? JSON.stringify(m))))) : null,
      h("section", { class: "panel", id: "insights" }, h("h2", {}, "Findings"), insightList(g.insights, [], undefined, g.gains)),
      h("section", { class: "panel" }, h("h2", {}, "Ranks"), h("div", { class: "table-wrap" }, table)),
      h("section", { class: "panel" }, h("h2", {}, "Per rank: median and worst step, comm"), chartBox));
    // grouped bars: each rank's three bars side by side at rank - 0.25, rank, rank + 0.25
    const bars = uPlot.paths.bars({ size: [0.9, 80], align: 0 });
    const slots = [-0.25, 0, 0.25];
    const keys = ["median_step_ms", "worst_step_ms", "comm_ms"];
    const xs = ranks.flatMap((r) => slots.map((d) => r.rank + d));
    const ys = keys.map((k, si) => ranks.flatMap((r) => slots.map((_, j) => (j === si ? r[k] ?? null : null))));
    chart(chartBox, {
      title: "ms per rank",
      time: false,
      xLabel: "rank",
      syncKey: newSyncKey(),
      series: [
        { label: "median step", color: pal.series[0], fill: pal.series[0], paths: bars },
        { label: "worst step", color: pal.series[3], fill: pal.series[3], paths: bars },
        { label: "comm", color: pal.phase.comm, fill: pal.phase.comm, paths: bars },
      ],
      fmt: (v) => `${num(v, v >= 100 ? 0 : 1)} ms`,
      height: 260,
      xRange: ranks.length ? [ranks[0].rank - 0.5, ranks[ranks.length - 1].rank + 0.5] : null,
      xAxis: { splits: () => ranks.map((r) => r.rank), values: (u, splits) => splits.map((v) => `rank ${v}`) },
      yRange: (u, lo, hi) => [0, (hi || 1) * 1.1],
      data: [xs, ...ys],
    });
    document.body.dataset.ready = "1";
  })();

  return () => {
    gone = true;
    destroyCharts();
  };
}
