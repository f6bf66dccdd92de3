"""Comm timing through a real gpuprofd over real ZeroMQ into real SQLite:
steps with their bucket rows, clock events, and what gpuprofctl makes of
them (runs COMM%, the summary's Comm line, insights --group with the group
rules, missing ranks)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuprof.summary import format_summary
from gpuprofd.core.counters import DropCounter
from gpuprofd.ctl import main
from gpuprofd.storage import schema
from gpuprofd.storage.writes import Part, Store, runsdb
from tests.daemon import helpers as h
from tests.gpuprof.insights.group_fixtures import BUCKET_BYTES, MS, N_BUCKETS, group_steps

SECOND = 1_000_000_000
STEPS = 30
#: group -> (ranks, group_steps kwargs, rank -> host, rank -> clock offset ns, ranks absent)
GROUPS: dict[str, tuple[int, dict[str, Any], dict[int, str], dict[int, int], set[int]]] = {
    "skew": (4, {"late_bucket": (2, 1, 5 * MS)}, {}, {}, set()),
    "straggler": (4, {"slow_backward": {1: 30 * MS}}, {}, {}, set()),
    "balanced": (2, {}, {}, {}, set()),
    "offset": (2, {"clock_shift": {1: 5 * SECOND}}, {1: "node-b"}, {1: 5 * SECOND}, set()),
    "missing": (4, {}, {}, {}, {3}),
}


def _send_group(client: h.Client, pid: int, group: str) -> list[dict[str, Any]]:
    n, kw, hosts, offsets, absent = GROUPS[group]
    steps = group_steps(n, n_steps=STEPS, **kw)
    summaries = []
    for r in range(n):
        if r in absent:  # killed before its hello: never reported
            continue
        key = f"{group}-{r}"
        host = hosts.get(r, "node-a")
        on_host = [q for q in range(n) if hosts.get(q, "node-a") == host]
        hello = h.hello(
            key,
            pid,
            run_name=group,
            rank=r,
            local_rank=on_host.index(r),
            world_size=n,
            group=group,
            local_world_size=len(on_host),
            host=host,
        )
        assert client.request(hello)["ok"]
        sent = 0
        if r in offsets:
            client.push(
                {
                    "v": 1,
                    "type": "clock",
                    "run_key": key,
                    "offset_ns": offsets[r],
                    "uncertainty_ns": 50_000,
                    "rtt_ns": 100_000,
                    "round_trips": 64,
                    "reference_rank": 0,
                }
            )
            sent += 1
        for s in steps[r]:
            client.push({"v": 1, "type": "step", "run_key": key, **s})
            sent += 1
        reply = client.request(h.bye(key, sent=sent))
        assert reply is not None and reply["ok"], reply
        summaries.append(reply["summary"])
    return summaries


@pytest.fixture(scope="module")
def comm_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any]]]:
    """One daemon, every group of :data:`GROUPS` sent and ended; the daemon stopped."""
    tmp = tmp_path_factory.mktemp("comm")
    with h.daemons_on_own_socket(tmp) as (daemons, sock_dir):
        db = tmp / "g.db"
        proc, client = daemons.start_ready(sock_dir, db)
        summaries = {g: _send_group(client, os.getpid(), g) for g in GROUPS}
        # a malformed bucket row never gets past decode: the step is dropped, counted
        assert client.request(h.hello("bad", os.getpid(), run_name="bad"))["ok"]
        good = group_steps(1, n_steps=2)[0]
        bad = {"v": 1, "type": "step", "run_key": "bad", **good[1]}
        bad["comm"] = [*bad["comm"][:-1], [3, 10, 5, 100]]  # ends before it starts
        client.push({"v": 1, "type": "step", "run_key": "bad", **good[0]})
        client.push(bad)
        reply = client.wait_for(lambda r: r["dropped"].get("bad_field:comm") == 1)
        summaries["dropped"] = reply["dropped"]
        assert client.request(h.bye("bad", sent=1))["ok"]
        assert daemons.stop(proc) == 0
        yield db, summaries


def _ctl(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 0
    return capsys.readouterr().out


def _group_json(capsys: pytest.CaptureFixture[str], db: Path, group: str) -> dict[str, Any]:
    return orjson.loads(_ctl(capsys, "insights", str(db), "--group", group, "--format", "json"))


def test_buckets_and_clock_offsets_are_stored_with_their_run(comm_db) -> None:
    db, _ = comm_db
    (run,) = h.query(db, "SELECT id FROM runs WHERE run_key = 'offset-1'")
    rows = [r[1:] for r in h.buckets(db, run["id"])]
    sent = group_steps(2, n_steps=STEPS, clock_shift={1: 5 * SECOND})[1]
    assert rows == [(s["i"], *row) for s in sent for row in s["comm"]]
    (clock,) = h.query(
        db,
        "SELECT clock_offset_ns, clock_uncertainty_ns, clock_rtt_ns, "
        "clock_round_trips, clock_reference_rank FROM runs WHERE id = ?",
        (run["id"],),
    )
    assert tuple(clock) == (5 * SECOND, 50_000, 100_000, 64, 0)
    (other,) = h.query(db, "SELECT clock_offset_ns FROM runs WHERE run_key = 'offset-0'")
    assert other[0] is None
    n = h.query(
        db,
        "SELECT SUM(buckets) FROM comm_steps JOIN runs ON runs.id = run_id WHERE group_id = 'skew'",
    )[0][0]
    assert n == 4 * STEPS * N_BUCKETS


def test_a_malformed_bucket_row_drops_its_step_and_nothing_of_it_is_stored(comm_db) -> None:
    db, out = comm_db
    assert out["dropped"] == {"bad_field:comm": 1}
    (run,) = h.query(db, "SELECT id FROM runs WHERE run_key = 'bad'")
    assert [r[0] for r in h.query(db, "SELECT step FROM steps WHERE run_id = ?", (run[0],))] == [0]
    buckets = h.query(db, "SELECT DISTINCT step FROM comm_steps WHERE run_id = ?", (run[0],))
    assert [r[0] for r in buckets] == [0]


def test_the_summary_gives_the_exposed_comm_and_the_buckets(comm_db) -> None:
    _, out = comm_db
    summary = out["straggler"][0]  # rank 0 waits ~32 ms a step for rank 1
    comm = summary["comm"]
    assert comm["buckets_per_step"] == N_BUCKETS
    assert comm["bytes_per_step"] == N_BUCKETS * BUCKET_BYTES
    assert comm["median_exposed_ms"] == pytest.approx(32.0, abs=1.0)
    assert 0.3 < comm["median_share_of_step"] < 0.4
    line = next(x for x in format_summary(summary).splitlines() if "Comm " in x)
    assert line.startswith("  Comm (median of steady steps): 3") and "ms/step exposed, " in line
    assert line.endswith(f"% of step; {N_BUCKETS} buckets, gradient bytes 25.0 MB/step")


def test_runs_has_a_comm_share(comm_db, capsys: pytest.CaptureFixture[str]) -> None:
    db, _ = comm_db
    rows = orjson.loads(_ctl(capsys, "runs", str(db), "--group", "straggler", "--format", "json"))
    pct = {r["rank"]: r["pct_of_iteration"] for r in rows}
    assert pct[0]["comm"] == pytest.approx(32.0 / 98.0 * 100, abs=2.0)
    assert pct[1]["comm"] < 5.0
    assert all(sum(v for v in p.values()) == pytest.approx(100.0, abs=0.3) for p in pct.values())
    bad = orjson.loads(_ctl(capsys, "runs", str(db), "--format", "json"))
    assert next(r for r in bad if r["run_name"] == "bad")["pct_of_iteration"]["comm"] is None
    text = _ctl(capsys, "runs", str(db), "--group", "straggler").splitlines()
    assert "COMM%" in text[1].split()


def test_insights_group_names_the_late_bucket(comm_db, capsys: pytest.CaptureFixture[str]) -> None:
    db, _ = comm_db
    data = _group_json(capsys, db, "skew")
    assert [i["rule"] for i in data["insights"]] == ["bucket_skew"]
    ev = data["insights"][0]["evidence"]
    assert (ev["rank"], ev["bucket"]) == (2, 1)
    assert data["missing_ranks"] == []
    comm = {r["rank"]: r["comm"] for r in data["ranks"]}
    assert comm[0]["buckets_per_step"] == N_BUCKETS
    assert comm[0]["bytes_per_step"] == N_BUCKETS * BUCKET_BYTES
    assert comm[0]["clock_offset_ns"] is None

    text = _ctl(capsys, "insights", str(db), "--group", "skew")
    lines = text.splitlines()
    assert lines[0] == "group skew: finished (4 ranks: 4 finished)"
    assert lines[1] == "  Group insights (1):"
    assert lines[2].startswith("  [MED]  Rank 2 is the last to start bucket 1 on 100% of steps")
    # what fixing it is worth: the others' median wait for the bucket, of the job's step
    assert lines[3].startswith("          Worth: up to 1.08× faster: 5.0 of 67.2 ms per iteration")
    assert lines[4].startswith("          How: the median time the others wait for the late")
    assert lines[5].startswith("          On 100% of 30 steps rank 2")
    assert lines[6].startswith("          Fix: Look at what rank 2 computes before bucket 1")
    assert lines[7].startswith("  rank 0  run ") and "comm " in lines[7]
    assert f"{N_BUCKETS} buckets, gradient bytes 25.0 MB/step" in lines[7]


def test_insights_group_names_the_straggler_not_the_network(
    comm_db, capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = comm_db
    data = _group_json(capsys, db, "straggler")
    rules = {i["rule"]: i["evidence"] for i in data["insights"]}
    assert set(rules) == {"straggler_rank"} and rules["straggler_rank"]["rank"] == 1
    text = _ctl(capsys, "insights", str(db), "--group", "straggler")
    assert "Rank 1 is a straggler" in text and "comm_dominant" not in text
    assert "Collectives take" not in text


def test_balanced_ranks_have_no_group_finding(comm_db, capsys: pytest.CaptureFixture[str]) -> None:
    db, _ = comm_db
    assert _group_json(capsys, db, "balanced")["insights"] == []
    text = _ctl(capsys, "insights", str(db), "--group", "balanced")
    assert "  Group insights (0):" in text.splitlines()


def test_ranks_on_two_hosts_are_aligned_by_their_offsets(
    comm_db, capsys: pytest.CaptureFixture[str]
) -> None:
    db, _ = comm_db
    data = _group_json(capsys, db, "offset")
    assert data["insights"] == []  # rank 1's clock is 5 s ahead, not rank 1 late
    comm = {r["rank"]: r["comm"] for r in data["ranks"]}
    assert (comm[1]["clock_offset_ns"], comm[1]["clock_uncertainty_ns"]) == (5 * SECOND, 50_000)
    assert data["missing_ranks"] == []
    text = _ctl(capsys, "insights", str(db), "--group", "offset")
    assert "clock +5000.000 ± 0.050 ms" in text


def test_a_rank_that_never_reported_is_named(comm_db, capsys: pytest.CaptureFixture[str]) -> None:
    db, _ = comm_db
    data = _group_json(capsys, db, "missing")
    message = (
        "rank 3 never reported: it did not run gpuprof.profile, or ended before its first message"
    )
    assert data["missing_ranks"] == [
        {"rank": 3, "local_rank": 3, "host": "node-a", "message": message}
    ]
    assert data["insights"] == []
    text = _ctl(capsys, "insights", str(db), "--group", "missing").splitlines()
    assert text[:2] == ["group missing: finished (3 ranks: 3 finished)", f"  {message}"]
    runs = _ctl(capsys, "runs", str(db), "--group", "missing").splitlines()
    assert runs[0] == f"group missing: finished (3 ranks: 3 finished); {message}"


async def test_steps_with_buckets_queued_back_to_back_all_land(tmp_path: Path) -> None:
    """Each step with buckets is one atomic op; consecutive ones are not
    grouped into one executemany (which ran only the first), and one that
    fails is undone whole and counted."""
    db = tmp_path / "s.db"
    schema.prepare(db)
    drops = DropCounter()
    store = Store(db, drops, queue_size=100)
    await store.open()
    events = group_steps(1, n_steps=20)[0]
    for s in events:
        assert store.submit_nowait(runsdb.step_op(7, {**s, "run_key": "k"}))
    # a step whose bucket row cannot be stored (step NULL): its step row goes too
    op = runsdb.step_op(8, {**events[0], "run_key": "k"})
    op.parts = (op.parts[0], Part(op.parts[1].sql, ((8, None, 0, 1, 0, b"\x01"),)))
    assert store.submit_nowait(op)
    store.start()
    await store.flush()
    steps = h.query(db, "SELECT run_id, COUNT(*) FROM steps GROUP BY run_id")
    buckets = h.query(db, "SELECT run_id, SUM(buckets) FROM comm_steps GROUP BY run_id")
    assert [tuple(r) for r in steps] == [(7, 20)]
    assert [tuple(r) for r in buckets] == [(7, 20 * N_BUCKETS)]
    assert list(drops.snapshot()) == ["store_error"]
    await store.close()


def test_a_group_of_one_rank_with_one_bucket_reads_in_the_singular() -> None:
    from gpuprofd.commands.insights import format_group
    from gpuprofd.commands.runs import group_line

    rank = {
        "rank": 0,
        "run_id": 1,
        "status": "finished",
        "median_step_ms": 5.0,
        "summary": {"steps": 0, "run_name": "r"},
        "comm": {"median_exposed_ms": 1.0, "buckets_per_step": 1, "bytes_per_step": 4000},
    }
    data = {"group": "g", "status": "finished", "counts": {"finished": 1}, "ranks": [rank]}
    lines = format_group(data).splitlines()
    assert lines[0] == "group g: finished (1 rank: 1 finished)"
    assert lines[2].endswith(
        "comm median 1.0 ms/step exposed, 1 bucket, gradient bytes 4.0 KB/step, clock unknown"
    ), lines[2]
    assert group_line("g", [{"status": "finished", "rank": 0}]).startswith(
        "group g: finished (1 rank: 1 finished)"
    )


def test_the_group_can_be_found_from_runs_and_from_the_summary(
    comm_db, capsys: pytest.CaptureFixture[str]
) -> None:
    db, out = comm_db
    lines = _ctl(capsys, "runs", str(db)).splitlines()
    assert lines[0].split()[:4] == ["ID", "GROUP", "RANK", "NAME"]
    cells = [x.split() for x in lines[1:]]
    assert next(c for c in cells if c[3] == "bad")[1:3] == ["-", "-"]  # no group
    assert sorted(c[2] for c in cells if c[1] == "straggler") == ["0", "1", "2", "3"]
    # rank 0's printed summary says how to see the whole group
    summary = out["straggler"][0]
    assert summary["group_id"] == "straggler"
    assert (
        f"  Group report: gpuprofctl insights {db} --group straggler"
        in format_summary(summary).splitlines()
    )
    # a --group that names no runs lists the groups there, newest first
    groups = "missing, offset, balanced, straggler, skew"
    for cmd in ("runs", "insights"):
        assert main([cmd, str(db), "--group", "stragler"]) == 2  # bad input
        err = capsys.readouterr().err
        assert f"no runs in group 'stragler'; groups here, newest first: {groups}" in err


def test_a_long_group_name_is_shortened_in_the_runs_table() -> None:
    from gpuprofd.commands.runs import format_table

    row = {
        "id": 7,
        "group": "3f2a9c1e-5b7d-4e21-9a4b-0c6d8e2f1a3b",
        "rank": 1,
        "run_name": "r",
        "status": "finished",
        "steps": 3,
        "micro_batches_per_step": 1.0,
        "median_step_ms": 1.0,
        "pct_of_iteration": dict.fromkeys(
            ("loader_wait", "forward", "backward", "comm", "optimizer", "other")
        ),
        "skipped_updates": 0,
        "eval_s": 0.0,
        "dropped_events": 0,
    }
    line = format_table([row], groups=True).splitlines()[1]
    assert line.split()[:3] == ["7", "3f2a9c1e-5b7…", "1"]
