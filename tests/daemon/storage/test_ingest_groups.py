"""Several nodes' ingest batches applied in one transaction
(:func:`gpuprofd.storage.writes.ingest.apply_batches`), on each backend:
each batch still all or nothing, idempotent by (node, sequence), a bad one
refused alone; on Postgres the rows go in by COPY."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuprofd.storage.writes import Applied, BatchError, IngestConflict, pgbulk, validate
from gpuprofd.storage.writes.ingest import apply_batches
from tests.daemon.batches import batch, new_uuid, run_event, steps_event
from tests.daemon.storage.test_backends import open_store


def _rollups(seq: int, second: int) -> dict[str, Any]:
    rows = [
        {"sec_ns": second * 10**9, "uuid": f"gpu-{g}", "boot_id": "b", "n": 10, "util_mean": 97.0}
        for g in range(8)
    ]
    return {"seq": seq, "kind": "gpu_rollups", "rows": rows}


def _second(node: str, run: str, seq: int, second: int) -> dict[str, Any]:
    """One second of a node: 10 steps (enough rows for COPY) and 8 GPU rollups."""
    return validate(
        batch(node, [steps_event(seq, run, second * 10, n=10), _rollups(seq + 1, second)])
    )


async def _count(store: Any, sql: str) -> int:
    return int((await store.fetchone(sql))[0])


@pytest.fixture
def copies(storage_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The tables loaded by COPY (asyncpg's, called through), on Postgres."""
    seen: list[str] = []
    if storage_url.startswith("postgres"):
        import asyncpg.connection

        real = asyncpg.connection.Connection.copy_records_to_table

        async def spy(self: Any, table: str, **kw: Any) -> Any:
            seen.append(table)
            return await real(self, table, **kw)

        monkeypatch.setattr(asyncpg.connection.Connection, "copy_records_to_table", spy)
    yield seen


async def test_a_group_stored_by_copy_applies_once_under_resend(
    storage_url: str, copies: list[str]
) -> None:
    runs = {n: new_uuid() for n in ("n1", "n2", "n3")}
    async with open_store(storage_url) as store:
        hello = [validate(batch(n, [run_event(1, r)])) for n, r in runs.items()]
        assert all(isinstance(a, Applied) for a in await apply_batches(store, hello))
        group = [_second(n, r, 2, 0) for n, r in runs.items()]
        first = await apply_batches(store, group)
        again = await apply_batches(store, group)  # every answer lost: all sent again
        # and the same rows again under new sequence numbers (a node that lost its log)
        renumbered = await apply_batches(store, [_second(n, r, 4, 0) for n, r in runs.items()])
        steps = await _count(store, "SELECT COUNT(*) FROM steps")
        distinct = await _count(
            store, "SELECT COUNT(*) FROM (SELECT DISTINCT run_id, step, t0_ns FROM steps) AS d"
        )
        rollups = await _count(store, "SELECT COUNT(*) FROM gpu_rollups")
        samples = await _count(store, "SELECT SUM(n) FROM gpu_rollups")
        seqs = await store.fetchall("SELECT node_id, last_seq FROM ingest_nodes ORDER BY node_id")
    assert [(a.applied, a.skipped, a.acked_seq) for a in first] == [(2, 0, 3)] * 3  # type: ignore[union-attr]
    assert [(a.applied, a.skipped, a.acked_seq) for a in again] == [(0, 2, 3)] * 3  # type: ignore[union-attr]
    assert [a.acked_seq for a in renumbered] == [5, 5, 5]  # type: ignore[union-attr]
    assert steps == distinct == 30  # 10 steps of each of 3 runs, each once
    # rollups are the node's samples: a GPU's second is one row, the renumbered
    # second merged into it (its samples counted again: nothing told it was a copy)
    assert (rollups, samples) == (8, 3 * 8 * 2 * 10)
    assert [tuple(r) for r in seqs] == [("n1", 5), ("n2", 5), ("n3", 5)]
    if storage_url.startswith("postgres"):
        # one COPY per table for a whole group, not one per batch (the resends
        # held no new step, and the renumbered group's steps were all stored);
        # GPU seconds are upserts (a second stored again merges)
        assert sorted(copies) == ["steps"]


