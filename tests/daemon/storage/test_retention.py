"""A team server's retention on each backend: ended runs past the cutoff go
with their rows, in bounded passes; running and newer runs stay, and so do
the node rows a remaining run reads."""

from __future__ import annotations

from gpuprofd.storage.upkeep import retention
from gpuprofd.storage.writes import apply_batch, validate
from tests.daemon.batches import BOOT, batch, new_uuid, run_event, steps_event
from tests.daemon.storage.test_backends import open_store

DAY_NS = 86_400 * 10**9
NOW = 1_800_000_000 * 10**9


def host_rows(first_s: int, n: int) -> dict:
    rows = [{"mono_ns": (first_s + i) * 10**9, "boot_id": BOOT, "cpu_pct": 10.0} for i in range(n)]
    return {"kind": "host_samples", "rows": rows}


async def test_old_runs_go_with_their_rows(storage_url: str, monkeypatch) -> None:
    monkeypatch.setattr(retention, "RUNS_PER_PASS", 2)  # several passes
    old = [new_uuid() for _ in range(5)]
    new, live = new_uuid(), new_uuid()
    events = []
    for i, run in enumerate(old):
        events += [run_event(0, run, start_mono_ns=1_000_000_000), steps_event(0, run)]
        end = {"status": "finished", "end_wall_ns": NOW - 10 * DAY_NS + i}
        events.append({"seq": 0, "kind": "end", "run": run, "fields": end})
    # the newer run of the same boot starts at 500 s: host rows before it are nobody's now
    events += [run_event(0, new, start_mono_ns=500 * 10**9), steps_event(0, new)]
    events.append(
        {"seq": 0, "kind": "end", "run": new, "fields": {"status": "finished", "end_wall_ns": NOW}}
    )
    events += [run_event(0, live, boot_id="other-boot"), host_rows(0, 1000)]
    for seq, ev in enumerate(events, 1):
        ev["seq"] = seq
    async with open_store(storage_url) as store:
        await apply_batch(store, validate(batch("n1", events)))
        runs, rows = await retention.apply_retention(store, NOW - 7 * DAY_NS)
        left = [r[0] for r in await store.fetchall("SELECT run_uuid FROM runs ORDER BY id")]
        steps = await store.fetchall("SELECT DISTINCT run_id FROM steps")
        host = await store.fetchone("SELECT COUNT(*), MIN(mono_ns) FROM host_samples")
    assert runs == 5 and left == [new, live]
    assert len(steps) == 1
    assert rows == 500 and tuple(host) == (500, 500 * 10**9)
