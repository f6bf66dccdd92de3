// #/compare/<id>,<id>[,...]: two or more runs side by side: each run after
// the first against the first (gpuprofctl compare's verdict, speed-up and
// deltas), headline figures, the phase breakdown, each run's insights, step
// time overlaid.
// The address is the view's state: runs added or removed here change it (a
// new history entry each, so Back gives the last set), and a bookmark of it
// opens the same compare.

import { api } from "../api.js";
import { chart, destroyCharts, newSyncKey, palette } from "../charts.js";
import { h, replace, userText } from "../dom.js";
import { DASH, int, ms, num, pct, ratioPct } from "../format.js";
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

const signed = (v, digits = 1) => (v === null || v === undefined ? DASH : `${v > 0 ? "+" : ""}${Number(v || 0).toFixed(digits)}`);

/** A speed-up factor to three significant digits: `2.93×`, `0.0733×`. */
const times = (x) => `${Number(x).toPrecision(3)}×`;

/** One finding of the comparison: its short name, severities and titles (text). */
function changeItem(kind, e) {
  const sev = kind === "changed" ? `${e.severity_a} → ${e.severity_b}` : (e.severity_a ?? e.severity_b);
  const title = kind === "new" || kind === "changed" || kind === "unchanged" ? e.title_b : (e.title_a ?? e.title_b);
  // what fixing it was predicted to be worth, where A's finding said so
  const predicted = e.gain_a?.gain_speedup_max;
  return h("li", { "data-rule": e.rule, "data-kind": kind },
    h("strong", {}, `${kind} `), h("span", { class: "sev" }, `[${sev ?? DASH}] `), userText(e.label),
    kind === "resolved" && typeof predicted === "number"
      ? h("span", { class: "muted predicted" }, ` (predicted: up to ${times(predicted)} faster)`) : null,
    title ? h("div", { class: "muted" }, userText(title)) : null);
}

/** Run B against run A (`cmp`: /compare?a=&b=): the verdict sentence, the
 * speed-up with its interval, the phase deltas and the findings that changed. */
export function pairPanel(cmp) {
  const { a, b } = cmp;
  const ci = cmp.ci_low === null ? "no interval: too few steps"
    : `95 % CI ${times(cmp.ci_low)}–${times(cmp.ci_high)}${cmp.within_noise ? ", within noise" : ""}`;
  const phases = h("table", { class: "compare deltas", "data-b": b.run_id },
    h("thead", {}, h("tr", {}, h("th", {}, "share of iteration"), h("th", { scope: "col" }, "A"),
      h("th", { scope: "col" }, "B"), h("th", { scope: "col" }, "B − A"))),
    h("tbody", {}, cmp.phases.filter((p) => p.a_pct !== null || p.b_pct !== null).map((p) =>
      h("tr", { "data-phase": p.phase }, h("th", { scope: "row" }, p.label),
        h("td", { class: "num" }, pct(p.a_pct)), h("td", { class: "num" }, pct(p.b_pct)),
        h("td", { class: "num" }, p.delta_pct === null ? DASH : `${signed(p.delta_pct)} pp`)))));
  const kinds = ["resolved", "new", "changed", "unchanged"];
  const changes = kinds.flatMap((k) => (cmp.findings?.[k] || []).map((e) => changeItem(k, e)));
  // runs of different names: a regression is each run's against its own earlier
  // runs; a run too short for the rules: a finding of one run only is not judged
  for (const e of [...(cmp.findings?.history || []), ...(cmp.findings?.unjudged || [])]) {
    if (e.severity_a) changes.push(changeItem("A only", { ...e, severity_b: undefined, title_b: undefined }));
    if (e.severity_b) changes.push(changeItem("B only", { ...e, severity_a: undefined, title_a: undefined }));
  }
  return h("div", { class: "panel pair", "data-a": a.run_id, "data-b": b.run_id },
    h("h3", {}, "B ", h("a", { href: `#/run/${b.run_id}`, class: "run-link" }, `#${b.run_id} `, userText(b.run_name)),
      " against A ", h("a", { href: `#/run/${a.run_id}`, class: "run-link" }, `#${a.run_id} `, userText(a.run_name))),
    h("p", { class: "verdict" }, userText(cmp.verdict)),
    h("p", { class: "muted speedup" }, `Mean iteration ${ms(a.mean_iteration_ms)} → ${ms(b.mean_iteration_ms)}; `,
      `speed-up (A's time over B's) ${times(cmp.speedup)} per ${cmp.basis.unit} (${ci})`),
    cmp.basis.note ? h("p", { class: "note" }, "Note: ", userText(cmp.basis.note)) : null,
    h("div", { class: "table-wrap" }, phases),
    changes.length ? h("ul", { class: "changes" }, changes) : h("p", { class: "muted" }, "No findings in either run."));
}

