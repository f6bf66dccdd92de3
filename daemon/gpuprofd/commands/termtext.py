"""Text for the terminal views (``gpuprofctl top`` and ``watch``): strings
from a run made inert, figures formatted to fixed widths, the phase bar
and the sparkline. Pure: no I/O.

A run's strings (its name, user, host, a finding's title) come from
whoever trained or sent the run; a team server stores them as sent. A
terminal interprets control characters (``ESC [2J`` clears the screen), and
``rich.text.Text`` escapes markup but passes them through, so every such
string goes through :func:`safe` first: each control, format or separator
character becomes a visible escape (``\\x1b``), never the character itself.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from typing import Any

from rich.cells import cell_len, set_cell_size
from rich.text import Text

from gpuprof.summary import speedup_text
from gpuprof.window import PHASES

#: Unicode categories a terminal may act on (controls, bidi and other format
#: characters, line and paragraph separators, lone surrogates): shown escaped.
_INERT_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})

#: The letter and colour each phase of an iteration (:data:`gpuprof.window.PHASES`,
#: in stacking order) is drawn in.
PHASE_LETTER = {
    "loader_wait": "W",
    "between_steps": "H",
    "forward": "F",
    "backward": "B",
    "comm": "C",
    "optimizer": "O",
    "other": ".",
}
PHASE_LABEL = {
    "loader_wait": "wait",
    "between_steps": "between",
    "forward": "fwd",
    "backward": "bwd",
    "comm": "comm",
    "optimizer": "opt",
    "other": "other",
}
PHASE_STYLE = {
    "loader_wait": "red",
    "between_steps": "yellow",
    "forward": "blue",
    "backward": "cyan",
    "comm": "magenta",
    "optimizer": "green",
    "other": "bright_black",
}
SEVERITY_STYLE = {"HIGH": "bold red", "MED": "yellow", "LOW": "dim"}
#: Sparkline levels, lowest first.
SPARKS = "▁▂▃▄▅▆▇█"
ELLIPSIS = "…"


def safe(text: Any) -> str:
    """*text* as a string a terminal shows and never acts on: each control,
    format or separator character becomes ``\\xNN`` (below U+0100) or
    ``\\uNNNN``, so ``"a\\x1b[2J"`` reads ``a\\x1b[2J``; None becomes ``-``."""
    if text is None:
        return "-"
    out = []
    for c in str(text):
        if unicodedata.category(c) in _INERT_CATEGORIES:
            n = ord(c)
            out.append(
                f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"
            )
        else:
            out.append(c)
    return "".join(out)


def fit(text: str, width: int) -> str:
    """*text* cut to *width* terminal cells, ending in ``…`` when cut (wide
    characters count two)."""
    if width <= 0:
        return ""
    if cell_len(text) <= width:
        return text
    return set_cell_size(text, width - 1).rstrip() + ELLIPSIS


def cell(value: Any, width: int, right: bool = False) -> str:
    """:func:`safe` *value* fitted and padded to exactly *width* cells."""
    text = fit(safe(value), width)
    pad = " " * (width - cell_len(text))
    return pad + text if right else text + pad


def num(value: float | None, fmt: str = "{:.1f}") -> str:
    """*value* formatted, ``-`` when None (not known)."""
    return "-" if value is None else fmt.format(value)


def ms_text(value: float | None) -> str:
    """Milliseconds in about four significant digits: ``0.482``, ``52.1``, ``1234``."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.2f}"
    if value < 1000:
        return f"{value:.1f}"
    return f"{value:.0f}"


def rate_text(value: float | None) -> str:
    """Steps per second: ``0.05``, ``12.1``, ``480``."""
    if value is None:
        return "-"
    if value < 1:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:.0f}"


def gib(value: float | None) -> str:
    """Bytes as GiB, one decimal."""
    return "-" if value is None else f"{value / 2**30:.1f}"


def count_text(value: int | None) -> str:
    """A count, shortened past six digits: ``1520``, ``1.52M``."""
    if value is None:
        return "-"
    if value < 1_000_000:
        return str(value)
    return f"{value / 1e6:.2f}M"


