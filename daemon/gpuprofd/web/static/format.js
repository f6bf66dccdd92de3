// Number and time formatting for tables, legends and axes.

export const DASH = "–";

export function num(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return DASH;
  return Number(v).toFixed(digits);
}

export function int(v) {
  if (v === null || v === undefined) return DASH;
  return Math.round(v).toLocaleString("en-US");
}

export function pct(v, digits = 1) {
  return v === null || v === undefined ? DASH : `${Number(v).toFixed(digits)}%`;
}

/** A ratio (0..1) as a percentage. */
export function ratioPct(v, digits = 1) {
  return v === null || v === undefined ? DASH : `${(100 * v).toFixed(digits)}%`;
}

const UNITS = ["B", "kB", "MB", "GB", "TB"];

/** Bytes in powers of 1000 (as the CLI prints them). */
export function bytes(v, digits = 1) {
  if (v === null || v === undefined) return DASH;
  let x = Math.abs(v);
  let i = 0;
  while (x >= 1000 && i < UNITS.length - 1) { x /= 1000; i++; }
  return `${v < 0 ? "-" : ""}${x.toFixed(i === 0 ? 0 : digits)} ${UNITS[i]}`;
}

export function bps(v, _digits, splits) {
  if (v === null || v === undefined) return DASH;
  return `${splits ? bytesOnAxis(v, splits) : bytes(v)}/s`;
}

/** A y axis tick in bytes: every tick in the unit of the largest, or a
 * smaller one where the tick step is under 0.01 of it (4392.5 MB, not 4.393 GB
 * twice), with the decimals that tell neighbours apart (5.21 GB and 5.22 GB). */
export function bytesOnAxis(v, splits) {
  const top = Math.max(...splits.map((x) => Math.abs(x)), 0);
  const step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 0;
  let i = 0;
  while (top >= 1000 ** (i + 1) && i < UNITS.length - 1) i++;
  while (i > 0 && step > 0 && step / 1000 ** i < 0.01) i--;
  const unit = 1000 ** i;
  const digits = i === 0 ? 0 : tickDigits(splits.map((x) => x / unit));
  return `${(v / unit).toFixed(digits)} ${UNITS[i]}`;
}

/** Decimals (at most 6) that show an axis' tick step exactly, so its ticks
 * read apart: 40 and 40.5 °C, 2.5 and 5 MB/s, 0.0005 and 0.001. */
export function tickDigits(splits) {
  const step = splits.length > 1 ? Math.abs(splits[1] - splits[0]) : 0;
  if (!(step > 0)) return 0;
  let digits = Math.max(0, -Math.floor(Math.log10(step) + 1e-9));
  while (digits < 6 && Math.abs(step * 10 ** digits - Math.round(step * 10 ** digits)) > 1e-6 * step * 10 ** digits) digits++;
  return Math.min(6, digits);
}

export function ms(v) {
  if (v === null || v === undefined) return DASH;
  return v >= 100 ? `${v.toFixed(0)} ms` : `${v.toFixed(v >= 10 ? 1 : 2)} ms`;
}

/** A time in seconds in the unit that shows it: "4 ms" below a second (never
 * "0.0"), else "12.3 s" (as the CLI's summary and runs table say it). */
export function seconds(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return DASH;
  return v < 0.9995 ? `${(v * 1000).toFixed(0)} ms` : `${v.toFixed(1)} s`;
}

/** Unix seconds as local date and time. */
export function when(s) {
  if (s === null || s === undefined) return DASH;
  const d = new Date(s * 1000);
  return d.toLocaleString(undefined, { year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit" });
}

export function clock(s) {
  if (s === null || s === undefined) return DASH;
  return new Date(s * 1000).toLocaleTimeString(undefined, { hour12: false });
}

/** A duration in seconds as "1 h 02 min", "3 min 05 s", "12 s". */
export function duration(s) {
  if (s === null || s === undefined || s < 0) return DASH;
  if (s < 60) return `${s.toFixed(0)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${String(Math.floor(s % 60)).padStart(2, "0")} s`;
  return `${Math.floor(m / 60)} h ${String(m % 60).padStart(2, "0")} min`;
}

/** Unix seconds as a short local date and time ("Dec 2, 01:00"), for tables. */
export function shortWhen(s) {
  if (s === null || s === undefined) return DASH;
  return new Date(s * 1000).toLocaleString(undefined, { month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", hour12: false });
}
