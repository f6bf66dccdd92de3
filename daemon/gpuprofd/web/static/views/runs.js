// #/runs: the runs, newest first, filtered by name, status, node (shown once
// runs came from more than one: a team server), user and time; the columns of
// `gpuprofctl runs`. Tick two or more to compare them. The filters live in
// the hash (#/runs?name=x&status=running&node=n&user=u&within=24h), so a
// filtered list can be bookmarked and a login comes back to it.

import { api } from "../api.js";
import { h, replace, userText } from "../dom.js";
import { duration, int, num, seconds, shortWhen, when } from "../format.js";
import { errorBox, statusBadge } from "./panels.js";

const REFRESH_MS = 5000;
/** The shares of iteration time: their key, header and what they are. */
const SHARES = [
  ["loader_wait", "Wait %", "Loader wait: time waiting on the data loader"],
  ["forward", "Fwd %", "Forward"],
  ["backward", "Bwd %", "Backward (collectives not hidden under it are Comm %)"],
  ["comm", "Comm %", "Collectives not hidden under backward (DDP's all-reduce)"],
  ["optimizer", "Opt %", "Optimizer step"],
  ["other", "Other %", "The rest of the step: unlabelled time, custom phases"],
];
/** The columns (`gpuprofctl runs`' in words, with node, user, start and
 * duration): header, tooltip, class ("num": numeric; the four text columns
 * from runs are named: style.css gives them their share of the width). */
const COLUMNS = [
  ["", null, null],
  ["ID", "The run's id (gpuprofctl insights DB ID)", "num"],
  ["Name", null, "name"],
  ["Status", null, null],
  ["Group", "torchrun's run id or profile(group=...)", "group"],
  ["Rank", "The run's global rank in its group", "num"],
  ["Node", null, "node"],
  ["User", "Who trained", "user"],
  ["Project", "profile(project=...) or GPUPROF_PROJECT", "user"],
  ["Steps", "Every step recorded", "num"],
  ["Median step (ms)", "Steady-state median of loader wait + step, warm-up steps excluded", "num"],
  ...SHARES.map(([, head, tip]) => [head, `${tip}: share of iteration time (loader wait + step)`, "num"]),
  ["Skipped", "Steps whose optimizer update was skipped (inf/NaN gradients)", "num"],
  ["Eval", "Time in evaluation (no-grad forwards) outside steps", "num"],
  ["Dropped", "Events lost: not sent by the training process, or not stored", "num"],
  ["Started", null, null],
  ["Duration", null, "num"],
];
/** A host name in two parts, both text: its first label ("gpu-node-017"), which
 * tells a cluster's nodes apart and which the column keeps whole, and the
 * domain they all share (".cluster.internal"), which is cut first; the whole
 * name is the tooltip. */
function hostText(host) {
  const str = String(host);
  const dot = str.indexOf(".", 1);
  const el = userText(str, "host", true);
  if (dot > 0) replace(el, h("span", { class: "label" }, str.slice(0, dot)), str.slice(dot));
  return el;
}
const STATUSES = ["", "running", "finished", "failed", "lost"];
/** The time filter: runs that ran within the last ... (seconds). */
const WITHIN = [
  ["", "any time"],
  ["1h", "the last hour", 3600],
  ["24h", "the last 24 hours", 86400],
  ["7d", "the last 7 days", 7 * 86400],
  ["30d", "the last 30 days", 30 * 86400],
];

