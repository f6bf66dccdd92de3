"""The step pack codec gives back every row exactly: NULLs, integer and
non-integer columns, phases as a dict (or NULL) whatever their text, the
optimizers text; damaged data is a clear error."""

from __future__ import annotations

import zlib

import orjson
import pytest

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import stepcodec


def _row(i: int, **over: object) -> tuple[object, ...]:
    base: dict[str, object] = {
        "step": i,
        "t0_ns": 10**15 + i * 500_000_123,
        "t1_ns": 10**15 + (i + 1) * 500_000_000,
        "wait_ns": 1_000 * (i % 7),
        "explicit": i % 2,
        "micro": 4,
        "phases": orjson.dumps({"forward": 10**8 + i, "backward": 2 * 10**8 - i}).decode(),
        "skipped": 0,
        "eval_ns": 0,
        "optimizers": None,
        "mem_allocated_bytes": 61 * 2**30 + i,
        "mem_reserved_bytes": 68 * 2**30,
        "mem_peak_bytes": None,
        "traced": 0,
    }
    base.update(over)
    return tuple(base[c] for c in stepcodec.COLUMNS)


def _read(row: tuple[object, ...]) -> tuple[object, ...]:
    p = stepcodec.PHASES
    phases = row[p]
    return (*row[:p], None if phases is None else orjson.loads(phases), *row[p + 1 :])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "rows",
    [
        [],
        [_row(i) for i in range(50)],
        [_row(0, phases=None, t1_ns=None, wait_ns=None), _row(1, phases="{}"), _row(2)],
        [_row(0, micro=2.5), _row(1, micro="x"), _row(2, eval_ns=-(2**63))],  # SQLite keeps any
        [_row(0, phases='{"forward": 1.5}'), _row(1, phases='{"a": {"b": 1}}')],
        [_row(0, phases="[1, 2]"), _row(1, phases='{"a": 18446744073709551615}')],
        [_row(0, optimizers='[{"name": "adam", "updates": 1}]'), _row(1, t0_ns=None)],
        [_row(i, step=(i * 7919) % 13, t0_ns=2**63 - 1 - i) for i in range(20)],
        [_row(i, phases='{"forward": 5}', wait_ns=2**63 - 1 if i else -(2**63)) for i in range(9)],
    ],
)
def test_rows_come_back_exactly(rows: list[tuple[object, ...]]) -> None:
    got = stepcodec.decode(stepcodec.encode(rows))
    assert got == [_read(r) for r in rows]
    assert [type(v) for r in got for v in r] == [type(v) for r in map(_read, rows) for v in r]


def test_a_block_is_small() -> None:
    rows = [_row(i) for i in range(1000)]
    assert len(stepcodec.encode(rows)) < 1000 * 30  # ~164 bytes a row as rows


@pytest.mark.parametrize("data", [b"", b"junk", zlib.compress(b"\x07\x00\x00\x00\x00")])
def test_damaged_data_is_a_clear_error(data: bytes) -> None:
    with pytest.raises(DatabaseError, match="packed block of steps"):
        stepcodec.decode(data)


def test_truncated_columns_are_a_clear_error() -> None:
    raw = zlib.decompress(stepcodec.encode([_row(i) for i in range(10)]))
    with pytest.raises(DatabaseError, match="packed block of steps"):
        stepcodec.decode(zlib.compress(raw[:-8]))


def test_blocks_joined_keep_every_value_and_null() -> None:
    """Blocks concatenated (packed blocks then the recent rows) give each
    row back, an object column (optimizers) and NULL masks included; the
    context's torch-memory mask is the allocated column's NULLs."""
    from gpuprofd.storage.reads import queries

    first = [_row(i, optimizers='[{"name": "adam"}]' if i % 3 else None) for i in range(5)]
    second = [_row(i, mem_allocated_bytes=None if i % 2 else 7) for i in range(5, 9)]
    third = [_row(9, mem_allocated_bytes=None)]
    parts = [stepcodec.unpack(stepcodec.encode(first)), stepcodec.Columns.from_rows(second)]
    joined = stepcodec.Columns.concat([*parts, stepcodec.Columns.from_rows(third)])
    want = [_read(r) for r in first + second + third]
    assert joined.rows() == want
    fields = queries.step_fields(joined)
    assert fields["has_mem"].tolist() == [r[10] is not None for r in want]
    assert fields["has_mem"].tolist() == [True] * 5 + [False, True, False, True, False]
    assert len(fields["optimizers"]) == 3