async def test_a_bad_batch_in_a_group_is_refused_alone(storage_url: str) -> None:
    a, b, c = new_uuid(), new_uuid(), new_uuid()
    async with open_store(storage_url) as store:
        await apply_batches(store, [validate(batch("n1", [run_event(1, a)]))])
        await apply_batches(store, [validate(batch("n2", [run_event(1, b)]))])
        group = [
            _second("n1", a, 2, 0),
            # steps of a run never announced: refused, nothing of it kept
            validate(batch("n3", [run_event(1, c), steps_event(2, new_uuid())])),
            # n2 writing about n1's run: a conflict
            validate(batch("n2", [steps_event(2, b), steps_event(3, a)])),
            _second("n2", b, 4, 0),
        ]
        got = await apply_batches(store, group)
        runs = await _count(store, "SELECT COUNT(*) FROM runs")
        per_run = await store.fetchall(
            "SELECT r.run_uuid, COUNT(*) FROM steps s JOIN runs r ON r.id = s.run_id "
            "GROUP BY r.run_uuid"
        )
        seqs = await store.fetchall("SELECT node_id, last_seq FROM ingest_nodes ORDER BY node_id")
    assert isinstance(got[0], Applied) and got[0].acked_seq == 3
    assert isinstance(got[1], BatchError) and got[1].field == "events[1].run"
    assert isinstance(got[2], IngestConflict) and got[2].field == "events[1].run"
    assert isinstance(got[3], Applied) and got[3].acked_seq == 5
    assert runs == 2  # n3's run went with its batch
    assert dict((u, n) for u, n in per_run) == {a: 10, b: 10}  # n2's refused 5 steps too
    assert [tuple(r) for r in seqs] == [("n1", 3), ("n2", 5)]


async def test_one_nodes_batches_in_one_group_apply_in_order(storage_url: str) -> None:
    run = new_uuid()
    async with open_store(storage_url) as store:
        first = validate(batch("n1", [run_event(1, run), steps_event(2, run, 0, n=10)]))
        # sent again with one more event before the first was answered
        overlap = validate(
            batch("n1", [run_event(1, run), steps_event(2, run, 0, n=10), steps_event(3, run, 10)])
        )
        got = await apply_batches(store, [first, overlap])
        steps = [r[0] for r in await store.fetchall("SELECT step FROM steps ORDER BY step")]
        node = await store.fetchone("SELECT last_seq, batches, events FROM ingest_nodes")
    assert [(a.applied, a.skipped, a.acked_seq) for a in got] == [(2, 0, 2), (1, 2, 3)]  # type: ignore[union-attr]
    assert steps == list(range(15))
    assert tuple(node) == (3, 2, 3)


def _rollup_event(seq: int, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"seq": seq, "kind": "gpu_rollups", "rows": rows}


