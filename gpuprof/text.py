"""Text from outside made safe to store and show: printable, encodable, bounded.

Below both :mod:`gpuprof.protocol` (which checks names on the wire) and
:mod:`gpuprof.kernels` (which cleans kernel names from profiler events), so
neither imports the other for it.
"""

from __future__ import annotations

import unicodedata

#: Unicode categories never allowed in names: controls, format characters
#: (bidi overrides such as U+202E), line/paragraph separators, surrogates
#: (``os.fsdecode`` of non-UTF-8 bytes yields lone surrogates).
UNPRINTABLE_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})


def is_printable(text: str) -> bool:
    """Whether *text* holds no character of :data:`UNPRINTABLE_CATEGORIES`."""
    return text.isprintable() or not any(
        unicodedata.category(c) in UNPRINTABLE_CATEGORIES for c in text
    )


def _escape_surrogate(c: str) -> str:
    """*c* unless a lone surrogate: ``\\xNN`` for an undecodable byte
    (``surrogateescape``'s U+DC80..U+DCFF), else ``\\uNNNN``."""
    n = ord(c)
    if 0xDC80 <= n <= 0xDCFF:
        return f"\\x{n - 0xDC00:02x}"
    if 0xD800 <= n <= 0xDFFF:
        return f"\\u{n:04x}"
    return c


def clean_text(text: object, max_chars: int, keep_newlines: bool = False) -> str:
    """Any string made encodable and printable: lone surrogates (undecodable
    bytes) become ``\\xNN`` escapes (other lone surrogates, which no
    decoder makes but Python strings may hold: ``\\uNNNN``), control, format
    and separator characters become spaces (newlines and tabs survive if
    *keep_newlines*), and the result is cut to *max_chars*."""
    raw = str(text)
    try:
        raw.encode("utf-8")
    except UnicodeEncodeError:
        try:
            raw = raw.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate no decoder made (group="\ud800")
            raw = "".join(_escape_surrogate(c) for c in raw)
    keep = "\n\t" if keep_newlines else ""
    return "".join(
        c if c in keep or unicodedata.category(c) not in UNPRINTABLE_CATEGORIES else " "
        for c in raw
    )[:max_chars]
