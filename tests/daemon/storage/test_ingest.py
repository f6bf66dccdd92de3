"""Applying ingest batches on each backend: one transaction, idempotent by
(node, sequence), overlap and bad input handled as docs/team-server.md says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuprofd.storage import reads
from gpuprofd.storage.writes import BatchError, IngestConflict, apply_batch, validate
from gpuprofd.storage.writes.ingest import _step_columns, apply_batches
from tests.daemon.batches import batch, new_uuid, run_event, steps_event
from tests.daemon.storage.test_backends import open_store

DOC = Path(__file__).resolve().parents[3] / "docs" / "team-server.md"


def doc_example() -> dict[str, Any]:
    """The example batch of docs/team-server.md (its first JSON block)."""
    text = DOC.read_text()
    block = re.search(r"```json\n(.*?)```", text, re.S)
    assert block is not None
    return orjson.loads(block.group(1))


async def counts(store: Any) -> dict[str, int]:
    out = {}
    for table in ("runs", "steps", "gpu_rollups", "host_samples", "kernel_stats", "insights"):
        row = await store.fetchone(f"SELECT COUNT(*) FROM {table}")
        out[table] = row[0]
    return out


async def test_the_documented_example_applies_once(storage_url: str) -> None:
    example = validate(doc_example())
    async with open_store(storage_url) as store:
        first = await apply_batch(store, example)
        again = await apply_batch(store, example)
        got = await counts(store)
        run = await reads.find_run(store, run_id=first.run_ids[0])
    assert (first.acked_seq, first.applied, first.skipped) == (5, 5, 0)
    assert (again.acked_seq, again.applied, again.skipped) == (5, 0, 5)
    assert got["runs"] == 1 and got["steps"] == 2 and got["gpu_rollups"] == 1
    assert got["host_samples"] == 1
    assert first.ended_run_ids == first.run_ids
    assert run["status"] == "finished" and run["run_name"] == "llama-7b-sft"
    assert run["run_uuid"] == "0e6a3c1f-58f2-4c8e-9a43-f3d3c0b7d9e2"
    assert run["node_id"] == "5b0d6f43-9d7e-4f27-a0f3-41c9e2b1d8aa"
    assert run["options"] == {"dtype": "bfloat16"} and run["end_mono_ns"] == 65_000_000_000


async def test_an_overlapping_batch_stores_only_its_new_events(storage_url: str) -> None:
    run = new_uuid()
    async with open_store(storage_url) as store:
        await apply_batch(store, validate(batch("n1", [run_event(1, run), steps_event(2, run, 0)])))
        # resent with one more event: seq 1-2 were applied, only 3 is new
        overlap = [run_event(1, run), steps_event(2, run, 0), steps_event(3, run, 5)]
        got = await apply_batch(store, validate(batch("n1", overlap)))
        # a gap (4-9 never sent) is fine
        gap = await apply_batch(store, validate(batch("n1", [steps_event(10, run, 10)])))
        steps = (await store.fetchone("SELECT COUNT(*) FROM steps"))[0]
        node = await store.fetchone("SELECT last_seq, batches, events FROM ingest_nodes")
    assert (got.applied, got.skipped, got.acked_seq) == (1, 2, 3)
    assert gap.acked_seq == 10 and steps == 15
    assert tuple(node) == (10, 3, 4)


async def test_nodes_have_their_own_sequences_and_runs(storage_url: str) -> None:
    a, b = new_uuid(), new_uuid()
    async with open_store(storage_url) as store:
        await apply_batch(store, validate(batch("n1", [run_event(1, a)])))
        other = await apply_batch(store, validate(batch("n2", [run_event(1, b)])))
        with pytest.raises(IngestConflict, match=r"events\[1\]\.run: run .* another node"):
            await apply_batch(store, validate(batch("n2", [steps_event(2, b), steps_event(3, a)])))
        with pytest.raises(IngestConflict):  # nor may it rewrite the run itself
            await apply_batch(store, validate(batch("n2", [run_event(4, a, name="stolen")])))
        steps = (await store.fetchone("SELECT COUNT(*) FROM steps"))[0]
        names = [r[0] for r in await store.fetchall("SELECT run_name FROM runs ORDER BY id")]
        seq = (await store.fetchone("SELECT last_seq FROM ingest_nodes WHERE node_id = 'n2'"))[0]
    assert other.acked_seq == 1 and other.applied == 1
    assert steps == 0 and names == ["exp", "exp"] and seq == 1  # nothing of either batch


async def test_a_step_sent_again_under_a_new_seq_is_stored_once(storage_url: str) -> None:
    run = new_uuid()
    async with open_store(storage_url) as store:
        await apply_batch(store, validate(batch("n1", [run_event(1, run), steps_event(2, run, 0)])))
        # steps 3-4 again (seq 3), then 3-7 (seq 4: 5-7 new), in one batch
        again = [steps_event(3, run, 3, n=2), steps_event(4, run, 3, n=5)]
        got = await apply_batch(store, validate(batch("n1", again)))
        # a step sent twice in one event: the first is kept
        twice = steps_event(5, run, 8, n=1)
        twice["rows"].append({**twice["rows"][0], "wait_ns": 1})
        await apply_batch(store, validate(batch("n1", [twice])))
        steps = await store.fetchall("SELECT step, wait_ns FROM steps ORDER BY step, t0_ns")
        acked = (await store.fetchone("SELECT last_seq FROM ingest_nodes"))[0]
    assert (got.applied, got.skipped, got.acked_seq, acked) == (2, 0, 4, 5)  # events applied
    assert [r[0] for r in steps] == list(range(9))  # each step once
    assert steps[8][1] == 10_000_000  # the first of the two step 8s (wait_ns 1 dropped)


async def test_a_reused_step_index_with_another_start_is_its_own_step(storage_url: str) -> None:
    """A manual loop numbering its steps again (prof.step(i) per epoch): the
    node stores both, so the server does too; only a resend is dropped."""
    run = new_uuid()
    epoch2 = steps_event(3, run, 0, n=3)
    for r in epoch2["rows"]:  # the same indices 0-2, 10 s later
        r["t0_ns"] += 10_000_000_000
        r["t1_ns"] += 10_000_000_000
    async with open_store(storage_url) as store:
        first = [run_event(1, run), steps_event(2, run, 0, n=3), epoch2]
        await apply_batch(store, validate(batch("n1", first)))
        resent = dict(epoch2, seq=4)  # epoch 2 sent again
        await apply_batch(store, validate(batch("n1", [resent])))
        steps = await store.fetchall("SELECT step, t0_ns FROM steps ORDER BY t0_ns")
    assert [r[0] for r in steps] == [0, 1, 2, 0, 1, 2]
    assert steps[3][1] - steps[0][1] == 10_000_000_000


def _comm_event(seq: int, run: str, step: int, buckets: int) -> dict[str, Any]:
    rows = [
        {"step": step, "bucket": b, "start_ns": 1_000 + b, "end_ns": 2_000 + b, "bytes": 4096}
        for b in range(buckets)
    ]
    return {"seq": seq, "kind": "comm", "run": run, "rows": rows}


async def test_comm_buckets_sent_again_are_stored_once(storage_url: str) -> None:
    """A step's buckets are one packed row, known by (step, first launch): sent
    again (stored before, or earlier in the batch) they are dropped; the index
    used again at another time (a manual loop) is a step of its own."""
    run = new_uuid()
    async with open_store(storage_url) as store:
        events = [run_event(1, run), _comm_event(2, run, 0, 3), _comm_event(3, run, 0, 3)]
        await apply_batch(store, validate(batch("n1", events)))
        await apply_batch(store, validate(batch("n1", [_comm_event(4, run, 0, 3)])))
        again = _comm_event(5, run, 0, 2)
        for r in again["rows"]:
            r["start_ns"] += 10**9
        loose = _comm_event(6, run, 1, 2)  # no index or times: kept as sent
        for r in loose["rows"]:
            r["bucket"] = r["start_ns"] = r["end_ns"] = None
        await apply_batch(store, validate(batch("n1", [again, loose])))
        await apply_batch(store, validate(batch("n1", [{**loose, "seq": 7}])))
        (run_id,) = await store.fetchone("SELECT id FROM runs")
        rows = await reads.comm_buckets(store, run_id)
    assert [r[:3] for r in rows] == [
        (0, 0, 1_000),
        (0, 1, 1_001),
        (0, 2, 1_002),
        (0, 0, 10**9 + 1_000),
        (0, 1, 10**9 + 1_001),
        (1, None, None),
        (1, None, None),
    ]


async def test_steps_of_an_unknown_run_store_nothing(storage_url: str) -> None:
    run = new_uuid()
    async with open_store(storage_url) as store:
        with pytest.raises(BatchError) as err:
            await apply_batch(
                store, validate(batch("n1", [run_event(1, new_uuid()), steps_event(2, run)]))
            )
        got = await counts(store)
        nodes = await store.fetchall("SELECT last_seq FROM ingest_nodes")
    assert err.value.field == "events[1].run" and "send its run event first" in str(err.value)
    assert got["runs"] == 0 and got["steps"] == 0 and nodes == []


def test_sequences_must_increase_within_a_batch() -> None:
    run = new_uuid()
    with pytest.raises(BatchError) as err:
        validate(batch("n1", [run_event(5, run), steps_event(4, run)]))
    assert err.value.field == "events[1].seq" and "increase" in err.value.detail
    with pytest.raises(BatchError) as err:
        validate(batch("n1", [run_event(5, run), steps_event(5, run)]))
    assert err.value.field == "events[1].seq"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b.update(v=2), "v"),
        (lambda b: b.update(node="a b"), "node"),
        (lambda b: b.update(events=[]), "events"),
        (lambda b: b["events"][0].update(run="not-a-uuid"), "events[0].run"),
        (lambda b: b["events"][0].update(kind="drop_tables"), "events[0].kind"),
        (lambda b: b["events"][0]["fields"].pop("run_name"), "events[0].fields.run_name"),
        (lambda b: b["events"][0]["fields"].update(status="done"), "events[0].fields.status"),
        (lambda b: b["events"][0]["fields"].update(pid=-1), "events[0].fields.pid"),
        (lambda b: b["events"][0]["fields"].update(host="a\x00b"), "events[0].fields.host"),
        (lambda b: b["events"][1]["rows"][3].update(t0_ns="1"), "events[1].rows[3].t0_ns"),
        (lambda b: b["events"][1]["rows"][2].update(t1_ns=0), "events[1].rows[2].t1_ns"),
        (lambda b: b["events"][1]["rows"][0].update(phases=[]), "events[1].rows[0].phases"),
        (lambda b: b["events"][1].update(rows={}), "events[1].rows"),
    ],
)
def test_the_first_bad_field_is_named(mutate: Any, field: str) -> None:
    run = new_uuid()
    b = batch("n1", [run_event(1, run), steps_event(2, run)])
    validate(b)  # valid as built
    mutate(b)
    with pytest.raises(BatchError) as err:
        validate(b)
    assert err.value.field == field


def test_hostile_strings_pass_as_they_are() -> None:
    name = "x'); DROP TABLE runs;-- <script>alert(1)</script> \u202egnp.exe"
    b = validate(batch("n1", [run_event(1, new_uuid(), name=name)]))
    assert b["events"][0]["fields"]["run_name"] == name


async def _to_schema_9(store: Any) -> None:
    """Take today's tables back to schema 9 (before the team server's)."""
    await store.write("DROP INDEX runs_uuid")
    for column in ("run_uuid", "node_id"):
        await store.write(f"ALTER TABLE runs DROP COLUMN {column}")
    for table in ("ingest_nodes", "login_limits", "server_secrets"):
        await store.write(f"DROP TABLE {table}")
    await store.write("UPDATE meta SET value = '9' WHERE key = 'schema_version'")


async def test_a_schema_9_database_is_upgraded_and_takes_batches(storage_url: str) -> None:
    from gpuprofd.storage import schema
    from gpuprofd.storage.writes import runsdb

    async with open_store(storage_url) as store:
        old = await runsdb.insert_run(store, {"run_key": "k", "run_name": "before", "status": "x"})
        await _to_schema_9(store)
    if storage_url.startswith("sqlite"):  # gpuprofctl reads a schema-9 file as it is
        conn = reads.open_ro(Path(storage_url.removeprefix("sqlite:///")))
        try:
            row = conn.execute("SELECT run_name, run_uuid, node_id FROM runs").fetchone()
        finally:
            conn.close()
        assert tuple(row) == ("before", None, None)
    async with open_store(storage_url) as store:
        version = (await store.fetchone("SELECT value FROM meta WHERE key = 'schema_version'"))[0]
        got = await apply_batch(store, validate(batch("n1", [run_event(1, new_uuid())])))
        uuids = await store.fetchall("SELECT id, run_uuid FROM runs ORDER BY id")
    assert version == str(schema.SCHEMA_VERSION)
    assert got.applied == 1 and [u[1] is None for u in uuids] == [True, False]
    assert uuids[0][0] == old


def _stacks_event(seq: int, run: str, rows: list[list[Any]], source: str = "main") -> dict:
    return {"seq": seq, "kind": "stacks", "run": run, "source": source, "rows": rows}


async def test_forwarded_stack_samples_add_up_once(storage_url: str) -> None:
    run = new_uuid()
    save = ["/home/u/train.py", 212, "save_checkpoint", "torch.save"]
    first = batch("n1", [run_event(1, run), _stacks_event(2, run, [[*save, 20, 3]])])
    later = batch(
        "n1",
        [
            _stacks_event(
                3,
                run,
                [[*save, 20, 4]],
            )
        ],
    )
    async with open_store(storage_url) as store:
        await apply_batch(store, validate(first))
        await apply_batch(store, validate(first))  # resent: applied once
        await apply_batch(store, validate(later))
        rows = await store.fetchall("SELECT source, step, line, callee, samples FROM stack_samples")
    assert [tuple(r) for r in rows] == [("main", 20, 212, "torch.save", 7)]


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({"source": "worker"}, "events[1].source"),
        ({"rows": "x"}, "events[1].rows"),
        ({"rows": [["/a.py", 1, "f", "", 0, 0]]}, "events[1].rows[0]"),
        ({"rows": [["/a.py", 1, "f", None, 0, 1]]}, "events[1].rows[0]"),
    ],
)
def test_a_bad_stacks_event_names_its_field(event: dict[str, Any], field: str) -> None:
    run = new_uuid()
    ev = {**_stacks_event(2, run, [["/a.py", 1, "f", "", 0, 1]]), **event}
    with pytest.raises(BatchError) as err:
        validate(batch("n1", [run_event(1, run), ev]))
    assert err.value.field == field


async def test_an_evidence_window_forwarded_keeps_its_link(storage_url: str) -> None:
    """A node's evidence window (its outbox event, as the node writes it) on
    the team server: stored with its link to the server's own window id, so
    a finding's evidence (by request id) finds it there too."""
    from gpuprofd.storage.writes import outbox

    run = new_uuid()
    msg = {
        "t0": 5_000,
        "t1": 95_000,
        "source": "evidence",
        "steps": [40],
        "rows": [["aten::mm", "op", "compute", 2, 80_000, 78_000, 2e9]],
        "evidence": {"id": "req-9", "rule": "high_step_variance", "time": "cpu"},
    }
    _, body, _ = outbox.kernels(1, msg).encode(None, None)  # type: ignore[arg-type]
    kernels_event = {"seq": 2, "kind": "kernels", "run": run, **body}
    async with open_store(storage_url) as store:
        # another run's windows first: the server's ids are not the node's
        other = new_uuid()
        snapshot = {**body, "window": {**body["window"], "source": "snapshot", "evidence": None}}
        await apply_batch(store, validate(batch("n2", [run_event(1, other)])))
        await apply_batch(
            store, validate(batch("n2", [{"seq": 2, "kind": "kernels", "run": other, **snapshot}]))
        )
        got = await apply_batch(store, validate(batch("n1", [run_event(1, run), kernels_event])))
        (w,) = await reads.evidence_windows(store, got.run_ids[0])
        ids = {win["id"] for win, _ in await reads.kernel_windows(store, got.run_ids[0])}
    assert (w["request_id"], w["rule"], w["time"], w["steps"]) == (
        "req-9",
        "high_step_variance",
        "cpu",
        [40],
    )
    assert w["window_id"] in ids and w["rows"][0].name == "aten::mm"


