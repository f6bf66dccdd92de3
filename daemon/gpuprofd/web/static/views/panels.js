// Pieces several views show: the insight list (the summary block's verdict
// lines), a status badge, a message box.

import { h, userText } from "../dom.js";

const SEVERITY_ORDER = { HIGH: 0, MED: 1, LOW: 2 };
/** The CSS class of a severity: the rules' HIGH / MED / LOW, other words mapped. */
const SEVERITY_CLASS = { HIGH: "high", CRITICAL: "high", MED: "med", MEDIUM: "med", WARNING: "med", LOW: "low", INFO: "low" };

/** A status word as a badge (running, finished, failed, lost, ...). */
export function statusBadge(status) {
  const s = String(status ?? "unknown");
  return h("span", { class: `badge status-${s.replace(/[^a-z]/g, "")}` }, s);
}

/** "2.3×" (two decimals below 1.1×, where one would read 1.0). */
export function speedup(x) {
  return x < 1.095 ? `${Number(x).toFixed(2)}×` : `${Number(x).toFixed(1)}×`;
}

/** A run-sized duration: "14 s", "25 min", "3.2 h" (as the summary says it). */
function runTime(s) {
  if (s < 0.9995) return `${(s * 1000).toFixed(0)} ms`;
  if (s < 90) return `${s.toFixed(0)} s`;
  if (s < 5400) return `${(s / 60).toFixed(0)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

/** A finding's worth from its gain_* fields, as the summary block says it:
 * "up to 2.3× faster: 32.4 of 56.8 ms per iteration (57%), ~25 min of this
 * run"; "not estimated: why"; null when it costs no time. */
export function worthText(ins) {
  const ms = ins.gain_ms_per_iteration;
  if (ms === null || ms === undefined) return ins.gain_method ? String(ins.gain_method) : null;
  const head = ins.gain_speedup_max ? `up to ${speedup(ins.gain_speedup_max)} faster` : "the whole iteration";
  const of = ins.gain_iteration_ms != null ? ` of ${Number(ins.gain_iteration_ms).toFixed(1)}` : "";
  let text = `${head}: ${Number(ms).toFixed(1)}${of} ms per iteration (${Number(ins.gain_pct).toFixed(0)}%)`;
  if (ins.gain_run_s) {
    text += `, ~${runTime(ins.gain_run_s)}`;
    if (ins.gain_usd != null) text += `, ~$${Number(ins.gain_usd).toFixed(2)}`;
    text += " of this run";
  }
  return text;
}

/** A finding's evidence window (evidence.profile, attached by gpuprofd) in
 * one line, as gpuprofctl insights says it; null when it has none. */
export function evidenceText(profile) {
  if (!profile || typeof profile !== "object") return null;
  const steps = (profile.steps || []).map(Number);
  const lo = Math.min(...steps), hi = Math.max(...steps);
  const span = !steps.length ? "its steps" : lo === hi ? `step ${lo}` : `steps ${lo}-${hi}`;
  const kind = profile.time === "cpu" ? "CPU time" : "device time";
  const top = (profile.top || []).slice(0, 3).map((r) => {
    const op = r.kind === "op";
    const share = typeof r.share === "number" ? ` (${(r.share * 100).toFixed(0)}%)` : "";
    return `${r.name} ${op ? r.self_ms : r.total_ms} ms${op ? " self" : ""}${share}`;
  });
  return `Evidence: a profiler window of ${span} (${kind})` + (top.length ? `: ${top.join(", ")}` : "");
}

/** One insight as the summary block says it: [SEV] title, its worth, detail,
 * Fix: fix, and its evidence window with a link that shows the window's
 * rows in the run page's Top kernels panel (`a.evidence-window`, data-evidence:
 * its request id, which names it on a node and on a team server alike). */
export function insightItem(ins) {
  const profile = ins.evidence?.profile;
  const evidence = evidenceText(profile);
  const sev = String(ins.severity ?? "");
  const worth = worthText(ins);
  const estimated = ins.gain_ms_per_iteration !== null && ins.gain_ms_per_iteration !== undefined;
  return h(
    "li",
    { class: `insight sev-${SEVERITY_CLASS[sev.toUpperCase()] ?? "low"}`, "data-rule": ins.rule },
    h("div", { class: "insight-head" },
      h("span", { class: "sev" }, sev),
      h("span", { class: "insight-title" }, userText(ins.title)),
    ),
    worth ? h("div", { class: "insight-gain" }, h("strong", {}, "Worth: "), userText(worth)) : null,
    estimated && ins.gain_method
      ? h("div", { class: "insight-gain-method muted" }, h("strong", {}, "How: "), userText(ins.gain_method))
      : null,
    ins.detail ? h("div", { class: "insight-detail" }, userText(ins.detail)) : null,
    ins.fix ? h("div", { class: "insight-fix" }, h("strong", {}, "Fix: "), userText(ins.fix)) : null,
    evidence
      ? h("div", { class: "insight-evidence" }, userText(evidence),
        profile.request_id
          ? [" · ", h("a", { href: "#kernels", class: "evidence-window", "data-evidence": String(profile.request_id) }, "the window's operators")]
          : null)
      : null,
  );
}

const rank = (ins) => SEVERITY_ORDER[String(ins.severity).toUpperCase()] ?? SEVERITY_ORDER[SEVERITY_CLASS[String(ins.severity).toUpperCase()]?.toUpperCase()] ?? 9;

/** Ranked by gain, as everywhere findings are listed: those with a gain
 * first, most ms per iteration first; then the rest; severity breaks ties. */
export function byGain(a, b) {
  const ga = a.gain_ms_per_iteration, gb = b.gain_ms_per_iteration;
  const ka = ga === null || ga === undefined ? 1 : 0, kb = gb === null || gb === undefined ? 1 : 0;
  if (ka !== kb) return ka - kb;
  if (!ka && ga !== gb) return gb - ga;
  return rank(a) - rank(b);
}

/** The insights list, ranked by gain (severity shown); `empty` said when there are none. */
export function insightList(insights, notes = [], empty = "No findings: nothing here slows the run.", gains = null) {
  const sorted = [...(insights || [])].sort(byGain);
  const top = sorted.find((i) => i.gain_ms_per_iteration && i.gain_speedup_max);
  let headline = null;
  if (top) {
    headline = `Fixing ${top.gain_label || "the top finding"}: up to ${speedup(top.gain_speedup_max)} faster`;
    const n = gains?.findings ?? 0, all = gains?.fix_all_speedup_max;
    if (n > 1 && all && all > top.gain_speedup_max) headline += `; fixing all ${n}: up to ${speedup(all)}`;
  }
  return h(
    "div",
    { class: "insights" },
    headline ? h("p", { class: "gain-headline" }, headline) : null,
    sorted.length
      ? h("ul", { class: "insight-list" }, sorted.map(insightItem))
      : h("p", { class: "muted none" }, empty),
    (notes || []).map((n) => h("p", { class: "note" }, "Note: ", userText(n))),
  );
}

/** An error box with the server's message. */
export function errorBox(err) {
  return h("div", { class: "error", role: "alert" }, userText(err?.message ?? String(err)));
}

/** A figure: label over value. */
export function figure(label, value, title = null) {
  return h("div", { class: "figure", title }, h("div", { class: "fig-label" }, label),
    h("div", { class: "fig-value" }, value));
}