async def test_a_gpu_second_twice_in_a_group_merges_and_a_gpu_keeps_its_first_clock(
    storage_url: str,
) -> None:
    """On Postgres a group's GPU rows go in one statement per table
    (``storage.writes.pgbulk``): a second sent again within the group (a
    node's daemon restarted within it) merges into the first as row by row,
    and a GPU's max SM clock is the first given, on both backends."""
    g0 = {"uuid": "gpu-a", "boot_id": "b"}
    async with open_store(storage_url) as store:
        group = [
            validate(
                batch(
                    "n1",
                    [
                        _rollup_event(
                            1,
                            [
                                {**g0, "sec_ns": 0, "n": 10, "util_mean": 90.0, "util_max": 95},
                                {**g0, "sec_ns": 10**9, "n": 10.0, "util_mean": 50.0},
                            ],
                        )
                    ],
                )
            ),
            validate(
                batch(
                    "n1",
                    [
                        _rollup_event(
                            2,
                            [
                                {**g0, "sec_ns": 0, "n": 30, "util_mean": 70.0, "util_max": 99},
                                {
                                    **g0,
                                    "sec_ns": 0,
                                    "n": 0,
                                    "util_mean": 10.0,
                                    "sm_limit_mhz": 1980,
                                },
                            ],
                        )
                    ],
                )
            ),
            validate(batch("n2", [_rollup_event(1, [{"uuid": "gpu-b", "sec_ns": 0, "n": 5}])])),
        ]
        got = await apply_batches(store, group)
        assert all(isinstance(a, Applied) for a in got), got
        later = validate(
            batch("n1", [_rollup_event(3, [{**g0, "sec_ns": 2 * 10**9, "sm_limit_mhz": 1410}])])
        )
        assert isinstance((await apply_batches(store, [later]))[0], Applied)
        rows = await store.fetchall(
            "SELECT uuid, sec_ns, n, util_mean, util_max, sm_limit_mhz FROM gpu_rollups "
            "ORDER BY uuid, sec_ns"
        )
        gpus = await _count(store, "SELECT COUNT(*) FROM gpus")
    # second 0 of gpu-a: 10 samples at 90 and 30 at 70 (a row of n 0 weighs nothing)
    assert [tuple(r) for r in rows] == [
        ("gpu-a", 0, 40, 75.0, 99.0, 1980.0),
        ("gpu-a", 10**9, 10, 50.0, None, 1980.0),
        ("gpu-a", 2 * 10**9, None, None, None, 1980.0),
        ("gpu-b", 0, 5, None, None, None),
    ]
    assert gpus == 2


async def test_a_groups_host_and_run_cpu_samples_are_stored_with_their_values(
    storage_url: str,
) -> None:
    """On Postgres a group's host and run CPU samples go in its last
    statement, from arrays: each value stored as sent (an integer
    percentage as a number, a field not sent as NULL), on both backends."""
    run = new_uuid()
    host = {"mono_ns": 5, "boot_id": "b", "cpu_pct": 20, "cpu_count": 64}
    cpu = [{"mono_ns": 5, "cores": 1.5}, {"mono_ns": 6, "cores": 2}]
    async with open_store(storage_url) as store:
        await apply_batches(store, [validate(batch("n1", [run_event(1, run)]))])
        group = [
            validate(
                batch(
                    "n1",
                    [
                        {"seq": 2, "kind": "host_samples", "rows": [host]},
                        {"seq": 3, "kind": "run_cpu", "run": run, "rows": cpu},
                    ],
                )
            ),
            validate(batch("n2", [{"seq": 1, "kind": "host_samples", "rows": [{"mono_ns": 7}]}])),
        ]
        got = await apply_batches(store, group)
        hosts = await store.fetchall(
            "SELECT mono_ns, cpu_pct, cpu_count, swap_in_bps, boot_id FROM host_samples "
            "ORDER BY mono_ns"
        )
        cpus = await store.fetchall(
            "SELECT r.run_uuid, c.mono_ns, c.cores FROM run_cpu_samples c "
            "JOIN runs r ON r.id = c.run_id ORDER BY c.mono_ns"
        )
    assert [a.acked_seq for a in got] == [3, 1]  # type: ignore[union-attr]
    assert [tuple(r) for r in hosts] == [(5, 20.0, 64, None, "b"), (7, None, None, None, None)]
    assert [tuple(r) for r in cpus] == [(run, 5, 1.5), (run, 6, 2.0)]


@pytest.mark.parametrize("storage_url", ["postgres"], indirect=True)
async def test_a_connection_goes_back_to_the_pool_without_a_reset(storage_url: str) -> None:
    """A group's batches are answered once its connection is back in the
    pool: no reset (``RESET ALL``, ``UNLISTEN *``, ...) is sent before,
    one round trip less (gpuprof leaves nothing on a session)."""
    import asyncpg

    from tests.backends import PG_URL

    async with open_store(storage_url) as store:
        got = await store.transaction(lambda txn: txn.fetch("SELECT pg_backend_pid()"))
        pid = int(got[0][0])
        conn = await asyncpg.connect(PG_URL)
        try:
            last = await conn.fetchval("SELECT query FROM pg_stat_activity WHERE pid = $1", pid)
        finally:
            await conn.close()
    assert last.strip().rstrip(";").upper() == "COMMIT"


