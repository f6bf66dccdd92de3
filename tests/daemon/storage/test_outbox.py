"""The forwarding outbox (:mod:`gpuprofd.storage.writes.outbox`) on each backend:
each stored op's events written in its own transaction (none for an op
that fails), the node id made once, sequence numbers that only grow, what
acknowledgements, dead letters and the byte bound take out of it, and the
batches made of it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

from gpuprof.insights import Insight
from gpuprofd.core.counters import DropCounter
from gpuprofd.sampling.rollup import ROLLUP_COLUMNS
from gpuprofd.storage import schema
from gpuprofd.storage.url import parse
from gpuprofd.storage.writes import OUTBOX_ROW_BYTES, Store, outbox, runsdb
from tests.daemon.storage.test_backends import run_row, step_msg


@contextlib.asynccontextmanager
async def forwarding_store(url: str, drops: DropCounter | None = None) -> AsyncIterator[Store]:
    parsed = parse(url)
    if parsed.path is not None:
        schema.prepare(parsed.path)
    store = Store(parsed, drops or DropCounter())
    await store.open()
    store.forwarding = True
    store.start()
    try:
        yield store
    finally:
        await store.close()


async def _outbox(store: Store) -> list[tuple[Any, ...]]:
    rows = await store.fetchall(
        "SELECT seq, kind, run_id, priority, body, n_rows, bytes FROM outbox ORDER BY seq"
    )
    return [tuple(r) for r in rows]


def _rollup(sec: int) -> tuple[Any, ...]:
    row: dict[str, Any] = dict.fromkeys(ROLLUP_COLUMNS)
    row.update(sec_ns=sec * 1_000_000_000, uuid="gpu-0", n=10, util_mean=50.0, boot_id="b")
    return tuple(row[c] for c in ROLLUP_COLUMNS)


_FOUND = Insight("dataloader_stall", "high", "Loader stall", "d", "f", {"pct": 40.0})


async def _fill(store: Store, rounds: int = 3) -> int:
    """A run and, *rounds* times, a host sample, a GPU rollup, a step and a
    CPU sample; then its insights and its end. Returns the run's id."""
    run_id = await runsdb.insert_run(store, run_row())
    for i in range(rounds):
        store.submit_nowait(runsdb.host_sample_op(i, 50.0, 4, None))
        store.submit_nowait(runsdb.rollup_op(_rollup(i)))
        store.submit_nowait(runsdb.step_op(run_id, step_msg(i)))
        store.submit_nowait(runsdb.run_cpu_op(run_id, i, 1.5))
        await store.flush()
    await runsdb.replace_insights(store, run_id, [_FOUND])
    await runsdb.update_run(store, run_id, ended=True, status="finished", summary="{}")
    return run_id


async def test_each_stored_op_writes_its_event_with_it(storage_url: str) -> None:
    async with forwarding_store(storage_url) as store:
        run_id = await _fill(store, rounds=1)
        rows = await _outbox(store)
    kinds = [(r[1], r[2], r[3]) for r in rows]
    assert kinds == [
        ("run", run_id, outbox.PRIORITY_RUN),
        ("host_samples", None, outbox.PRIORITY_RAW),
        ("gpu_rollups", None, outbox.PRIORITY_ROLLUP),
        ("steps", run_id, outbox.PRIORITY_STEPS),
        ("run_cpu", run_id, outbox.PRIORITY_RAW),
        ("insights", run_id, outbox.PRIORITY_INSIGHTS),
        ("end", run_id, outbox.PRIORITY_RUN),
    ]
    assert [r[0] for r in rows] == list(range(1, 8))
    by_kind = {r[1]: r for r in rows}
    assert by_kind["run"][4] is None and by_kind["run"][6] == OUTBOX_ROW_BYTES  # read when sent
    (step,) = orjson.loads(by_kind["steps"][4])["rows"]
    assert (step["step"], step["t1_ns"] - step["t0_ns"], step["phases"]) == (
        0,
        9_000_000,
        step_msg(0)["phases"],
    )
    (found,) = orjson.loads(by_kind["insights"][4])["insights"]
    assert found["rule"] == "dataloader_stall" and found["evidence"] == {"pct": 40.0}
    for r in rows:
        assert r[6] == OUTBOX_ROW_BYTES + len(r[4] or "")  # what the bound counts
        assert r[5] == (0 if r[1] in ("run", "end") else 1)


