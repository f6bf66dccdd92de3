"""Evidence windows in storage, on SQLite and the real Postgres: a ``kernels``
event of source ``evidence`` stored with its link (``evidence_windows``),
read back with its rows, stored once when resent, left out of the kernel
rules' statistics, attached to its finding by the insights runner, and said
in the run's summary; an older database read as it is has none."""

from __future__ import annotations

import sqlite3
from typing import Any

from gpuprofd.core.counters import DropCounter
from gpuprofd.services.evidence import EvidencePlanner
from gpuprofd.services.insights_runner import InsightsRunner
from gpuprofd.storage import reads, schema
from gpuprofd.storage.writes import runsdb
from tests.daemon.helpers import PHASES, open_store
from tests.daemon.storage.test_backends import run_row

MS = 1_000_000


def evidence_msg(t0: int = 5_000, steps: tuple[int, ...] = (40, 41)) -> dict[str, Any]:
    return {
        "t0": t0,
        "t1": t0 + 90 * MS,
        "source": "evidence",
        "steps": list(steps),
        "rows": [
            ["aten::mm", "op", "compute", 2, 80 * MS, 78 * MS, 2e9],
            ["aten::addmm", "op", "compute", 8, 3 * MS, 2 * MS, 1e6],
            ["aten::linear", "op", "compute", 8, 4 * MS, MS, None],
        ],
        "evidence": {"id": "req-1", "rule": "high_step_variance", "time": "cpu"},
    }