def test_stored_gpus_leave_out_only_what_the_upsert_would_not_change() -> None:
    """A GPU known stored with its clock is left out; one known stored
    without is left out unless now given a clock; nothing is known before
    a commit, nor after a failed transaction."""
    stored = pgbulk.StoredGpus()
    a, a_clock, b = ("gpu-a", "b", None), ("gpu-a", "b", 1980.0), ("gpu-b", "b", 1410.0)
    assert stored.unknown(pgbulk.gpus_once([a, b, a_clock])) == [a_clock, b]
    stored.learn([a])
    assert stored.unknown([a, b]) == [b]
    assert stored.unknown([("gpu-a", "b", 1980.0)]) == [a_clock]  # its clock still to store
    stored.learn([a_clock, b])
    assert stored.unknown([a, ("gpu-a", "b", 1410.0), ("gpu-b", "b", None)]) == []
    assert stored.unknown([("gpu-a", "other boot", None)]) == [("gpu-a", "other boot", None)]
    stored.forget()
    assert stored.unknown([a, b]) == [a, b]


async def test_a_replicas_known_gpus_store_what_every_upsert_stores(storage_url: str) -> None:
    """With the GPUs a replica knows stored (:class:`pgbulk.StoredGpus`) the
    rollups read back as without: a clock given later is stored, the first
    clock kept; what a group stored is known once it commits (Postgres),
    and nothing once a group fails."""
    stored = pgbulk.StoredGpus()
    g0 = {"uuid": "gpu-a", "boot_id": "b"}

    def second(node: str, seq: int, s: int, **extra: Any) -> dict[str, Any]:
        return validate(batch(node, [_rollup_event(seq, [{**g0, "sec_ns": s, "n": 1, **extra}])]))

    async with open_store(storage_url) as store:
        for group in (
            [second("n1", 1, 0)],  # no clock yet
            [second("n1", 2, 10**9), second("n1", 3, 2 * 10**9, sm_limit_mhz=1980)],
            [second("n1", 4, 3 * 10**9, sm_limit_mhz=1410)],  # the first clock is kept
        ):
            assert all(isinstance(a, Applied) for a in await apply_batches(store, group, stored))
        known = stored.unknown([("gpu-a", "b", 1410.0)])
        bad = validate(batch("n2", [steps_event(1, new_uuid())]))  # a run never announced
        got = await apply_batches(store, [second("n1", 5, 4 * 10**9), bad], stored)
        rows = await store.fetchall("SELECT sec_ns, sm_limit_mhz FROM gpu_rollups ORDER BY sec_ns")
        gpus = await _count(store, "SELECT COUNT(*) FROM gpus")
    assert [tuple(r) for r in rows] == [(s * 10**9, 1980.0) for s in range(5)]
    assert gpus == 1 and isinstance(got[0], Applied) and isinstance(got[1], BatchError)
    if storage_url.startswith("postgres"):  # SQLite upserts its GPUs row by row, knowing none
        assert known == []
    assert stored.unknown([("gpu-a", "b", 1410.0)]) == [("gpu-a", "b", 1410.0)]


async def test_a_gpu_known_stored_but_gone_is_stored_again(storage_url: str) -> None:
    """A GPU a replica knows stored whose row is gone (another database
    behind the same URL): the batch's transaction is made again with every
    GPU named, and stored."""
    stored = pgbulk.StoredGpus()
    g0 = {"uuid": "gpu-a", "boot_id": "b", "n": 1, "sm_limit_mhz": 1980}

    def second(seq: int, s: int) -> dict[str, Any]:
        return validate(batch("n1", [_rollup_event(seq, [{**g0, "sec_ns": s}])]))

    async with open_store(storage_url) as store:
        assert isinstance((await apply_batches(store, [second(1, 0)], stored))[0], Applied)
        await store.write("DELETE FROM gpu_seconds")
        await store.write("DELETE FROM gpus")
        got = await apply_batches(store, [second(2, 10**9)], stored)
        rows = await store.fetchall("SELECT uuid, sec_ns, sm_limit_mhz FROM gpu_rollups")
    assert isinstance(got[0], Applied), got
    assert [tuple(r) for r in rows] == [("gpu-a", 10**9, 1980.0)]
