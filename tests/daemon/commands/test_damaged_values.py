"""gpuprofctl on a database the store wrote and packed, then damaged by raw
SQL one value at a time: a JSON cell that is not JSON is shown empty, a
BLOB in a text column as text (U+FFFD for its bytes that are not UTF-8), a
packed block whose bytes are damaged is left out; each counted on stderr
with its run and table, the rest of the run shown, exit 0."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuprofd.ctl import main
from tests.daemon import damaged
from tests.daemon.damaged import GROUP, flip_middle


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("values") / "g.db"
    with pytest.MonkeyPatch.context() as mp:
        asyncio.run(damaged.write(db, mp))
    return db


def _copy(written: Path, tmp_path: Path, *sql: str) -> Path:
    db = tmp_path / "g.db"
    shutil.copy(written, db)
    damaged.damage(db, *sql)
    return db


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[Any, list[str]]:
    assert main([*args, "--format", "json"]) == 0
    out, err = capsys.readouterr()
    return orjson.loads(out), err.splitlines()


def _said(db: Path, what: str, where: str, shown: str) -> str:
    return f"gpuprofctl: warning: {what} in {db.absolute()} could not be read ({where}): {shown}"


VALUES_SHOWN = (
    "shown empty; they were changed outside gpuprof, or the file is damaged (a copy of "
    "it from before holds them)"
)
BLOCKS_SHOWN = (
    "the steps, samples or buckets they held are left out; the file is damaged (a copy "
    "of it from before holds them)"
)


def test_the_undamaged_database_shows_everything_and_says_nothing(
    written: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    summary, err = _json(capsys, "insights", str(written), "1")
    assert err == []
    assert summary["steps"] == damaged.STEPS
    assert [(i["rule"], i["evidence"]) for i in summary["insights"]] == [
        ("dataloader_stall", {"wait_pct": 5.0}),
        ("small_kernels", {"kernels": 12}),
    ]
    assert summary["optimizers"][0]["updates"] == 13  # steps 7, 107, ... 1207
    assert [k["name"] for k in summary["top_kernels"]] == ["gemm", "relu"]
    group, err = _json(capsys, "insights", str(written), "--group", GROUP)
    assert err == [] and group["ranks"][0]["comm"]["buckets_per_step"] == 3


def test_json_cells_that_are_not_json_are_shown_empty_and_counted(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _copy(
        written,
        tmp_path,
        "UPDATE insights SET evidence = '{' WHERE rule = 'small_kernels'",
        "UPDATE kernel_windows SET steps = 'x' WHERE id = 1",
        "UPDATE steps SET optimizers = '[' WHERE step = 1007",
        "UPDATE steps SET phases = '{\"forward\":' WHERE step = 1001",
        "UPDATE steps SET phases = '[1]' WHERE step = 1002",  # JSON, not the object stored
    )
    summary, err = _json(capsys, "insights", str(db), "1")
    assert summary["steps"] == damaged.STEPS
    assert [(i["rule"], i["evidence"]) for i in summary["insights"]] == [
        ("dataloader_stall", {"wait_pct": 5.0}),
        ("small_kernels", {}),
    ]
    assert summary["optimizers"][0]["updates"] == 12  # step 1007's lost
    assert [k["name"] for k in summary["top_kernels"]] == ["gemm", "relu"]
    where = "run 1: insights.evidence, kernel_windows.steps, steps.optimizers, steps.phases (2)"
    assert err == [_said(db, "5 stored values", where, VALUES_SHOWN)]

    kernels, err = _json(capsys, "kernels", str(db), "1")
    assert [k["name"] for k in kernels["kernels"]] == ["gemm", "relu"]
    assert err == [_said(db, "1 stored value", "run 1: kernel_windows.steps", VALUES_SHOWN)]

    assert main(["insights", str(db), "1"]) == 0  # the text report too
    out, err = capsys.readouterr()
    assert "Small kernels" in out and len(err.splitlines()) == 1


def test_blobs_in_text_columns_read_as_text(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _copy(
        written,
        tmp_path,
        "UPDATE kernel_stats SET name = x'72656c75ff' WHERE name = 'relu'",
        "UPDATE insights SET title = x'4c6f6164ff' WHERE rule = 'dataloader_stall'",
        "UPDATE insights SET fix = CAST('use workers' AS BLOB) WHERE rule = 'small_kernels'",
        "UPDATE stack_samples SET func = x'6c6f6164ff' WHERE func = 'load'",
    )
    summary, err = _json(capsys, "insights", str(db), "1")
    assert [(i["title"], i["fix"]) for i in summary["insights"]] == [
        ("Load\ufffd", "f"),
        ("Small kernels", "use workers"),  # a BLOB, but UTF-8: plain text, nothing to say
    ]
    assert [k["name"] for k in summary["top_kernels"]] == ["gemm", "relu\ufffd"]
    text = (
        "gpuprofctl: warning: 3 text cells in {} are not UTF-8 (run 1: func, name, title): "
        "shown with \ufffd in place of the bytes that are not; they were written outside "
        "gpuprof, or the file is damaged"
    )
    assert err == [text.format(db.absolute())]

    assert main(["kernels", str(db), "1"]) == 0
    out, err = capsys.readouterr()
    assert "relu\ufffd" in out and len(err.splitlines()) == 1


def test_a_damaged_packed_block_is_left_out_and_counted(
    written: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = "WHERE block = (SELECT MIN(block) FROM {})"
    db = _copy(
        written,
        tmp_path,
        f"UPDATE step_packs SET data = {flip_middle('data')}",
        f"UPDATE host_packs SET data = {flip_middle('data')} {first.format('host_packs')}",
        f"UPDATE run_cpu_packs SET data = {flip_middle('data')} " + first.format("run_cpu_packs"),
        f"UPDATE comm_steps SET packed = {flip_middle('packed')} WHERE step = 1253",
        "UPDATE comm_steps SET packed = 'text' WHERE step = 1228",  # not even a BLOB
    )
    summary, err = _json(capsys, "insights", str(db), "1")
    assert summary["steps"] == damaged.STEPS - 1000  # block 0's steps left out
    assert summary["optimizers"][0]["updates"] == 3  # steps 1007, 1107, 1207
    where = "run 1: run_cpu_packs, step_packs; rows without a run id: host_packs (1)"
    assert err == [_said(db, "3 packed blocks", where, BLOCKS_SHOWN)]

    group, err = _json(capsys, "insights", str(db), "--group", GROUP)
    assert group["ranks"][0]["comm"]["buckets_per_step"] == 3  # the other steps' buckets
    assert group["ranks"][0]["summary"]["steps"] == damaged.STEPS - 1000
    where = (
        "run 1: comm_steps (2), run_cpu_packs, step_packs; rows without a run id: host_packs (1)"
    )
    assert err == [_said(db, "5 packed blocks", where, BLOCKS_SHOWN)]
