"""The one read path of the 2 Hz samples, wherever they are stored: a boot's
host samples (``host_samples``) and a run's CPU samples (``run_cpu_samples``),
recent ones as rows, older ones packed per block of :data:`SAMPLE_PACK_NS`
into ``host_packs`` (keyed by ``boot_key``: the boot id, ``''`` for none) /
``run_cpu_packs``
(:mod:`gpuprofd.storage.upkeep.samplepack`, :mod:`gpuprofd.storage.samplecodec`).
Every reader of those samples (the rules' context, the job's CPU, the charts,
the live feeds, ``gpuprofctl top``) reads through :func:`read` or
:func:`span`, so none sees them half packed otherwise than the others: a
block is packed in one transaction (inserted packed and deleted as rows
together), and a sample arriving for a packed block later stays a row, read
beside the pack.

SQL over the sample rows is left only where no sample is packed: the host
rollup pass (:mod:`gpuprofd.storage.upkeep.hostrollup`), the host chart's
buckets and live feed use it where :func:`packed_in` says the window holds
no pack (the packing waits for the rollups, and a boot's newest samples
are rows), and read through here where it does.
Figures a reader sums or averages are computed here in Python, in time
order, whether the samples were rows or packed, so a packed database gives
the same numbers as the same database unpacked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpuprofd.storage import unreadable
from gpuprofd.storage.reader import Reader
from gpuprofd.storage.samplecodec import HOST_COLUMNS, RUN_CPU_COLUMNS, Samples, unpack

__all__ = [
    "HOST",
    "RUN_CPU",
    "SAMPLE_PACK_NS",
    "Samples",
    "Table",
    "packed_in",
    "read",
    "span",
    "sum_in_order",
]

#: The span of one packed block, ns: 1,200 host samples at the daemon's 2 Hz,
#: 60 host rollup blocks; a day is 144 blocks per boot and per run.
SAMPLE_PACK_NS = 600_000_000_000
_NONE = 2**62


@dataclass(frozen=True)
class Table:
    """A sample table, its packs and the key they share (``boot_id`` / ``run_id``)."""

    rows: str
    packs: str
    key: str
    columns: tuple[str, ...]
    match: str
    """How rows match the key (``=`` where it is never NULL: the index is used)."""
    pack_key: str
    """The packs' key column: the key, or ``COALESCE(key, '')`` (``boot_key``)."""

    def packed(self, key: Any) -> Any:
        """The packs' key of the rows' *key*."""
        return "" if key is None and self.pack_key != self.key else key

    def unpack(self, key: Any, block: Any, data: Any) -> Samples | None:
        """*key*'s packed *block* (*data*); None where its bytes are damaged:
        left out, counted (:func:`gpuprofd.storage.unreadable.block`)."""
        if self.key == "run_id":
            return unreadable.block(data, unpack, self.packs, key, block)
        return unreadable.block(data, unpack, self.packs, None, (self.packed(key), block))


HOST = Table(
    "host_samples", "host_packs", "boot_id", HOST_COLUMNS, "IS NOT DISTINCT FROM", "boot_key"
)
RUN_CPU = Table("run_cpu_samples", "run_cpu_packs", "run_id", RUN_CPU_COLUMNS, "=", "run_id")


def _rows_sql(t: Table) -> str:
    return (
        f"SELECT {', '.join(t.columns)} FROM {t.rows} WHERE {t.key} {t.match} ? "
        "AND mono_ns >= ? AND mono_ns <= ? ORDER BY mono_ns"
    )


def _both_sql(t: Table) -> str:
    """A key's packs (``k`` 0: ``data``) and rows (``k`` 1) in [lo, hi] in one
    statement, so one snapshot: a block packed meanwhile is read either
    packed or as rows, never both or neither."""
    nulls = ", ".join(f"NULL AS {c}" for c in t.columns)
    return (
        f"SELECT 0 AS k, block AS b, data, {nulls} FROM {t.packs} WHERE {t.pack_key} = ? "
        "AND t_max_ns >= ? AND t_min_ns <= ? UNION ALL "
        f"SELECT 1, 0, NULL, {', '.join(t.columns)} FROM {t.rows} "
        f"WHERE {t.key} {t.match} ? AND mono_ns >= ? AND mono_ns <= ? "
        "ORDER BY k, b, mono_ns"
    )


async def packed_in(db: Reader, t: Table, key: Any, lo: int = -_NONE, hi: int = _NONE) -> bool:
    """Whether *key* has a packed block with a sample in [*lo*, *hi*] (ns)."""
    row = await db.fetchone(
        f"SELECT 1 AS x FROM {t.packs} WHERE {t.pack_key} = ? AND t_max_ns >= ? "
        "AND t_min_ns <= ? LIMIT 1",
        (t.packed(key), lo, hi),
    )
    return row is not None


