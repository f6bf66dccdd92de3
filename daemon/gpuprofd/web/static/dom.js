// DOM building without HTML strings: every value from a run goes in as a text
// node or an attribute, never parsed as markup.

/**
 * Make an element. `attrs`: attributes (`class`, `href`, `data-*`, ...), with
 * `on*` functions as listeners and `style` an object; `children`: nodes,
 * strings (inserted as text) or arrays of them; null/false are skipped.
 */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "style" && typeof v === "object") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

/** Append children (nodes, strings as text, nested arrays) to `el`. */
export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** Replace everything in `el` with `children`. */
export function replace(el, ...children) {
  el.replaceChildren();
  return append(el, children);
}

/** The longest tooltip a run-supplied string gets (a 10 kB name's is cut). */
const TITLE_CHARS = 2000;

/** A run-supplied string, isolated for bidi (a right-to-left override in a
 * run name cannot reorder the text around it) and with its full value as a
 * tooltip when it may be shown shortened: past 60 characters, or always with
 * `tip` (a table cell that cuts it to its column's width). The tooltip is the
 * `title` property: text, never markup. */
export function userText(s, cls = "", tip = false) {
  const str = s === null || s === undefined ? "" : String(s);
  const el = h("bdi", { class: cls || null }, str);
  if (tip || str.length > 60) el.title = str.slice(0, TITLE_CHARS);
  return el;
}
