"""Several nodes' ingest batches applied in one transaction
(:func:`gpuprofd.storage.writes.ingest.apply_batches`), on each backend:
each batch still all or nothing, idempotent by (node, sequence), a bad one
refused alone; on Postgres the rows go in by COPY."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpuprofd.storage.writes import Applied, BatchError, IngestConflict, validate
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
        seqs = await store.fetchall("SELECT node_id, last_seq FROM ingest_nodes ORDER BY node_id")
    assert [(a.applied, a.skipped, a.acked_seq) for a in first] == [(2, 0, 3)] * 3  # type: ignore[union-attr]
    assert [(a.applied, a.skipped, a.acked_seq) for a in again] == [(0, 2, 3)] * 3  # type: ignore[union-attr]
    assert [a.acked_seq for a in renumbered] == [5, 5, 5]  # type: ignore[union-attr]
    assert steps == distinct == 30  # 10 steps of each of 3 runs, each once
    # rollups are the node's samples, not keyed: the renumbered second is a second copy
    assert rollups == 3 * 8 * 2
    assert [tuple(r) for r in seqs] == [("n1", 5), ("n2", 5), ("n3", 5)]
    if storage_url.startswith("postgres"):
        # one COPY per table for a whole group, not one per batch (the resends
        # held no new step, and the renumbered group's steps were all stored)
        assert sorted(copies) == ["gpu_rollups", "gpu_rollups", "steps"]


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