def steps_with_slow_bursts(n: int = 120) -> list[dict[str, Any]]:
    """Steps of 5 ms, every 10th from step 15 on 60 ms (a periodic slow step)."""
    out, t = [], 1_000_000_000
    for i in range(n):
        ms = 60 if i >= 15 and i % 10 == 5 else 5
        out.append(
            {
                "i": i,
                "t0": t,
                "t1": t + ms * MS,
                "wait": 0,
                "explicit": False,
                "micro": 1,
                "phases": {**PHASES, "forward": ms * MS // 2},
            }
        )
        t += ms * MS + MS
    return out


async def test_an_evidence_window_is_stored_once_and_read_back_on_each_backend(storage_url):
    drops = DropCounter()
    async with open_store(storage_url, drops) as store:
        run_id = await runsdb.insert_run(store, run_row("k1"))
        assert store.submit_all_nowait(runsdb.kernels_ops(run_id, evidence_msg()))
        assert store.submit_all_nowait(runsdb.kernels_ops(run_id, evidence_msg()))  # resent
        await store.flush()
        (w,) = await reads.evidence_windows(store, run_id)
        assert (w["request_id"], w["rule"], w["time"], w["steps"]) == (
            "req-1",
            "high_step_variance",
            "cpu",
            [40, 41],
        )
        assert w["t1_ns"] - w["t0_ns"] == 90 * MS
        assert [r.name for r in sorted(w["rows"], key=lambda r: -r.self_ns)][0] == "aten::mm"
        windows = await reads.kernel_windows(store, run_id)
        assert w["window_id"] in {win["id"] for win, _ in windows}
        assert drops.snapshot() == {}


async def test_a_snapshot_window_has_no_evidence_row(storage_url):
    async with open_store(storage_url) as store:
        run_id = await runsdb.insert_run(store, run_row("k1"))
        snap = {**evidence_msg(), "source": "snapshot"}
        del snap["evidence"]
        assert store.submit_all_nowait(runsdb.kernels_ops(run_id, snap))
        await store.flush()
        assert await reads.evidence_windows(store, run_id) == []


async def test_the_runner_attaches_the_window_and_the_summary_says_so(storage_url):
    async with open_store(storage_url) as store:
        run_id = await runsdb.insert_run(store, {**run_row("k1"), "options": {}})
        for s in steps_with_slow_bursts():
            assert store.submit_nowait(runsdb.step_op(run_id, s))
        await store.flush()
        planner = EvidencePlanner(clock=lambda: 2 + 600 * 10**9)  # 10 min into the run
        runner = InsightsRunner(store, "db", None, evidence=planner)
        found = {i.rule: i for i in await runner.live(run_id)}
        assert "profile" not in found["high_step_variance"].evidence
        asked = planner.reply(run_id, None)
        assert asked is not None and asked["rule"] == "high_step_variance"
        # the slow steps are 5 mod 10: the request waits for the next one, one step
        assert (asked["steps"], asked["every"], asked["at_step"] % 10) == (1, 10, 5)
        msg = evidence_msg(steps=(asked["at_step"],))
        msg["evidence"]["id"] = asked["id"]
        assert store.submit_all_nowait(runsdb.kernels_ops(run_id, msg))
        await store.flush()
        report = {"id": asked["id"], "state": "taken", "cost_ns": 90 * MS}
        assert planner.reply(run_id, report) is None  # settled: not sent again
        found = {i.rule: i for i in await runner.live(run_id)}
        prof = found["high_step_variance"].evidence["profile"]
        assert prof["top"][0]["name"] == "aten::mm" and prof["time"] == "cpu"
        assert planner.reply(run_id, None) is None  # one per rule: nothing more asked
        stored = await reads.stored_insights(store, run_id)
        (hsv,) = [i for i in stored if i["rule"] == "high_step_variance"]
        assert hsv["evidence"]["profile"]["steps"] == [asked["at_step"]]
        summary = await runner.finalize(run_id)
        assert (
            f"evidence: a profiler window of step {asked['at_step']} taken for "
            "high_step_variance (top op aten::mm)"
        ) in summary["notes"]
        assert run_id not in planner.runs


def test_an_older_database_read_as_it_is_has_no_evidence_windows(tmp_path):
    path = tmp_path / "old.db"
    schema.prepare(path)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE evidence_windows")
    conn.execute("UPDATE meta SET value = '17' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    ro = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    schema.shadow_old_tables(ro, 17)
    assert ro.execute("SELECT COUNT(*) FROM evidence_windows").fetchone() == (0,)
    ro.close()
    schema.prepare(path)  # the upgrade makes the table
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT COUNT(*) FROM evidence_windows").fetchone() == (0,)
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone() == (
        str(schema.SCHEMA_VERSION),
    )
    conn.close()


async def test_a_live_runs_evidence_link_follows_its_window_into_a_new_database(tmp_path):
    """The database file replaced under a running run (its rows copied over,
    windows renumbered): the evidence link points at its window's new id."""
    import aiosqlite

    from gpuprofd.storage.upkeep import dbrotate

    old_path, new_path = tmp_path / "old.db", tmp_path / "new.db"
    async with open_store(str(old_path)) as store:
        run_id = await runsdb.insert_run(store, run_row("live"))
        assert store.submit_all_nowait(runsdb.kernels_ops(run_id, evidence_msg()))
        await store.flush()
    async with open_store(str(new_path)) as store:  # a populated file: ids taken
        other = await runsdb.insert_run(store, run_row("other"))
        snap = {**evidence_msg(t0=1), "source": "snapshot"}
        del snap["evidence"]
        for t0 in (1, 2, 3):
            assert store.submit_all_nowait(runsdb.kernels_ops(other, {**snap, "t0": t0}))
        await store.flush()
    async with (
        aiosqlite.connect(old_path) as old,
        aiosqlite.connect(new_path, isolation_level=None) as new,
    ):
        got = await dbrotate.read_live_runs(old, [run_id])
        ids = await dbrotate.write_live_runs(new, got)
    async with open_store(str(new_path)) as store:
        (w,) = await reads.evidence_windows(store, ids[run_id])
        windows = {win["id"]: win for win, _ in await reads.kernel_windows(store, ids[run_id])}
        assert windows[w["window_id"]]["source"] == "evidence"
        assert w["rows"] and w["rule"] == "high_step_variance"
