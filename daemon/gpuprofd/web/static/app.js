// The hash router: #/runs (default), #/run/<id>, #/compare/<id>,<id>[,...],
// #/group/<group id, URL-encoded>, #/gpu-hours?since=7d. Each view's render(root, params) returns
// its cleanup, called before the next view renders.

import { h, replace } from "./dom.js";
import * as compare from "./views/compare.js";
import * as group from "./views/group.js";
import * as gpuhours from "./views/gpuhours.js";
import * as run from "./views/run.js";
import * as runs from "./views/runs.js";

const VIEWS = { runs, run, compare, group, "gpu-hours": gpuhours };
const root = document.getElementById("view");
let cleanup = null;

function notFound(what) {
  replace(root, h("div", { class: "error", role: "alert" }, what, " ", h("a", { href: "#/runs" }, "See the runs.")));
  document.body.dataset.ready = "1";
  return null;
}

/** Parse location.hash into [view name, params], or a message saying what is wrong. */
export function parse(hash) {
  const [path, qs = ""] = hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/");
  const query = new URLSearchParams(qs);
  switch (parts[0]) {
    case "":
    case "runs":
      return ["runs", { query }];
    case "run": {
      const id = Number(parts[1]);
      return Number.isInteger(id) && id >= 0 ? ["run", { id }] : `"${parts[1] ?? ""}" is not a run id.`;
    }
    case "compare": {
      const ids = (parts[1] || "").split(",").filter(Boolean).map(Number);
      if (ids.length < 2 || !ids.every((i) => Number.isInteger(i) && i >= 0)) {
        return "Compare needs two or more run ids: #/compare/1,2.";
      }
      return ["compare", { ids }];
    }
    case "group": {
      const g = decodeURIComponent(parts.slice(1).join("/"));
      return g ? ["group", { group: g }] : "Which group? #/group/<group id>.";
    }
    case "gpu-hours":
      return ["gpu-hours", { query }];
    case "run-uuid": // a node's link to a forwarded run, back from the login: the server resolves it
      return /^[0-9a-f-]{36}$/.test(parts[1] || "") ? ["run-uuid", { uuid: parts[1] }] : `"${parts[1] ?? ""}" is not a run's UUID.`;
    default:
      return `No page "${parts[0]}".`;
  }
}

function route() {
  if (cleanup) cleanup();
  cleanup = null;
  document.body.dataset.ready = "";
  const target = parse(location.hash || "#/runs");
  if (typeof target === "string") {
    notFound(target);
    return;
  }
  const [name, params] = target;
  if (name === "run-uuid") {
    location.replace(`/runs/${params.uuid}`); // the team server redirects to the run's page
    return;
  }
  document.body.dataset.view = name;
  for (const a of document.querySelectorAll("nav a")) {
    a.setAttribute("aria-current", a.dataset.nav === document.body.dataset.view ? "page" : "false");
  }
  window.scrollTo(0, 0);
  cleanup = VIEWS[name].render(root, params) || null;
}

window.addEventListener("hashchange", route);
// charts take their colours from the page's scheme: redraw on a switch
matchMedia("(prefers-color-scheme: dark)").addEventListener("change", route);
route();
