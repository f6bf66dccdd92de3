// The one owner of the page's WebSocket (/api/v1/live) and of its cursors.
//
// A view calls `live.watch(runId, cursors, handlers)`; this module sends
// {"run", "cursors"} on every open, moves the cursors forward as rows arrive
// (so a reconnect resumes where the page is, and a message never repeats what
// it holds), reconnects with capped exponential backoff and jitter, and on a
// server "reset" asks the view to re-fetch (handlers.reset() resolves to new
// cursors) before it resumes.

import { toLogin } from "./api.js";

const BACKOFF_MIN_MS = 500;
// The close code of a socket whose login ended (a team server's logout).
const SESSION_ENDED = 1008;
const BACKOFF_MAX_MS = 10_000;

class Live {
  constructor() {
    this.ws = null;
    this.run = null;
    this.setCursors(null);
    this.handlers = {};
    this.backoff = BACKOFF_MIN_MS;
    this.timer = null;
    this.resetting = false;
    this.generation = 0;
    this.setState("idle");
  }

  /** The connection's state on <body data-live=...>: idle, connecting, open, closed. */
  setState(state) {
    this.state = state;
    document.body.dataset.live = state;
    this.handlers.state?.(state);
  }

  /**
   * Follow run `runId` from `cursors` ({step: last step index held or -1,
   * t: last sample time held, unix s, or 0}). handlers: steps(rows),
   * gpus(samples), host(samples), insights(list, gains), run(run), reset() ->
   * Promise<cursors>, state(s). Replaces any run watched before.
   */
  watch(runId, cursors, handlers) {
    this.stop();
    this.run = runId;
    this.setCursors(cursors);
    this.handlers = handlers || {};
    this.backoff = BACKOFF_MIN_MS;
    this.connect();
  }

  /** Stop following (the view went away). */
  stop() {
    this.generation++;
    clearTimeout(this.timer);
    this.timer = null;
    if (this.ws) {
      this.ws.onclose = this.ws.onmessage = this.ws.onerror = this.ws.onopen = null;
      this.ws.close();
      this.ws = null;
    }
    this.run = null;
    this.handlers = {};
    this.setState("idle");
  }

  connect() {
    const gen = this.generation;
    const url = new URL("/api/v1/live", location.href);
    url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
    this.setState("connecting");
    const ws = new WebSocket(url);
    this.ws = ws;
    ws.onopen = () => {
      if (gen !== this.generation) return;
      this.backoff = BACKOFF_MIN_MS;
      this.setState("open");
      this.hello();
    };
    ws.onmessage = (ev) => {
      if (gen !== this.generation) return;
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch {
        return; // not ours to crash on
      }
      this.dispatch(msg);
    };
    ws.onerror = () => {}; // onclose follows and reconnects
    ws.onclose = (ev) => {
      if (gen !== this.generation) return;
      this.ws = null;
      this.setState("closed");
      if (ev.code === SESSION_ENDED) {
        toLogin();
        return;
      }
      const wait = this.backoff * (0.75 + Math.random() * 0.5);
      this.backoff = Math.min(this.backoff * 2, BACKOFF_MAX_MS);
      this.timer = setTimeout(() => this.connect(), wait);
    };
  }

  hello() {
    if (this.ws?.readyState === WebSocket.OPEN) {
      this.ws.send(JSON.stringify({ run: this.run, cursors: this.cursors }));
    }
  }

  async dispatch(msg) {
    const h = this.handlers;
    if (this.resetting && msg.type !== "reset") return; // rows from before the re-fetch
    switch (msg.type) {
      case "steps": {
        const rows = (msg.rows || []).filter((r) => r.step > this.cursors.step);
        if (!rows.length) return;
        this.cursors.step = Math.max(...rows.map((r) => r.step));
        h.steps?.(rows);
        break;
      }
      case "gpus":
      case "host": {
        // per stream (each GPU's, the host's) what is held; repeats dropped
        const key = (x) => (msg.type === "gpus" ? `gpu:${x.uuid}` : "host");
        const held = (k) => this.streamT.get(k) ?? this.cursors.t;
        const samples = (msg.samples || []).filter((x) => x.t > held(key(x)));
        if (!samples.length) return;
        for (const x of samples) this.streamT.set(key(x), Math.max(held(key(x)), x.t));
        // one sample cursor for every stream: the oldest one's, so none loses
        // a sample on reconnect (the others' repeats are filtered above)
        this.cursors.t = Math.min(...this.streamT.values());
        h[msg.type]?.(samples);
        break;
      }
      case "insights":
        h.insights?.(msg.insights || [], msg.gains || null);
        break;
      case "run":
        h.run?.(msg.run);
        break;
      case "reset": {
        if (this.resetting || !h.reset) return;
        this.resetting = true;
        const gen = this.generation;
        try {
          const cursors = await h.reset();
          if (gen !== this.generation) return;
          if (cursors) this.setCursors(cursors);
        } finally {
          this.resetting = false;
        }
        this.hello();
        break;
      }
      default:
        break;
    }
  }

  setCursors(cursors) {
    this.cursors = { step: cursors?.step ?? -1, t: cursors?.t ?? 0 };
    this.streamT = new Map();
  }
}

export const live = new Live();