def gain_of(finding: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(ms per iteration the fix would save, the most it could speed the run
    up, ×) of a finding: its ``gain_ms_per_iteration`` / ``gain_speedup_max``,
    at its top level or in its evidence; each None when it carries none."""
    evidence = finding.get("evidence")
    evidence = evidence if isinstance(evidence, Mapping) else {}

    def pick(key: str) -> float | None:
        for source in (finding, evidence):
            v = source.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                return float(v)
        return None

    return pick("gain_ms_per_iteration"), pick("gain_speedup_max")


def gain_text(finding: Mapping[str, Any]) -> str:
    """``saves 51.2 ms/it, up to 2.6×`` from :func:`gain_of`; ``""`` without a gain."""
    ms, speedup = gain_of(finding)
    parts = []
    if ms is not None:
        parts.append(f"saves {ms_text(ms)} ms/it")
    if speedup is not None:
        # the summary's digits (1.03×, not 1×); whole numbers from 10× to keep the width
        parts.append(f"up to {speedup_text(speedup)}" if speedup < 10 else f"up to {speedup:.0f}×")
    return ", ".join(parts)


def severity_tag(severity: Any) -> Text:
    """``[HIGH]``, ``[MED] ``, ``[LOW] `` in the severity's style (6 cells)."""
    sev = safe(severity)
    return Text(f"[{sev}]".ljust(6)[:6], style=SEVERITY_STYLE.get(sev, ""))


def finding_line(finding: Mapping[str, Any], width: int, prefix: str = "") -> Text:
    """One finding on one line of *width* cells: *prefix*, its severity, its
    title and its gain (the gain kept whole when the title must be cut)."""
    gain = gain_text(finding)
    tail = f"  ({gain})" if gain else ""
    head = Text(prefix)
    head.append_text(severity_tag(finding.get("severity")))
    head.append(" ")
    room = max(width - head.cell_len - cell_len(tail), 8)
    head.append(fit(safe(finding.get("title")), room))
    head.append(tail, style="bold")
    head.truncate(width, overflow="ellipsis")
    return head


def phase_bar(pct: Mapping[str, float | None], width: int) -> Text:
    """The phases' shares (%) as *width* letters (``WWWFFBBBO.``), each
    phase's cells in its colour; the largest remainders get the cells
    rounding leaves, so the bar is always *width* long. Blank (dots) when
    no share is known."""
    shares = [(p, max(float(pct.get(p) or 0), 0.0)) for p in PHASES]
    total = sum(s for _, s in shares)
    if total <= 0:
        return Text("·" * width, style="dim")
    exact = [(p, width * s / total) for p, s in shares]
    cells = {p: int(x) for p, x in exact}
    left = width - sum(cells.values())
    for p, _ in sorted(exact, key=lambda e: e[1] - int(e[1]), reverse=True)[:left]:
        cells[p] += 1
    bar = Text()
    for p in PHASES:
        if cells[p]:
            bar.append(PHASE_LETTER[p] * cells[p], style=PHASE_STYLE[p])
    return bar


def phase_legend(pct: Mapping[str, float | None] | None = None) -> Text:
    """``W wait 42%  F fwd 15% ...``: each phase's letter and name, with its
    share when *pct* gives one (``comm`` and ``between_steps`` left out when
    the run had none)."""
    out = Text()
    for p in PHASES:
        share = None if pct is None else pct.get(p)
        if pct is not None and p in ("comm", "between_steps") and share is None:
            continue
        if out:
            out.append("  ")
        out.append(PHASE_LETTER[p], style=PHASE_STYLE[p])
        out.append(f" {PHASE_LABEL[p]}")
        if pct is not None:
            out.append(f" {num(share, '{:.0f}')}%")
    return out


def sparkline(values: Sequence[float | None], top: float | None = None) -> str:
    """One character per value, ``▁`` to ``█`` of *top* (default: their
    maximum); a space for None."""
    known = [v for v in values if v is not None]
    top = top if top is not None else (max(known) if known else 0.0)
    out = []
    for v in values:
        if v is None:
            out.append(" ")
        elif top <= 0:
            out.append(SPARKS[0])
        else:
            level = min(len(SPARKS) - 1, max(0, math.ceil(len(SPARKS) * v / top) - 1))
            out.append(SPARKS[level])
    return "".join(out)