async def test_steps_of_several_runs_in_one_batch_keep_their_runs(storage_url: str) -> None:
    """A batch's steps events are built into rows together: each row keeps
    its own event's run, and a repeat within the batch is still dropped."""
    a, b = new_uuid(), new_uuid()
    events = [
        run_event(1, a),
        run_event(2, b, name="other"),
        steps_event(3, a, 0, n=3),
        steps_event(4, b, 100, n=2),
        steps_event(5, a, 3, n=2),
        steps_event(6, b, 101, n=3),  # 101 again (sent twice): stored once
    ]
    async with open_store(storage_url) as store:
        got = await apply_batch(store, validate(batch("n1", events)))
        rows = await store.fetchall(
            "SELECT r.run_name, s.step FROM steps s JOIN runs r ON r.id = s.run_id "
            "ORDER BY r.run_name, s.step"
        )
    assert got.applied == 6
    assert [tuple(r) for r in rows] == [("exp", i) for i in range(5)] + [
        ("other", i) for i in (100, 101, 102, 103)
    ]


async def test_steps_without_optional_values_store_the_defaults(storage_url: str) -> None:
    """A group's steps insert leaves out the columns no row of it gives a
    value of but the default: every step reads back as it was sent, each
    column left out as its default (0 or NULL), a 0 memory reading as 0."""
    bare = {"t1_ns": 2, "wait_ns": 1, "micro": 1, "phases": {"forward": 1}}
    empty = {"skipped": False, "eval_ns": 0, "optimizers": [], "mem_peak_bytes": None}
    full = {"skipped": True, "eval_ns": 7, "traced": 1, "mem_allocated_bytes": 0}
    full["optimizers"] = [{"name": "adam", "updates": 1, "skipped": 0, "ns": 3}]
    a, b, c = new_uuid(), new_uuid(), new_uuid()

    def steps(seq: int, run: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        sent = [{"step": i, "t0_ns": 1, **bare, **r} for i, r in enumerate(rows)]
        return {"seq": seq, "kind": "steps", "run": run, "rows": sent}

    hello = [batch(f"n{i}", [run_event(1, run)]) for i, run in enumerate((a, b, c))]
    plain = [batch("n0", [steps(2, a, [{}, empty])])]  # nothing but defaults
    mixed = [batch("n1", [steps(2, b, [empty, {}])]), batch("n2", [steps(2, c, [{}, full])])]
    cols = "skipped, eval_ns, optimizers, mem_allocated_bytes, mem_peak_bytes, traced"

    def columns(group: list[dict[str, Any]]) -> set[str]:
        events = [ev for x in group for ev in validate(x)["events"]]
        return set(_step_columns([ev["rows"] for ev in events]))

    named = {"run_id", "step", "t0_ns", "t1_ns", "wait_ns", "explicit", "micro", "phases"}
    assert columns(plain) == named
    assert columns(mixed) == named | set(cols.split(", ")) - {"mem_peak_bytes"}
    async with open_store(storage_url) as store:
        await apply_batches(store, [validate(h) for h in hello])
        for group in (plain, mixed):
            done = await apply_batches(store, [validate(x) for x in group])
            assert [getattr(d, "applied", d) for d in done] == [1] * len(group)
        got = await store.fetchall(
            f"SELECT r.run_uuid, s.step, s.wait_ns, s.micro, s.phases, {cols} "
            "FROM steps s JOIN runs r ON r.id = s.run_id"
        )
    rows = {(r[0], r[1]): tuple(r[2:]) for r in got}
    default = (1, 1, '{"forward":1}', 0, 0, None, None, None, 0)
    optimizers = '[{"name":"adam","updates":1,"skipped":0,"ns":3}]'
    assert rows == {
        (a, 0): default,
        (a, 1): default,
        (b, 0): default,
        (b, 1): default,
        (c, 0): default,
        (c, 1): (1, 1, '{"forward":1}', 1, 7, optimizers, 0, None, 1),
    }