export function render(root, { query }) {
  const state = {
    name: query.get("name") || "",
    status: query.get("status") || "",
    node: query.get("node") || "",
    user: query.get("user") || "",
    project: query.get("project") || "",
    within: WITHIN.some(([k]) => k === query.get("within")) ? query.get("within") : "",
    picked: new Set(),
    gone: false,
    nodesDrawn: "",
  };
  const nameInput = h("input", {
    type: "search", id: "filter-name", placeholder: "name contains…", value: state.name,
    "aria-label": "Filter by name",
  });
  const statusSelect = h("select", { id: "filter-status", "aria-label": "Filter by status" },
    STATUSES.map((s) => h("option", { value: s, selected: s === state.status }, s || "any status")));
  const nodeSelect = h("select", { id: "filter-node", "aria-label": "Filter by node", hidden: true });
  const userInput = h("input", {
    type: "search", id: "filter-user", placeholder: "user", value: state.user,
    "aria-label": "Filter by user", size: 10,
  });
  const projectInput = h("input", {
    type: "search", id: "filter-project", placeholder: "project", value: state.project,
    "aria-label": "Filter by project", size: 10,
  });
  const withinSelect = h("select", { id: "filter-time", "aria-label": "Filter by time" },
    WITHIN.map(([k, label]) => h("option", { value: k, selected: k === state.within }, k ? `ran in ${label}` : label)));
  const compareBtn = h("button", { type: "button", id: "compare", disabled: true }, "Compare selected");
  const tableBox = h("div", { class: "table-wrap", id: "runs" });
  replace(root,
    h("header", { class: "run-head" }, h("h1", {}, "Runs")),
    h("div", { class: "filters" }, nameInput, statusSelect, nodeSelect, userInput, projectInput, withinSelect, compareBtn),
    tableBox);
  document.title = "Runs · gpuprof";

  let timer = null;
  let debounce = null;
  nameInput.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { state.name = nameInput.value; load(); }, 250);
  });
  userInput.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { state.user = userInput.value.trim(); load(); }, 250);
  });
  projectInput.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(() => { state.project = projectInput.value.trim(); load(); }, 250);
  });
  statusSelect.addEventListener("change", () => { state.status = statusSelect.value; load(); });
  nodeSelect.addEventListener("change", () => { state.node = nodeSelect.value; load(); });
  withinSelect.addEventListener("change", () => { state.within = withinSelect.value; load(); });

  /** The filters into the hash (no reload: replaceState fires no hashchange). */
  function remember() {
    const q = new URLSearchParams();
    for (const k of ["name", "status", "node", "user", "project", "within"]) if (state[k]) q.set(k, state[k]);
    const hash = `#/runs${q.size ? `?${q}` : ""}`;
    if (location.hash !== hash && !(location.hash === "" && hash === "#/runs")) history.replaceState(null, "", hash);
  }

  /** The node filter's choices: shown once runs came from more than one node
   * (or one is picked); each by its host name, its value the node's id. */
  async function loadNodes() {
    let nodes;
    try {
      nodes = (await api.nodes()).nodes || [];
    } catch {
      return; // the list says why, if the server is down
    }
    if (state.gone) return;
    const value = (n) => n.node ?? n.host ?? "";
    const choices = nodes.filter((n) => value(n));
    const known = choices.some((n) => value(n) === state.node);
    const drawn = JSON.stringify([state.node, choices]);
    if (drawn === state.nodesDrawn) return; // unchanged: an open list stays open
    state.nodesDrawn = drawn;
    replace(nodeSelect,
      h("option", { value: "" }, "any node"),
      choices.map((n) => h("option", { value: value(n), selected: value(n) === state.node, title: n.node },
        `${n.host ?? n.node} (${n.runs})`)), // text nodes: an option holds no markup
      state.node && !known ? h("option", { value: state.node, selected: true }, state.node) : null);
    nodeSelect.hidden = choices.length < 2 && !state.node;
  }

  // The text columns: each value in a box cut to the column (".cut"), its
  // whole value the tooltip.
  function nodeOf(r) {
    const key = r.node ?? r.host;
    if (!key) return "–";
    return h("a", { href: `#/runs?node=${encodeURIComponent(key)}`, class: "node-link" }, hostText(r.host ?? r.node));
  }
  function userOf(r) {
    if (!r.user) return "–";
    return h("a", { href: `#/runs?user=${encodeURIComponent(r.user)}`, class: "user-link cut" }, userText(r.user, "", true));
  }
  function projectOf(r) {
    if (!r.project) return "–";
    return h("a", { href: `#/runs?project=${encodeURIComponent(r.project)}`, class: "project-link cut" }, userText(r.project, "", true));
  }
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
      h("td", { class: "name" }, h("a", { href: `#/run/${r.id}`, class: "run-link cut" }, userText(name, "", true))),
      h("td", {}, statusBadge(r.status)),
      h("td", { class: "group" }, r.group
        ? h("a", { href: `#/group/${encodeURIComponent(r.group)}`, class: "cut" }, userText(r.group, "", true))
        : "–"),
      h("td", { class: "num" }, r.group && r.rank !== null && r.rank !== undefined ? String(r.rank) : "–"),
      h("td", { class: "node" }, nodeOf(r)),
      h("td", { class: "user" }, userOf(r)),
      h("td", { class: "user project" }, projectOf(r)),
      h("td", { class: "num" }, int(r.steps)),
      h("td", { class: "num" }, num(r.median_step_ms, 1)),
      SHARES.map(([k]) => h("td", { class: "num" }, num(pct[k], 1))),
      h("td", { class: "num" }, int(r.skipped_updates ?? 0)),
      h("td", { class: "num" }, r.eval_s ? seconds(r.eval_s) : "–"),
      h("td", { class: "num" }, int((r.dropped_events ?? 0) + (r.store_dropped_events ?? 0))),
      h("td", { class: "when", title: when(r.start_s) }, shortWhen(r.start_s)),
      h("td", { class: "num" }, r.start_s && end ? duration(end - r.start_s) : "–"),
    );
  }

  async function load() {
    clearTimeout(timer);
    let data;
    remember();
    loadNodes(); // beside the list: a node that starts sending shows up in the filter
    const seconds = WITHIN.find(([k]) => k === state.within)?.[2];
    try {
      data = await api.runs({
        name: state.name,
        status: state.status,
        node: state.node,
        user: state.user,
        project: state.project,
        from: seconds ? Math.floor(Date.now() / 1000 - seconds) : null,
      });
    } catch (err) {
      if (!state.gone) replace(tableBox, errorBox(err));
      timer = setTimeout(load, REFRESH_MS);
      return;
    }
    if (state.gone) return;
    const runs = data.runs || [];
    replace(tableBox,
      runs.length
        ? h("table", { class: "runs" },
          h("thead", {}, h("tr", {}, COLUMNS.map(([c, tip, cls]) =>
            h("th", { class: cls, title: tip, scope: "col" }, c)))),
          h("tbody", {}, runs.map(row)))
        : h("p", { class: "muted" }, state.name || state.status || state.node || state.user || state.project || state.within
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
