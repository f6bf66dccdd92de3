// The /api/v1 client: one function per endpoint, JSON in, a thrown ApiError
// carrying the server's own message out.

export class ApiError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

const BASE = "/api/v1";

/** A team server's page whose session ended (logged out, expired): to the
 * login, which brings the viewer back to this view (its #/... hash). */
export function toLogin() {
  location.assign(`/login${location.hash}`);
}

async function get(path, params = {}) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") q.set(k, String(v));
  }
  const url = `${BASE}${path}${q.size ? `?${q}` : ""}`;
  let resp;
  try {
    resp = await fetch(url, { headers: { Accept: "application/json" } });
  } catch (err) {
    throw new ApiError(`the daemon did not answer (${err.message}); is gpuprofd still running?`, 0);
  }
  let body = null;
  try {
    body = await resp.json();
  } catch {
    // not JSON: said below
  }
  if (resp.status === 401) toLogin(); // only a team server asks for a login
  if (!resp.ok) {
    const said = body && typeof body.error === "string" ? body.error : `HTTP ${resp.status}`;
    throw new ApiError(said, resp.status);
  }
  if (body === null) throw new ApiError(`${url} answered something that is not JSON`, resp.status);
  return body;
}

const enc = encodeURIComponent;

export const api = {
  /** `node`: a node id or host name; `user`: who trained; `project`, `tag` (key=value); `from`/`to`: unix s (runs that ran in between). */
  runs: ({ name, status, node, user, project, tag, from, to, limit } = {}) =>
    get("/runs", { name, status, node, user, project, tag, from, to, limit }),
  nodes: () => get("/nodes"),
  /** The team's GPU-hours: `by` user, project, node, run or finding; `since` 7d, 30d, ... */
  rollups: ({ by, since } = {}) => get("/rollups", { by, since }),
  run: (id) => get(`/runs/${enc(id)}`),
  insights: (id) => get(`/runs/${enc(id)}/insights`),
  /** `from`/`to`: unix seconds (omit both for the whole run); `width`: px;
   * `parts`: "steps", "gpus", "host", comma-separated (omit: all). */
  series: (id, { from, to, width, parts } = {}) =>
    get(`/runs/${enc(id)}/series`, { from, to, width, parts }),
  kernels: (id, top = 20, evidence = null) => get(`/runs/${enc(id)}/kernels`, { top, evidence }),
  compare: (ids) => get("/compare", { ids: ids.join(",") }),
  /** Run `b` against run `a` (each an id or a name): speed-up, phases, findings, verdict. */
  comparePair: (a, b) => get("/compare", { a, b }),
  group: (group) => get(`/groups/${enc(group)}`),
};
