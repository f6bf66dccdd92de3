"""The dashboard API on a database the store wrote and packed, then damaged
by raw SQL: every call answers 200 with the rest of the run, the damaged
value shown empty, as text or left out, and says so in ``unreadable`` (a
sentence per kind: how many, which run and table); an undamaged database's
answers carry no ``unreadable``."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import pytest
from aiohttp import test_utils

from gpuprofd.web.app import build_app
from gpuprofd.web.state import WebState
from tests.daemon import damaged
from tests.daemon.damaged import GROUP, START_WALL, flip_middle
from tests.daemon.helpers import open_store

S0 = START_WALL / 1e9
#: Steps 100-259: inside packed block 0, narrow enough to read its steps and samples.
NARROW = f"from={S0 + 50}&to={S0 + 130}&width=400"
#: The packed block of host samples of 40 s to 100 s into the run (blocks of
#: PACK_NS by the monotonic clock): NARROW's first 50 s.
HOST_BLOCK = (damaged.START + 90 * damaged.S) // damaged.PACK_NS
PATHS = (
    "/api/v1/runs/1",
    "/api/v1/runs/1/insights",
    "/api/v1/runs/1/kernels",
    f"/api/v1/runs/1/series?{NARROW}",
    f"/api/v1/groups/{GROUP}",
)


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("api") / "g.db"
    with pytest.MonkeyPatch.context() as mp:
        asyncio.run(damaged.write(db, mp))
    return db


async def _answers(written: Path, tmp_path: Path, *sql: str) -> tuple[Path, dict[str, Any]]:
    """Each of :data:`PATHS` asked of a copy of *written* damaged by *sql*."""
    db = tmp_path / "g.db"
    shutil.copy(written, db)
    damaged.damage(db, *sql)
    got = {}
    async with open_store(str(db)) as store:
        state = WebState(reader=store, now_mono_ns=None)
        async with test_utils.TestClient(test_utils.TestServer(build_app(state))) as client:
            for path in PATHS:
                resp = await client.get(path)
                assert resp.status == 200, await resp.text()
                got[path.split("?")[0].rsplit("/", 1)[-1]] = await resp.json()
    return db, got


def _said(db: Path, what: str, where: str, shown: str) -> str:
    return f"{what} in {db.absolute()} could not be read ({where}): {shown}"


BEFORE = "the file is damaged (a copy of it from before holds them)"


async def test_an_undamaged_database_says_nothing(written: Path, tmp_path: Path) -> None:
    _, got = await _answers(written, tmp_path)
    assert not [k for k, body in got.items() if "unreadable" in body]
    assert got["1"]["run"]["steps"] == damaged.STEPS
    assert len(got["series"]["steps"]["t"]) == 160 and len(got["series"]["host"]["t"]) == 160


async def test_json_that_is_not_json_is_shown_empty_and_said(written: Path, tmp_path: Path) -> None:
    db, got = await _answers(
        written,
        tmp_path,
        "UPDATE insights SET evidence = '[' WHERE rule = 'small_kernels'",
        "UPDATE kernel_windows SET steps = '{' WHERE id = 1",
        "UPDATE steps SET phases = '{' WHERE step = 1001",
    )
    said = "shown empty; they were changed outside gpuprof, or " + BEFORE
    insights = got["insights"]
    assert [(i["rule"], i["evidence"]) for i in insights["insights"]] == [
        ("dataloader_stall", {"wait_pct": 5.0}),
        ("small_kernels", {}),
    ]
    assert insights["unreadable"] == [_said(db, "1 stored value", "run 1: insights.evidence", said)]
    kernels = got["kernels"]
    assert [k["name"] for k in kernels["kernels"]] == ["gemm", "relu"]
    assert kernels["unreadable"] == [
        _said(db, "1 stored value", "run 1: kernel_windows.steps", said)
    ]
    # the run's summary, built from its rows: its steps, findings and kernels
    assert got["1"]["run"]["steps"] == damaged.STEPS
    where = "run 1: insights.evidence, kernel_windows.steps, steps.phases"
    assert got["1"]["unreadable"] == [_said(db, "3 stored values", where, said)]
    assert "unreadable" not in got["series"]  # none of those in its window


async def test_blobs_in_text_columns_are_text_and_said(written: Path, tmp_path: Path) -> None:
    db, got = await _answers(
        written,
        tmp_path,
        "UPDATE kernel_stats SET name = x'72656c75ff' WHERE name = 'relu'",
        "UPDATE insights SET title = x'4c6f6164ff' WHERE rule = 'dataloader_stall'",
    )
    assert [k["name"] for k in got["kernels"]["kernels"]] == ["gemm", "relu\ufffd"]
    assert got["insights"]["insights"][0]["title"] == "Load\ufffd"
    said = (
        "1 text cell in {} is not UTF-8 (run 1: {}): shown with \ufffd in place of the bytes "
        "that are not; they were written outside gpuprof, or the file is damaged"
    )
    assert got["kernels"]["unreadable"] == [said.format(db.absolute(), "name")]
    assert got["insights"]["unreadable"] == [said.format(db.absolute(), "title")]


async def test_a_damaged_packed_block_is_left_out_and_said(written: Path, tmp_path: Path) -> None:
    db, got = await _answers(
        written,
        tmp_path,
        f"UPDATE step_packs SET data = {flip_middle('data')}",
        f"UPDATE host_packs SET data = {flip_middle('data')} WHERE block = {HOST_BLOCK}",
    )
    series = got["series"]
    assert series["steps"]["t"] == []  # block 0's steps: left out
    host = series["host"]["t"]
    assert len(host) == 60 and min(host) == S0 + 100  # the block's samples left out
    said = "the steps, samples or buckets they held are left out; " + BEFORE
    where = "run 1: step_packs; rows without a run id: host_packs (1)"
    assert series["unreadable"] == [_said(db, "2 packed blocks", where, said)]
    # the summary (and the group's rank) from what is left: the steps stored as rows
    assert got["1"]["summary"]["steps"] == damaged.STEPS - 1000
    assert got[GROUP]["ranks"][0]["median_step_ms"] == 420.0
    assert "step_packs" in got[GROUP]["unreadable"][0]
