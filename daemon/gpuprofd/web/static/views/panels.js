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

/** One insight as the summary block says it: [SEV] title, detail, Fix: fix. */
export function insightItem(ins) {
  const sev = String(ins.severity ?? "");
  return h(
    "li",
    { class: `insight sev-${SEVERITY_CLASS[sev.toUpperCase()] ?? "low"}`, "data-rule": ins.rule },
    h("div", { class: "insight-head" },
      h("span", { class: "sev" }, sev),
      h("span", { class: "insight-title" }, userText(ins.title)),
    ),
    ins.detail ? h("div", { class: "insight-detail" }, userText(ins.detail)) : null,
    ins.fix ? h("div", { class: "insight-fix" }, h("strong", {}, "Fix: "), userText(ins.fix)) : null,
  );
}

const rank = (ins) => SEVERITY_ORDER[String(ins.severity).toUpperCase()] ?? SEVERITY_ORDER[SEVERITY_CLASS[String(ins.severity).toUpperCase()]?.toUpperCase()] ?? 9;

/** The insights list, most severe first; `empty` said when there are none. */
export function insightList(insights, notes = [], empty = "No findings: nothing here slows the run.") {
  const sorted = [...(insights || [])].sort(
    (a, b) => rank(a) - rank(b),
  );
  return h(
    "div",
    { class: "insights" },
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