async def read(db: Reader, t: Table, key: Any, lo: int = -_NONE, hi: int = _NONE) -> Samples:
    """*key*'s samples with ``lo <= mono_ns <= hi`` (ns), packed or not, as
    columns in :attr:`Table.columns`' order, by ``mono_ns`` (a row stored
    for a packed block after it was packed comes after the pack's samples of
    its time). A row without a ``mono_ns`` is never read; a packed block
    whose bytes are damaged is left out (counted).

    Raises:
        DatabaseError: unreadable.
    """
    if not await packed_in(db, t, key):
        got = await db.fetchtuples(_rows_sql(t), (key, lo, hi))
        if not await packed_in(db, t, key):  # packs are only added: none meanwhile
            return Samples.from_rows(t.columns, got)
    got = await db.fetchtuples(_both_sql(t), (t.packed(key), lo, hi, key, lo, hi))
    n = len(t.columns)
    packed = (t.unpack(key, r[1], r[2]) for r in got if r[0] == 0)
    parts = [_within(p, lo, hi) for p in packed if p is not None]
    raw = [tuple(r[3 : 3 + n]) for r in got if r[0] == 1]
    parts.append(Samples.from_rows(t.columns, raw))
    out = Samples.concat(t.columns, parts)
    if len(parts) > 1 and raw:
        ns = out.times()
        if not bool((ns[1:] >= ns[:-1]).all()):
            out = out.take(np.argsort(ns, kind="stable"))
    return out


def _within(s: Samples, lo: int, hi: int) -> Samples:
    ns = s.times()
    if not len(ns) or (ns[0] >= lo and ns[-1] <= hi):
        return s
    return s.take((ns >= lo) & (ns <= hi))


async def span(
    db: Reader, t: Table, key: Any, lo: int = -_NONE, hi: int = _NONE
) -> tuple[int, int] | None:
    """The first and last ``mono_ns`` of *key*'s samples in [*lo*, *hi*]
    (ns), packed or not; None: none. Packs wholly inside are taken by their
    bounds, the (at most two) cut by the window read."""
    rows = f"FROM {t.rows} WHERE {t.key} {t.match} ? AND mono_ns >= ? AND mono_ns <= ?"
    row = await db.fetchone(  # MIN and MAX apart: two index lookups, not a scan of the span
        f"SELECT (SELECT MIN(mono_ns) {rows}) AS a, (SELECT MAX(mono_ns) {rows}) AS z",
        (key, lo, hi) * 2,
    )
    got = [] if row is None or row["a"] is None else [int(row["a"]), int(row["z"])]
    where = f"FROM {t.packs} WHERE {t.pack_key} = ? AND t_max_ns >= ? AND t_min_ns <= ?"
    params = (t.packed(key), lo, hi)
    row = await db.fetchone(
        f"SELECT MIN(t_min_ns) AS a, MAX(t_max_ns) AS z {where} AND t_min_ns >= ? "
        "AND t_max_ns <= ?",
        (*params, lo, hi),
    )
    if row is not None and row["a"] is not None:
        got += [int(row["a"]), int(row["z"])]
    cut = await db.fetchall(
        f"SELECT block, data {where} AND (t_min_ns < ? OR t_max_ns > ?)", (*params, lo, hi)
    )
    for b, data in cut:
        got_block = t.unpack(key, b, data)
        if got_block is None:
            continue
        ns = _within(got_block, lo, hi).times()
        if len(ns):
            got += [int(ns.min()), int(ns.max())]
    return (min(got), max(got)) if got else None


def sum_in_order(values: Sequence[float] | np.ndarray) -> float:
    """The sum of *values* (not empty) as float64, added one after another
    as SQL's ``SUM`` adds rows (a cumulative sum is sequential; ``np.sum``
    adds pairwise and Python 3.12's ``sum()`` compensates: other last bits)."""
    return float(np.cumsum(np.asarray(values, dtype=np.float64))[-1])


def mean(values: np.ndarray) -> float | None:
    """The mean of *values* (float64) leaving NaN (NULL) out, summed in
    order as SQL's ``AVG`` sums; None: no value."""
    kept = values[~np.isnan(values)]
    return sum_in_order(kept) / len(kept) if len(kept) else None


def total(values: np.ndarray) -> float | None:
    """The sum of *values* leaving NaN (NULL) out, in order; None: no value."""
    kept = values[~np.isnan(values)]
    return sum_in_order(kept) if len(kept) else None


def cores_at(cpu: Samples, times: Sequence[int] | np.ndarray) -> np.ndarray:
    """The ``cores`` (float64, NaN: NULL) of the CPU samples *cpu* taken at
    one of *times* (ns), in *cpu*'s order."""
    return cpu.numbers("cores")[np.isin(cpu.times(), np.asarray(times, np.int64))]