async def test_an_op_that_fails_writes_no_event(storage_url: str) -> None:
    drops = DropCounter()
    async with forwarding_store(storage_url, drops) as store:
        run_id = await runsdb.insert_run(store, run_row())
        store.submit_nowait(runsdb.step_op(run_id, step_msg(0)))
        store.submit_nowait(runsdb.step_op(None, step_msg(1)))  # type: ignore[arg-type]  # NOT NULL
        store.submit_nowait(runsdb.step_op(run_id, step_msg(2)))
        comm = [[0, 10, 20, 4096]]
        store.submit_nowait(runsdb.step_op(None, step_msg(3, comm=comm)))  # type: ignore[arg-type]
        await store.flush()
        steps = await store.fetchall("SELECT step FROM steps ORDER BY step")
        rows = await _outbox(store)
    assert [r[0] for r in steps] == [0, 2]
    assert [(r[1], orjson.loads(r[4])["rows"][0]["step"] if r[4] else None) for r in rows] == [
        ("run", None),
        ("steps", 0),
        ("steps", 2),
    ]
    assert drops.snapshot() == {"store_error": 2}


async def test_a_store_that_does_not_forward_writes_no_events(storage_url: str) -> None:
    async with forwarding_store(storage_url) as store:
        store.forwarding = False
        run_id = await runsdb.insert_run(store, run_row())
        await store.submit(runsdb.step_op(run_id, step_msg(0)))
        await store.flush()
        assert await _outbox(store) == []


async def test_the_node_id_is_made_once_and_kept(storage_url: str) -> None:
    async with forwarding_store(storage_url) as store:
        first = await outbox.node_id(store)
        assert await outbox.node_id(store) == first
    async with forwarding_store(storage_url) as store:
        assert await outbox.node_id(store) == first
    assert len(first) == 36 and first.count("-") == 4  # a UUID


async def test_sequence_numbers_only_grow_across_a_reopen(storage_url: str) -> None:
    async with forwarding_store(storage_url) as store:
        await _fill(store, rounds=1)
        last = (await _outbox(store))[-1][0]
        await outbox.ack(store, last)  # everything acknowledged: the table is empty
        assert await _outbox(store) == []
    async with forwarding_store(storage_url) as store:
        await runsdb.insert_run(store, run_row("k2"))
        assert [r[0] for r in await _outbox(store)] == [last + 1]  # never a number again


async def test_ack_forgets_up_to_what_the_server_applied(storage_url: str) -> None:
    async with forwarding_store(storage_url) as store:
        await _fill(store, rounds=1)
        await outbox.ack(store, 4)
        assert [r[0] for r in await _outbox(store)] == [5, 6, 7]
        await outbox.ack(store, 2)  # an older answer: nothing more
        assert [r[0] for r in await _outbox(store)] == [5, 6, 7]


async def test_dead_letters_leave_the_outbox_with_the_servers_reason(storage_url: str) -> None:
    async with forwarding_store(storage_url) as store:
        await _fill(store, rounds=1)
        before = {r[0]: r for r in await _outbox(store)}
        await outbox.dead_letter(store, [2, 4], 400, "400: no", 111)
        await outbox.dead_letter(store, [6], 409, "409: another node's run", 222)
        await outbox.dead_letter(store, [6], 409, "again", 333)  # gone already: nothing
        left = [r[0] for r in await _outbox(store)]
        dead = await store.fetchall(
            "SELECT seq, kind, body, status, reason, dead_wall_ns FROM outbox_dead ORDER BY seq"
        )
        state = await outbox.state(store)
    assert left == [1, 3, 5, 7]
    assert [tuple(d) for d in dead] == [
        (2, "host_samples", before[2][4], 400, "400: no", 111),
        (4, "steps", before[4][4], 400, "400: no", 111),
        (6, "insights", before[6][4], 409, "409: another node's run", 222),
    ]
    assert (state.events, state.dead_events, state.dead_reason) == (4, 3, "409: another node's run")
    assert state.bytes == sum(before[s][6] for s in left)


