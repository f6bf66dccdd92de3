"""End to end against a real ``python -m gpuprofd``: validation, storage, bye."""

from __future__ import annotations

import gzip
import json
import sqlite3
import threading
import time
from pathlib import Path

import orjson
import pytest

from gpuprof.kernels import aggregate_trace
from gpuprof.protocol import MAX_MESSAGE_BYTES
from gpuprofd.core.boot import boot_id
from gpuprofd.ctl import main
from gpuprofd.sampling.nvml import NO_GPU_NOTE
from gpuprofd.services.sinks import STORED_GPU_HZ
from tests.daemon import h200_replay
from tests.daemon import helpers as h


def test_bad_messages_are_counted_by_reason_and_ingest_continues(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    valid = orjson.dumps(h.step("r1", 0, 1_000))
    bad_field = h.step("r1", 0, 1_000)
    bad_field["t0"] = "soon"
    for frame in [
        b"\x00\xffgarbage",  # not_json
        valid[:-7],  # truncated: not_json
        b'{"v":1,"type":"step","pad":"' + b"x" * MAX_MESSAGE_BYTES + b'"}',  # oversized
        orjson.dumps({**h.step("r1", 0, 1_000), "v": 99}),  # bad_version
        orjson.dumps({"v": 1, "type": "teleport"}),  # unknown_type
        orjson.dumps(bad_field),  # bad_field:t0
        b"[1, 2, 3]",  # not_object
        orjson.dumps(h.hello("r1", my_pid)),  # wrong_channel
        orjson.dumps(h.step("nobody", 0, 1_000)),  # unknown_run
    ]:
        client.push(frame)
    expected = {
        "not_json": 2,
        "oversized": 1,
        "bad_version": 1,
        "unknown_type": 1,
        "bad_field:t0": 1,
        "not_object": 1,
        "wrong_channel": 1,
        "unknown_run": 1,
    }
    reply = client.wait_for(lambda r: sum(r["dropped"].values()) >= 9)
    assert reply["dropped"] == expected
    assert reply["received"] == 0

    ok = client.request(h.hello("r1", my_pid))
    assert ok is not None and ok["ok"] is True
    client.push(h.step("r1", 0, time.monotonic_ns()))
    reply = client.wait_for(lambda r: r["received"] == 1)
    assert reply["live_runs"] == [
        {"run_id": ok["run_id"], "run_name": "test-run", "pid": my_pid, "steps": 1}
    ]
    assert reply["dropped"] == expected


def test_hello_steps_bye_stores_the_run_and_returns_the_summary(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    hi = client.request(
        h.hello(
            "k-full",
            my_pid,
            run_name="digits",
            user="alice",
            project="llm",
            tags={"team": "nlp", "queue": "<a100>"},
        )
    )
    assert hi is not None and hi["ok"] is True
    assert hi["db"] == str(db) and hi["notes"] == [NO_GPU_NOTE]
    base = time.monotonic_ns()
    micros = [i % 3 + 1 for i in range(30)]
    for i, m in enumerate(micros):
        client.push(h.step("k-full", i, base, micro=m))
    client.push({"v": 1, "type": "mark", "run_key": "k-full", "name": "eval", "t_ns": base})

    reply = client.request(h.bye("k-full", sent=31, dropped=3))
    assert reply is not None and reply["ok"] is True, reply
    summary = reply["summary"]
    assert summary["run_id"] == hi["run_id"]
    assert summary["steps"] == 30
    assert summary["status"] == "finished"
    assert "3 events dropped in the training process" in summary["notes"]
    assert NO_GPU_NOTE in summary["notes"]
    assert not any("not received" in n for n in summary["notes"])
    # 8 ms of loader wait per 18 ms iteration: the stall rule must see it.
    assert any(
        i["rule"] in ("dataloader_stall", "cpu_bound_dataloader") for i in summary["insights"]
    )

    (run,) = h.query(db, "SELECT * FROM runs")
    assert (run["status"], run["received_events"], run["sent_events"], run["dropped_events"]) == (
        "finished",
        31,
        31,
        3,
    )
    assert orjson.loads(run["summary"]) == summary
    assert run["user_name"] == "alice"  # who trained, for the team server's user filter
    assert run["project"] == "llm"  # what it counts to in the rollups
    assert orjson.loads(run["tags"]) == {"team": "nlp", "queue": "<a100>"}
    # its rollup row, made as it ended (no GPU: no GPU-hours)
    (cost,) = h.query(db, "SELECT * FROM run_costs")
    assert (cost["run_id"], cost["project"], cost["user_name"]) == (run["id"], "llm", "alice")
    assert (cost["gpu_hours"], cost["at_wall_ns"]) == (0.0, run["end_wall_ns"])
    assert run["median_step_ms"] == summary["median_step_ms"]
    assert run["median_step_ms"] is not None
    n, micro_sum, phases = h.query(
        db, "SELECT COUNT(*), SUM(micro), MAX(phases) FROM steps WHERE run_id = ?", (run["id"],)
    )[0]
    assert (n, micro_sum) == (30, sum(micros))
    assert orjson.loads(phases) == h.PHASES
    stored = [
        r["rule"] for r in h.query(db, "SELECT rule FROM insights WHERE run_id = ?", (run["id"],))
    ]
    assert sorted(stored) == sorted(i["rule"] for i in summary["insights"])
    assert client.ping()["live_runs"] == []


def test_a_node_gives_runs_stored_before_the_rollups_their_rows_at_start(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    proc, client = daemons.start_ready(sock_dir, db)
    client.request(h.hello("k-old", my_pid, run_name="old", project="llm"))
    base = time.monotonic_ns()
    for i in range(5):
        client.push(h.step("k-old", i, base))
    assert client.request(h.bye("k-old", sent=5))["ok"] is True
    client.close()
    assert daemons.stop(proc) == 0
    made = h.query(db, "SELECT run_id, project, at_wall_ns FROM run_costs")
    assert len(made) == 1
    # as a database from before the rollups holds it: an ended run, no row
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM run_costs")
    daemons.start_ready(sock_dir, db)
    h.poll_db(db, "SELECT COUNT(*) FROM run_costs", (), 1)
    assert [tuple(r) for r in h.query(db, "SELECT run_id, project, at_wall_ns FROM run_costs")] == [
        tuple(made[0])
    ]


def test_bye_waits_for_events_still_in_flight(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    _, client = daemons.start_ready(sock_dir, tmp_path / "g.db")
    assert client.request(h.hello("late", my_pid))["ok"]
    result: dict = {}
    t = threading.Thread(target=lambda: result.update(r=client.request(h.bye("late", sent=20))))
    t.start()
    time.sleep(0.3)  # the bye is now waiting on the daemon; the steps come after it
    base = time.monotonic_ns()
    for i in range(20):
        client.push(h.step("late", i, base))
    t.join(timeout=15)
    summary = result["r"]["summary"]
    assert summary["steps"] == 20
    assert not any("not received" in n for n in summary["notes"])


def test_bye_answers_without_the_missing_events_then_says_them_lost(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    from gpuprofd.ingest.runservice import BYE_WAIT_S

    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    assert client.request(h.hello("short", my_pid))["ok"]
    base = time.monotonic_ns()
    for i in range(4):
        client.push(h.step("short", i, base))
    client.wait_for(lambda r: r["received"] == 4)
    t0 = time.monotonic()
    reply = client.request(h.bye("short", sent=9))
    assert time.monotonic() - t0 >= BYE_WAIT_S - 0.1
    assert reply["summary"]["steps"] == 4
    assert any("5 events were still on their way" in n for n in reply["summary"]["notes"])
    # none came after: once the run stops waiting, its stored summary says them lost
    h.poll_db(
        db, "SELECT summary LIKE '%5 events sent but not received%' FROM runs", (), 1, timeout_s=20
    )


def test_bad_control_messages_get_ok_false_and_are_counted(
    daemons, sock_dir: Path, tmp_path: Path
) -> None:
    _, client = daemons.start_ready(sock_dir, tmp_path / "g.db")
    assert client.request(b"{nope")["ok"] is False
    assert client.request(orjson.dumps(h.step("x", 0, 1)))["ok"] is False  # data on control
    unknown = client.request(h.bye("never-said-hello", sent=0))
    assert unknown["ok"] is False and "never-said-hello" in unknown["error"]
    assert client.ping()["dropped"] == {
        "control:not_json": 1,
        "control:wrong_channel": 1,
        "control:rejected": 1,
    }


def test_mock_gpu_backend_only_when_asked_and_matched_by_uuid(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db, "--sample-hz", "50", env={"GPUPROF_NVML": "mock"})
    # torch spells the UUID without "GPU-" and in lower case
    hi = client.request(h.hello("gpu", my_pid, cuda_uuid="00000000-0000-0000-0000-00000000M0C0"))
    assert hi["notes"] == []
    assert client.request(h.hello("cpu", my_pid, run_name="cpu"))["ok"]
    h.poll_db(db, "SELECT COUNT(*) >= 3 FROM gpu_samples", (), 1)
    rows = {
        r["run_key"]: (r["gpu_model"], r["gpu_count"])
        for r in h.query(db, "SELECT run_key, gpu_model, gpu_count FROM runs")
    }
    assert rows == {"gpu": ("Mock GPU", 1), "cpu": (None, 0)}
    (sample,) = h.query(db, "SELECT * FROM gpu_samples LIMIT 1")
    assert sample["uuid"].startswith("GPU-") and sample["mem_total_bytes"] == 80 * 2**30


def test_skipped_updates_eval_time_and_optimizers_are_stored_and_summarized(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    assert client.request(h.hello("k-amp", my_pid, run_name="amp"))["ok"] is True
    base = time.monotonic_ns()
    for i in range(6):
        msg = h.step("k-amp", i, base)
        msg["optimizers"] = [
            {"name": "Adam#0", "updates": int(i != 2), "skipped": int(i == 2), "ns": 2_000_000}
        ]
        if i == 2:
            msg["skipped"] = True
        if i == 4:
            msg["eval"] = 1_500_000_000  # a validation loop before step 4
        client.push(msg)
    bye = h.bye("k-amp", sent=6)
    bye["eval_ns"] = 500_000_000  # and one after the last step
    reply = client.request(bye)
    assert reply is not None and reply["ok"] is True, reply
    summary = reply["summary"]
    assert (summary["skipped_updates"], summary["eval_s"]) == (1, 2.0)
    rows = h.query(db, "SELECT skipped, eval_ns, optimizers FROM steps ORDER BY t0_ns")
    assert [r["skipped"] for r in rows] == [0, 0, 1, 0, 0, 0]
    assert [r["eval_ns"] for r in rows] == [0, 0, 0, 0, 1_500_000_000, 0]
    assert orjson.loads(rows[2]["optimizers"]) == [
        {"name": "Adam#0", "updates": 0, "skipped": 1, "ns": 2_000_000}
    ]
    (run,) = h.query(db, "SELECT trailing_eval_ns FROM runs")
    assert run["trailing_eval_ns"] == 500_000_000


def test_gpu_samples_are_stored_at_10_hz_whatever_the_sampling_rate(
    daemons, sock_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(
        sock_dir, db, "--sample-hz", "100", env={"GPUPROF_NVML": "mock"}
    )
    h.poll_db(db, "SELECT COUNT(*) >= 12 FROM gpu_samples", (), 1)
    time.sleep(1.0)
    stamps = [r[0] for r in h.query(db, "SELECT mono_ns FROM gpu_samples ORDER BY mono_ns")]
    gaps_ms = [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:], strict=False)]
    # sampled at 100 Hz (10 ms apart), stored one in ten: no two rows closer than 10 Hz
    assert min(gaps_ms) >= 1000 / STORED_GPU_HZ - 1
    span_s = (stamps[-1] - stamps[0]) / 1e9
    assert len(stamps) <= span_s * STORED_GPU_HZ + 2


def test_raw_gpu_rows_keep_a_window_and_per_second_rollups_keep_everything(
    daemons, sock_dir: Path, tmp_path: Path
) -> None:
    db = tmp_path / "g.db"
    trace = h200_replay.trace_path()
    proc, _ = daemons.start_ready(
        sock_dir,
        db,
        "--sample-hz",
        "100",
        "--raw-window",
        "2",
        env={"GPUPROF_NVML": f"replay:{trace}"},
    )
    h.poll_db(db, "SELECT COUNT(*) >= 5 FROM gpu_rollups WHERE n > 0", (), 1, timeout_s=30)
    now_ns = time.monotonic_ns()
    (oldest_raw,) = h.query(db, "SELECT MIN(mono_ns) FROM gpu_samples")[0]
    # pruned every 2 s down to the last 2 s: nothing much older than 4 s
    assert (now_ns - oldest_raw) / 1e9 < 6
    assert daemons.stop(proc) == 0
    rows = h.query(db, "SELECT * FROM gpu_rollups WHERE n > 0 ORDER BY sec_ns")
    secs = [r["sec_ns"] for r in rows]
    assert len(set(secs)) == len(secs) and all(s % 10**9 == 0 for s in secs)
    full = rows[1:-1]  # the first and the last second were sampled in part
    assert all(50 <= r["n"] <= 101 for r in full), [r["n"] for r in full]
    assert {r["uuid"] for r in rows} == {"69cfecb8-dd0f-d46a-a967-785474cc5ca4"}
    assert {r["sm_limit_mhz"] for r in rows} == {1980.0}  # probe.json's max SM clock
    assert {r["boot_id"] for r in rows} == {boot_id()} != {None}  # this boot of the node
    assert all(r["util_min"] <= r["util_mean"] <= r["util_max"] for r in rows)
    # the slow loop (1 Hz) joined the seconds it fell in
    assert sum(r["slow_n"] for r in rows) >= len(full) - 1
    # rollups span more than the raw window kept
    (raw_left,) = h.query(db, "SELECT COUNT(*) FROM gpu_samples")[0]
    assert raw_left < len(rows) * STORED_GPU_HZ


def _kernels(
    run_key: str, t0: int, t1: int, rows: list[list], steps: list[int], source: str = "snapshot"
) -> dict:
    return {
        "v": 1,
        "type": "kernels",
        "run_key": run_key,
        "t0": t0,
        "t1": t1,
        "source": source,
        "steps": steps,
        "rows": rows,
        "rows_dropped": 3,
    }


def test_kernels_windows_and_traced_steps_are_stored(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    """Each ``kernels`` event is one kernel_windows row plus its kernel_stats
    rows (each on its own window, even with two windows in one writer batch);
    a bad window is dropped whole with a countable reason; ``traced`` lands in
    steps.traced; the daemon's insights path reads the windows back."""
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    hi = client.request(h.hello("k-kern", my_pid))
    assert hi is not None and hi["ok"] is True
    base = time.monotonic_ns()
    for i in range(4):
        msg = h.step("k-kern", i, base)
        if i == 1:
            msg["traced"] = True
        client.push(msg)
    gemm = ["ampere_sgemm_128x64_tn", "kernel", "compute", 10, 4_000_000, 4_000_000, None]
    nccl = [
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
        "kernel",
        "comm",
        2,
        1_500_000,
        1_500_000,
        None,
    ]
    mm = ["aten::mm", "op", "compute", 10, 4_200_000, 0, 3.2e12]
    s1 = base + h.STEP_NS + h.WAIT_NS
    client.push(_kernels("k-kern", s1, s1 + h.STEP_NS, [gemm, nccl, mm], [1]))
    client.push(_kernels("k-kern", s1, s1 + 2 * h.STEP_NS, [gemm], [1, 2], "continuous"))
    bad = _kernels("k-kern", s1, s1 + h.STEP_NS, [[*gemm[:2], "nccl", *gemm[3:]]], [1])
    client.push(bad)
    reply = client.wait_for(lambda r: r["received"] == 6 and r["dropped"])
    assert reply["dropped"] == {"bad_field:rows": 1}

    reply = client.request(h.bye("k-kern", sent=7))
    assert reply is not None and reply["ok"] is True, reply
    run_id = hi["run_id"]
    windows = h.query(
        db,
        "SELECT id, t0_ns, t1_ns, source, steps, rows_dropped FROM kernel_windows "
        "WHERE run_id = ? ORDER BY id",
        (run_id,),
    )
    assert [(w["source"], w["steps"], w["rows_dropped"]) for w in windows] == [
        ("snapshot", "[1]", 3),
        ("continuous", "[1,2]", 3),
    ]
    assert windows[0]["t1_ns"] - windows[0]["t0_ns"] == h.STEP_NS
    stats = h.query(
        db,
        "SELECT window_id, name, kind, cls, count, total_ns, self_ns, flops "
        "FROM kernel_stats WHERE run_id = ? ORDER BY window_id, total_ns DESC",
        (run_id,),
    )
    first, second = windows[0]["id"], windows[1]["id"]
    assert [tuple(r) for r in stats] == [
        (first, *mm),
        (first, *gemm),
        (first, *nccl),
        (second, *gemm),
    ]
    traced = h.query(db, "SELECT step, traced FROM steps WHERE run_id = ? ORDER BY step", (run_id,))
    assert [tuple(r) for r in traced] == [(0, 0), (1, 1), (2, 0), (3, 0)]


def test_daemon_rules_read_the_stored_kernel_windows(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """The H200 hand-written-attention trace's kernels, sent as one snapshot
    window over the socket, reach the rules at run end: sdpa_suboptimal fires
    in the bye summary, and gpuprofctl's rebuilt context agrees."""
    trace_path = Path(__file__).resolve().parents[2] / "fixtures/h200/trace_math.json.gz"
    if not trace_path.exists():
        pytest.skip(f"no fixture at {trace_path}")
    with gzip.open(trace_path) as f:
        (window,) = aggregate_trace(json.load(f))
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    hi = client.request(h.hello("k-sdpa", my_pid, run_name="gpt-math"))
    assert hi is not None and hi["ok"] is True
    base = time.monotonic_ns()
    for i in range(20):
        msg = h.step("k-sdpa", i, base)
        msg["traced"] = i == 3
        client.push(msg)
    s3 = base + 3 * (h.STEP_NS + h.WAIT_NS)
    client.push(_kernels("k-sdpa", s3, s3 + h.STEP_NS, [r.to_wire() for r in window.rows], [3]))
    client.wait_for(lambda r: r["received"] == 21)
    reply = client.request(h.bye("k-sdpa", sent=21))
    assert reply is not None and reply["ok"] is True, reply
    fired = {i["rule"] for i in reply["summary"]["insights"]}
    assert "sdpa_suboptimal" in fired, fired
    capsys.readouterr()
    assert main(["insights", str(db), "--format", "json"]) == 0
    summary = orjson.loads(capsys.readouterr().out)
    assert "sdpa_suboptimal" in {i["rule"] for i in summary["insights"]}
    top = next(r for r in window.rows if r.kind == "kernel")
    assert summary["top_kernels"][0]["name"] == top.name


def test_a_run_shorter_than_a_second_gets_its_gpu_samples_in_the_summary(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db, env={"GPUPROF_NVML": "mock"})
    time.sleep(1.2)
    while time.monotonic_ns() % 10**9 > 50_000_000:  # start just after a second boundary
        time.sleep(0.002)
    client.request(h.hello("short", my_pid, cuda_uuid="GPU-00000000-0000-0000-0000-00000000m0c0"))
    base, n = time.monotonic_ns(), 0
    while time.monotonic_ns() - base < 600_000_000:  # 0.6 s of steps inside one second
        t0 = time.monotonic_ns()
        client.push({**h.step("short", n, 0), "t0": t0, "t1": t0 + 5_000_000})
        n += 1
        time.sleep(0.02)
    reply = client.request(h.bye("short", sent=n))
    assert reply is not None and reply["ok"], reply
    (run,) = h.query(db, "SELECT boot_id FROM runs")
    assert run["boot_id"] == boot_id()
    # the second still open in the daemon's rollups was stored before the summary
    assert reply["summary"]["memory"].get("nvml_peak_used_bytes", 0) > 0, reply["summary"]


def test_a_failed_start_exits_instead_of_hanging(daemons, tmp_path: Path) -> None:
    long_dir = tmp_path / ("x" * 110)  # longer than a Unix socket path may be
    proc = daemons.start(long_dir, tmp_path / "g.db")
    assert proc.wait(timeout=30) == 2
    assert "Unix sockets allow" in daemons.log(proc)


def test_a_batch_keeps_its_good_events_and_counts_each_bad_one(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    ok = client.request(h.hello("rb", my_pid))
    assert ok is not None and ok["ok"] is True
    base = time.monotonic_ns()
    events = [
        {k: v for k, v in h.step("rb", i, base).items() if k not in ("v", "run_key")}
        for i in range(5)
    ]
    events[1]["t0"] = "soon"  # bad_field:t0
    events[3] = {**events[3], "run_key": "another"}  # not the batch's run
    client.push({"v": 1, "type": "batch", "run_key": "rb", "events": events})
    client.push({"v": 1, "type": "batch", "run_key": "rb", "events": []})  # bad envelope
    reply = client.wait_for(lambda r: sum(r["dropped"].values()) >= 3 and r["received"] >= 3)
    assert reply["received"] == 3
    assert reply["dropped"] == {"bad_field:t0": 1, "bad_field:run_key": 1, "bad_field:events": 1}
    h.poll_db(db, "SELECT count(*) FROM steps WHERE run_id = ?", (ok["run_id"],), 3)
    assert [r[0] for r in h.query(db, "SELECT step FROM steps ORDER BY step")] == [0, 2, 4]


def test_a_manual_burst_of_20000_steps_is_all_stored(
    daemons, sock_dir: Path, tmp_path: Path
) -> None:
    """The shim sends bursts of steps as batches; gpuprofd yields to its
    store writer between messages, so none is dropped for back-pressure."""
    import gpuprof

    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    n = 20_000
    with gpuprof.profile(
        "burst",
        auto=False,
        socket_dir=sock_dir,
        db=db,
        autostart=False,
        print_summary=False,
        stacks=False,  # steps only: the count below is exact
    ) as prof:
        for i in range(n):  # as fast as the loop goes: no work inside
            with prof.step(i):
                pass
    summary = prof.summary
    assert summary is not None and summary["steps"] == n, summary
    assert prof.sender is not None and (prof.sender.sent, prof.sender.dropped) == (n, 0)
    reply = client.ping()
    assert reply is not None and "store_backpressure" not in reply["dropped"], reply["dropped"]
    h.poll_db(db, "SELECT count(*) FROM steps", (), n)


def test_stacks_events_are_stored_and_a_bad_one_is_a_counted_drop(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    """``stacks`` events over the real data socket: each row's samples add to
    its frame's row; a malformed one is dropped whole and counted."""
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    hi = client.request(h.hello("k-stk", my_pid))
    assert hi is not None and hi["ok"] is True
    save = ["/home/u/train.py", 212, "save_checkpoint", "torch.save"]

    def stacks(rows: list) -> dict:
        return {"v": 1, "type": "stacks", "run_key": "k-stk", "source": "main", "rows": rows}

    client.push(stacks([[*save, 20, 3]]))
    client.push(stacks([[*save, 20, 4], ["/home/u/train.py", 230, "log", "", 21, 1]]))
    client.push(stacks([[*save, 20, -1]]))  # a negative count
    reply = client.wait_for(lambda r: r["received"] == 2 and r["dropped"])
    assert reply["dropped"] == {"bad_field:rows": 1}
    reply = client.request(h.bye("k-stk", sent=3))
    assert reply is not None and reply["ok"] is True, reply
    rows = h.query(db, "SELECT step, line, callee, samples FROM stack_samples ORDER BY line")
    assert [tuple(r) for r in rows] == [(20, 212, "torch.save", 7), (21, 230, "", 1)]