/** The most runs one compare holds (the API's limit). */
const MAX_RUNS = 8;

/** The address of a compare of `ids`. */
export const compareHash = (ids) => `#/compare/${ids.join(",")}`;

export function render(root, { ids: asked }) {
  let gone = false;
  const ids = [...new Set(asked)];
  if (ids.length !== asked.length) {
    // one address per compare: the repeat dropped, without a history entry
    history.replaceState(null, "", compareHash(ids));
  }
  const addInput = h("input", {
    type: "text", id: "compare-add", inputmode: "numeric", placeholder: "run id",
    "aria-label": "Add a run to the compare by its id", size: 8,
  });
  const addError = h("span", { class: "error-text", id: "compare-add-error", role: "status" });
  const addForm = h("form", { class: "filters compare-add" },
    h("label", { for: "compare-add" }, "Add run "), addInput,
    h("button", { type: "submit" }, "Add"), addError);
  addForm.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const text = addInput.value.trim();
    const id = Number(text);
    addError.textContent = "";
    if (!text || !Number.isInteger(id) || id <= 0) {
      addError.textContent = `"${text}" is not a run id.`;
      return;
    }
    if (ids.includes(id)) {
      addError.textContent = `Run ${id} is compared already.`;
      return;
    }
    if (ids.length >= MAX_RUNS) {
      addError.textContent = `A compare holds ${MAX_RUNS} runs at most: remove one first.`;
      return;
    }
    try {
      await api.run(id); // said here, not as the whole view's error
    } catch (err) {
      if (!gone) addError.textContent = err.message;
      return;
    }
    if (!gone) location.hash = compareHash([...ids, id]);
  });
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  replace(root,
    h("header", { class: "run-head" },
      h("div", { class: "crumbs" }, h("a", { href: "#/runs" }, "Runs"), " / compare"),
      h("h1", {}, `Compare ${ids.length} runs`),
      addForm),
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
    // each run after the first against the first: one failing pair (a run
    // without steps) is said in its place, the rest still shown
    const pairs = await Promise.allSettled(ids.slice(1).map((id) => api.comparePair(ids[0], id)));
    if (gone) return;
    const verdicts = h("section", { class: "panel", id: "compare-verdicts" }, h("h2", {}, "Against the first run"),
      pairs.map((p) => (p.status === "fulfilled" ? pairPanel(p.value) : errorBox(p.reason))));
    const pal = palette();
    const runs = data.runs || [];
    const nameOf = (r) => r.run.name ?? r.run.run_name;
    const removable = ids.length > 2;
    const headCell = (r, remove) => h("th", { scope: "col" },
      h("a", { href: `#/run/${r.run.id}`, class: "run-link" }, `#${r.run.id} `, userText(nameOf(r))),
      remove && removable
        ? h("button", {
          type: "button", class: "remove", "data-remove": r.run.id,
          title: `Remove run ${r.run.id} from the compare`, "aria-label": `remove run ${r.run.id}`,
          onclick: () => { location.hash = compareHash(ids.filter((i) => i !== r.run.id)); },
        }, "×")
        : null);
    const headCells = runs.map((r) => headCell(r, true));
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
    // a part no run's figures hold (the time between steps) is left out
    const parts = PHASES.filter(([k]) => k !== "between_steps" || runs.some((r) => r.phases_ms?.[k] != null));
    const maxPhase = Math.max(1e-9, ...runs.flatMap((r) => parts.map(([k]) => r.phases_ms?.[k] ?? 0)));
    const phases = h("table", { class: "compare", id: "compare-phases" },
      h("thead", {}, h("tr", {}, h("th", {}, "mean ms per step"), runs.map((r) => headCell(r, false)))),
      h("tbody", {}, parts.map(([k, label]) => h("tr", {},
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
      verdicts,
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
