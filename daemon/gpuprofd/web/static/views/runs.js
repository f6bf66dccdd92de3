// #/runs: the node's runs, newest first, filtered by name and status; the
// columns of `gpuprofctl runs`. Tick two or more to compare them.

import { api } from "../api.js";
import { h, replace, userText } from "../dom.js";
import { duration, int, num, shortWhen, when } from "../format.js";
import { errorBox, statusBadge } from "./panels.js";

const REFRESH_MS = 5000;
const SHARES = [
  ["loader_wait", "WAIT%"],
  ["forward", "FWD%"],
  ["backward", "BWD%"],
  ["comm", "COMM%"],
  ["optimizer", "OPT%"],
  ["other", "OTHER%"],
];
const STATUSES = ["", "running", "finished", "failed", "lost"];

export function render(root, { query }) {
  const state = { name: query.get("name") || "", status: query.get("status") || "", picked: new Set(), gone: false };
  const nameInput = h("input", {
    type: "search", id: "filter-name", placeholder: "name contains…", value: state.name,
    "aria-label": "Filter by name",
  });
  const statusSelect = h("select", { id: "filter-status", "aria-label": "Filter by status" },
    STATUSES.map((s) => h("option", { value: s, selected: s === state.status }, s || "any status")));
  const compareBtn = h("button", { type: "button", id: "compare", disabled: true }, "Compare selected");
  const tableBox = h("div", { class: "table-wrap", id: "runs" });
  replace(root,
    h("header", { class: "run-head" }, h("h1", {}, "Runs")),
    h("div", { class: "filters" }, nameInput, statusSelect, compareBtn),
    tableBox);
  document.title = "Runs · gpuprof";

  let timer = null;
  let debounce = null;
  nameInput.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { state.name = nameInput.value; load(); }, 250);
  });
  statusSelect.addEventListener("change", () => { state.status = statusSelect.value; load(); });
  compareBtn.addEventListener("click", () => {
    location.hash = `#/compare/${[...state.picked].sort((a, b) => a - b).join(",")}`;
  });

  function pickedChanged() {
    compareBtn.disabled = state.picked.size < 2;
    compareBtn.textContent = state.picked.size >= 2 ? `Compare ${state.picked.size} runs` : "Compare selected";
  }

  function row(r) {
    const pct = r.pct_of_iteration || {};
    const name = r.run_name ?? r.name;
    const end = r.end_s ?? (r.status === "running" ? Date.now() / 1000 : null);
    const box = h("input", { type: "checkbox", "aria-label": `select run ${r.id}`, checked: state.picked.has(r.id) });
    box.addEventListener("change", () => {
      if (box.checked) state.picked.add(r.id);
      else state.picked.delete(r.id);
      pickedChanged();
    });
    return h("tr", { "data-run": r.id },
      h("td", {}, box),
      h("td", { class: "num" }, h("a", { href: `#/run/${r.id}` }, String(r.id))),
      h("td", { class: "name" }, h("a", { href: `#/run/${r.id}`, class: "run-link" }, userText(name))),
      h("td", {}, statusBadge(r.status)),
      h("td", { class: "group" }, r.group ? h("a", { href: `#/group/${encodeURIComponent(r.group)}` }, userText(r.group)) : "–"),
      h("td", { class: "num" }, r.group && r.rank !== null && r.rank !== undefined ? String(r.rank) : "–"),
      h("td", {}, userText(r.host ?? "–")),
      h("td", { class: "num" }, int(r.steps)),
      h("td", { class: "num" }, num(r.median_step_ms, 1)),
      SHARES.map(([k]) => h("td", { class: "num" }, num(pct[k], 1))),
      h("td", { class: "num" }, int(r.skipped_updates ?? 0)),
      h("td", { class: "num" }, num(r.eval_s, 1)),
      h("td", { class: "num" }, int((r.dropped_events ?? 0) + (r.store_dropped_events ?? 0))),
      h("td", { class: "when", title: when(r.start_s) }, shortWhen(r.start_s)),
      h("td", { class: "num" }, r.start_s && end ? duration(end - r.start_s) : "–"),
    );
  }

  async function load() {
    clearTimeout(timer);
    let data;
    try {
      data = await api.runs({ name: state.name, status: state.status });
    } catch (err) {
      if (!state.gone) replace(tableBox, errorBox(err));
      timer = setTimeout(load, REFRESH_MS);
      return;
    }
    if (state.gone) return;
    const runs = data.runs || [];
    const heads = ["", "ID", "NAME", "STATUS", "GROUP", "RANK", "HOST", "STEPS", "MEDIAN_STEP_MS",
      ...SHARES.map(([, c]) => c), "SKIPPED", "EVAL_S", "DROPPED", "STARTED", "DURATION"];
    const numeric = new Set(["ID", "RANK", "STEPS", "MEDIAN_STEP_MS", ...SHARES.map(([, c]) => c), "SKIPPED", "EVAL_S", "DROPPED", "DURATION"]);
    replace(tableBox,
      runs.length
        ? h("table", { class: "runs" },
          h("thead", {}, h("tr", {}, heads.map((c) => h("th", { class: numeric.has(c) ? "num" : null }, c)))),
          h("tbody", {}, runs.map(row)))
        : h("p", { class: "muted" }, state.name || state.status
          ? "No run matches these filters."
          : "No runs yet: wrap a training loop in gpuprof.profile(\"name\") and it shows here."));
    document.body.dataset.ready = "1";
    timer = setTimeout(load, REFRESH_MS);
  }
  load();

  return () => {
    state.gone = true;
    clearTimeout(timer);
    clearTimeout(debounce);
  };
}
