"""The team's GPU-hours as the API, ``gpuprofctl rollup`` and the page show
them: a period from words (``--since 7d``), the rollup with times in unix
seconds, and its groups as CSV for spreadsheets."""

from __future__ import annotations

import csv
import io
import re
import time
from typing import Any

from gpuprofd.storage.reader import Reader
from gpuprofd.storage.reads.rollups import BY_FINDING, GROUPS, rollup

NS_PER_S = 10**9
#: Duration units (``--since``, ``--digest-every``), in seconds.
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SINCE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")


def duration_s(text: str) -> float | None:
    """``90s``, ``15m``, ``24h``, ``7d``, ``2w`` in seconds; None when *text* is
    not such a length."""
    m = _SINCE_RE.match(text)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


#: The longest period asked (a year and a bit: the rows are small).
MAX_PERIOD_S = 400 * 86400
#: What ``by`` takes, in the order the help lists them.
BY_CHOICES = (*GROUPS, BY_FINDING)
#: The CSV's columns, in order (each group's figures; hours are GPU-hours).
CSV_COLUMNS = (
    "key",
    "runs",
    "gpu_hours",
    "usd",
    "lost_gpu_hours",
    "lost_usd",
    "share",
    "lost_share",
    "prev_gpu_hours",
    "prev_lost_gpu_hours",
    "trend",
    "lost_trend",
)


def parse_since(text: str, now_ns: int) -> int:
    """*text* as the period's start, wall ns: a length back from *now_ns*
    (``24h``, ``7d``, ``30d``, ``2w``) or a moment in unix seconds.

    Raises:
        ValueError: neither, or more than :data:`MAX_PERIOD_S` back.
    """
    seconds = duration_s(text)
    if seconds is not None:
        start = now_ns - int(seconds * NS_PER_S)
    else:
        try:
            start = int(float(text) * NS_PER_S)
        except ValueError:
            raise ValueError(
                f"since={text!r}: give a length back (24h, 7d, 30d, 2w) or unix seconds"
            ) from None
    if not now_ns - MAX_PERIOD_S * NS_PER_S <= start < now_ns:
        raise ValueError(f"since={text!r}: the period must start in the last 400 days")
    return start


async def team_rollup(
    db: Reader, by: str, since: str, until_s: float | None = None, now_ns: int | None = None
) -> dict[str, Any]:
    """:func:`gpuprofd.storage.reads.rollups.rollup` for *since* (see
    :func:`parse_since`) to *until_s* (unix seconds; default now), with
    ``since_s`` / ``until_s`` and each week's ``start_s`` in unix seconds.

    Raises:
        ValueError: a bad *by*, *since* or *until_s*.
    """
    now = time.time_ns() if now_ns is None else now_ns
    until = now if until_s is None else int(until_s * NS_PER_S)
    out = await rollup(db, by, parse_since(since, until), until)
    out["since_s"] = out.pop("since_ns") / NS_PER_S
    out["until_s"] = out.pop("until_ns") / NS_PER_S
    for week in out["weeks"]:
        week["start_s"] = week.pop("start_ns") / NS_PER_S
    return out


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    # a spreadsheet runs a cell that starts like a formula: keep it text (OWASP CSV injection)
    return "'" + text if text[:1] in ("=", "+", "-", "@", "\t", "\r") else text


def to_csv(result: dict[str, Any]) -> str:
    """*result*'s groups as CSV: a header of :data:`CSV_COLUMNS`, one row a
    group (an empty cell: none; a key that starts like a formula gets a
    leading ``'``)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for g in result["groups"]:
        w.writerow([_cell(g.get(c)) for c in CSV_COLUMNS])
    return buf.getvalue()
