"""A run's project and tags: who pays for it and what it is, for the team's rollups.

``profile(project="llm-pretrain", tags={"team": "nlp"})`` or, for systemd
units and launchers, ``GPUPROF_PROJECT=llm-pretrain`` and
``GPUPROF_TAGS=team=nlp,queue=a100`` (see :mod:`gpuprof.config`). Both are
cleaned the same way on each side of the wire: control characters removed,
cut to the limits below, so a hostile label is stored as text, never refused
mid-training.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Longest project name kept (characters): a column in tables and a
#: Prometheus label value; 64 fits any team's naming.
MAX_PROJECT_CHARS = 64
#: Most tags on a run: labels for filtering, not a metadata store.
MAX_TAGS = 16
#: Longest tag key / value kept (characters).
MAX_TAG_KEY_CHARS = 32
MAX_TAG_VALUE_CHARS = 64


def _printable(text: Any, limit: int) -> str:
    """*text* as a string with control characters removed, stripped, cut to *limit*."""
    return "".join(c for c in str(text) if c.isprintable()).strip()[:limit]


def clean_project(project: Any) -> str | None:
    """A project name to store: printable, at most :data:`MAX_PROJECT_CHARS`
    characters; None (no project) for None or an empty name."""
    if project is None:
        return None
    return _printable(project, MAX_PROJECT_CHARS) or None


def clean_tags(tags: Mapping[Any, Any] | None) -> dict[str, str]:
    """Tags to store: at most :data:`MAX_TAGS` pairs (the first ones, in
    order), keys and values printable and cut to their limits; pairs with an
    empty key are dropped. Raises TypeError when *tags* is not a mapping."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise TypeError(f"gpuprof: tags must be a dict of str to str, got {type(tags).__name__}")
    out: dict[str, str] = {}
    for key, value in tags.items():
        k = _printable(key, MAX_TAG_KEY_CHARS)
        if k and len(out) < MAX_TAGS:
            out[k] = _printable("" if value is None else value, MAX_TAG_VALUE_CHARS)
    return out


def parse_tags(text: str) -> dict[str, str]:
    """``"team=nlp,queue=a100"`` (the ``GPUPROF_TAGS`` form) as cleaned tags; a
    pair without ``=`` is a key with an empty value."""
    pairs: dict[str, str] = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if key.strip():
            pairs[key.strip()] = value.strip()
    return clean_tags(pairs)


def tags_ok(tags: Any) -> bool:
    """Is *tags* what :func:`clean_tags` makes (the wire check)?"""
    return (
        type(tags) is dict
        and len(tags) <= MAX_TAGS
        and all(
            type(k) is str
            and type(v) is str
            and 0 < len(k) <= MAX_TAG_KEY_CHARS
            and len(v) <= MAX_TAG_VALUE_CHARS
            and k.isprintable()
            and v.isprintable()
            for k, v in tags.items()
        )
    )
