"""Values as asyncpg wants them (:class:`gpuprofd.storage.postgres._Shape`):
a column at a time when every value is right already, a row at a time when not."""

from __future__ import annotations

from types import SimpleNamespace

from gpuprofd.storage.postgres import _Shape


def _shape() -> _Shape:
    types = [SimpleNamespace(name=n) for n in ("int8", "float8", "text", "jsonb")]
    return _Shape(types, returns=False)


def test_rows_of_the_right_types_are_taken_as_they_are() -> None:
    rows = [(1, 2.5, "a", None), (2, None, None, {"x": 1})]
    got = _shape().coerce_many(rows)
    assert got == rows and got[0] is rows[0]  # not rebuilt


def test_a_value_of_another_type_is_converted_in_its_row() -> None:
    rows = [(1, 2.5, "a", None), (True, 3, 7, None), [4.6, 1.0, "b", None]]
    got = _shape().coerce_many(rows)
    assert got == [(1, 2.5, "a", None), (1, 3.0, "7", None), (5, 1.0, "b", None)]
    assert [type(v) for v in got[1][:3]] == [int, float, str]
