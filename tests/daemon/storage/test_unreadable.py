"""The decoders of stored values no reader can decode (gpuprofd.storage.unreadable):
a stand-in for the value, the value counted in the read in progress, said
in a sentence per kind; a value that decodes is returned and never counted."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gpuprofd.core.errors import DatabaseError
from gpuprofd.storage import commpack, stepcodec, unreadable


def test_a_json_cell_that_reads_is_its_value_and_counts_nothing() -> None:
    with unreadable.collecting() as lost:
        assert unreadable.json_cell('{"a": 1}', "t.c", 1) == {"a": 1}
        assert unreadable.json_cell(b"[2]", "t.c", 1, shape=list, empty=list) == [2]
        assert unreadable.json_cell(None, "t.c", 1) == {}  # NULL: nothing stored, nothing lost
        assert unreadable.json_cell("", "t.c", 1, empty=list) == []
    assert len(lost) == 0 and lost.notes() == []


def test_a_json_cell_not_json_or_of_another_shape_is_empty_and_counted() -> None:
    with unreadable.collecting("db") as lost:
        assert unreadable.json_cell("{", "insights.evidence", 2, 0) == {}
        assert unreadable.json_cell("{", "insights.evidence", 2, 0) == {}  # read again: once
        assert unreadable.json_cell("[1]", "insights.evidence", 2, 1) == {}
        assert unreadable.json_cell("5", "steps.phases", 2, 9, empty=unreadable.null) is None
        assert unreadable.json_cell(b"\xff", "group_insights.evidence", None, ("g", 0)) == {}
    assert lost.values == {
        (2, "insights.evidence", 0),
        (2, "insights.evidence", 1),
        (2, "steps.phases", 9),
        (None, "group_insights.evidence", ("g", 0)),
    }
    assert lost.notes() == [
        "4 stored values in db could not be read (run 2: insights.evidence (2), steps.phases; "
        "rows without a run id: group_insights.evidence (1)): shown empty; they were changed "
        "outside gpuprof, or the file is damaged (a copy of it from before holds them)"
    ]


def test_json_cells_parse_each_and_name_an_unreadable_one_by_which() -> None:
    with unreadable.collecting() as lost:
        good = unreadable.json_cells(['{"a": 1}', None, "{}"], "steps.phases", 3)
        assert good == [{"a": 1}, None, {}] and not lost
        steps = [10, 11, 12, 13]
        got = unreadable.json_cells(
            ['{"a": 1}', "{", None, "[]"], "steps.phases", 3, steps.__getitem__
        )
    assert got == [{"a": 1}, {}, None, {}]
    assert lost.values == {(3, "steps.phases", 11), (3, "steps.phases", 13)}


def test_a_damaged_block_is_none_and_counted_a_bug_is_not_hidden() -> None:
    rows = [(i, 10 * i, 10 * i + 5, 0, 0, 1, '{"f": 1}', 0, 0, None, None, None, None, 0)
            for i in range(3)]  # fmt: skip
    data = stepcodec.encode(rows)
    with unreadable.collecting("db") as lost:
        assert unreadable.block(data, stepcodec.unpack, "step_packs", 1, 0).n == 3
        assert not lost
        assert unreadable.block(data[:-4], stepcodec.unpack, "step_packs", 1, 0) is None
        assert unreadable.block("text", commpack.unpack, "comm_steps", 1, 7) is None
        with pytest.raises(ZeroDivisionError):  # not a damaged block: said, never hidden
            unreadable.block(data, lambda _: 1 // 0, "step_packs", 1, 1)
    assert lost.blocks == {(1, "step_packs", 0), (1, "comm_steps", 7)}
    assert lost.notes() == [
        "2 packed blocks in db could not be read (run 1: comm_steps, step_packs): the steps, "
        "samples or buckets they held are left out; the file is damaged (a copy of it from "
        "before holds them)"
    ]


def test_a_packed_bucket_value_that_is_not_bytes_is_a_pack_error() -> None:
    with pytest.raises(commpack.PackError, match="not a packed bucket value"):
        commpack.unpack("text")
    assert isinstance(commpack.PackError("x"), DatabaseError)


async def test_the_reads_tasks_and_threads_count_in_their_read() -> None:
    def bad(which: int) -> None:
        unreadable.json_cell("{", "t.c", 1, which)

    async def task() -> None:
        bad(1)

    with unreadable.collecting() as lost:
        await asyncio.gather(task(), asyncio.to_thread(bad, 2))
        with unreadable.collecting() as inner:  # a read inside another counts apart
            bad(3)
    assert {k[2] for k in lost.values} == {1, 2} and {k[2] for k in inner.values} == {3}


def test_outside_a_read_each_value_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "gpuprofd.storage.unreadable")
    for _ in range(3):
        assert unreadable.json_cell("{", "kernel_windows.steps", 8, 99, empty=list) == []
    assert len(caplog.records) == 1
    assert "kernel_windows.steps (run 8, 99) could not be read" in caplog.text