async def test_the_bound_gives_up_raw_then_rollups_insights_steps_never_runs(
    storage_url: str,
) -> None:
    async with forwarding_store(storage_url) as store:
        run_id = await _fill(store, rounds=3)
        rows = await _outbox(store)
        total = sum(r[6] for r in rows)
        by_prio: dict[int, list[tuple[Any, ...]]] = {}
        for r in rows:
            by_prio.setdefault(r[3], []).append(r)

        async def seqs() -> list[int]:
            return [r[0] for r in await _outbox(store)]

        # under the bound: nothing
        assert await outbox.enforce_limit(store, total) == 0 and len(await seqs()) == len(rows)
        # a little over: the oldest raw event only
        oldest_raw = by_prio[outbox.PRIORITY_RAW][0]
        assert await outbox.enforce_limit(store, total - oldest_raw[6]) == 1
        assert oldest_raw[0] not in await seqs() and len(await seqs()) == len(rows) - 1
        # over by every raw, rollup and insights event and the first step: those go
        first_step = by_prio[outbox.PRIORITY_STEPS][0]
        low = [r for p in (0, 1, 2) for r in by_prio[p]]
        bound = total - sum(r[6] for r in low) - first_step[6]
        assert await outbox.enforce_limit(store, bound) == len(low) - 1 + 1
        kept = [r for r in rows if r not in low and r != first_step]
        assert await seqs() == [r[0] for r in kept]
        # no room at all: every step goes, the run and its end stay
        assert await outbox.enforce_limit(store, 0) == 2
        assert [(r[1], r[2]) for r in await _outbox(store)] == [("run", run_id), ("end", run_id)]
        given = await store.fetchall(
            "SELECT run_id, kind, events, bytes FROM forward_given_up ORDER BY kind"
        )
        state = await outbox.state(store)

    def size(kind: str) -> int:
        return sum(r[6] for r in rows if r[1] == kind)

    assert [tuple(g) for g in given] == [
        (0, "gpu_rollups", 3, size("gpu_rollups")),
        (0, "host_samples", 3, size("host_samples")),
        (run_id, "insights", 1, size("insights")),
        (run_id, "run_cpu", 3, size("run_cpu")),
        (run_id, "steps", 3, size("steps")),
    ]
    assert (state.given_up_events, state.events) == (13, 2)
    async with forwarding_store(storage_url) as store:
        assert await outbox.given_up_for_run(store, run_id) == 7


async def test_events_acknowledged_meanwhile_are_not_counted_as_given_up(
    storage_url: str,
) -> None:
    """The bound reads the oldest raw events, then gives them up; if the
    server acknowledged them in between (the forwarder sends the oldest
    first), they reached the server and must not be said to be lost."""
    async with forwarding_store(storage_url) as store:
        await _fill(store, rounds=2)
        waiting = await outbox.waiting(store)
        raw = [w for w in waiting if w.kind == "host_samples"]
        await outbox.ack(store, raw[0].seq)  # the first one arrived there just now
        await outbox.give_up(store, raw)
        given = await store.fetchall("SELECT kind, events, bytes FROM forward_given_up")
        left = [w.seq for w in await outbox.waiting(store)]
    assert [tuple(g) for g in given] == [("host_samples", 1, raw[1].bytes)]
    assert raw[0].seq not in left and raw[1].seq not in left


async def test_a_batch_carries_each_runs_fields_as_they_are_when_sent(storage_url: str) -> None:
    async with forwarding_store(storage_url) as store:
        run_id = await _fill(store, rounds=1)
        await store.write("UPDATE runs SET summary = ? WHERE id = ?", ('{"steps": 1}', run_id))
        rows = await outbox.waiting(store)
        batch = await outbox.load_batch(store, "node-1", "host-1", rows)
        assert batch.body is not None and batch.gone == [] and batch.events == 7
        sent = orjson.loads(batch.body)
        (uuid,) = await store.fetchone("SELECT run_uuid FROM runs WHERE id = ?", (run_id,))
        # taken up again (a daemon restarted while it ran): its end goes as a run event
        await store.write("UPDATE runs SET status = 'running' WHERE id = ?", (run_id,))
        again = orjson.loads((await outbox.load_batch(store, "node-1", None, rows)).body or b"")
        await store.write("DELETE FROM runs WHERE id = ?", (run_id,))
        gone = await outbox.load_batch(store, "node-1", None, rows)
    assert (sent["v"], sent["node"], sent["host"]) == (1, "node-1", "host-1")
    assert [e["seq"] for e in sent["events"]] == [w.seq for w in rows]
    run, end = sent["events"][0], sent["events"][-1]
    assert run["kind"] == "run" and run["run"] == uuid and run["fields"]["run_name"] == "exp"
    assert run["fields"]["status"] == "finished"  # the run now, not at its first write
    assert end["kind"] == "end" and end["fields"]["summary"] == {"steps": 1}
    assert again["events"][-1]["kind"] == "run"
    assert [w.kind for w in gone.gone] == ["run", "steps", "run_cpu", "insights", "end"]
    assert gone.events == 2 and gone.body is not None  # the node's own rows still go
