"""DataLoader worker CPU: the sampler's :class:`WorkerCpu` on real processes
(real psutil), and a real gpuprofd storing what shims report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuprofd.sampling import host_sampler
from gpuprofd.sampling.host_sampler import WorkerCpu
from tests.daemon import helpers as h

SPIN = "while True: pass"
ME = os.getpid()  # the "training process" of every run here: workers are its children
SLEEP = "import time; time.sleep(120)"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Child processes started by the test; killed at teardown."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def start(procs: list[subprocess.Popen[bytes]], code: str) -> int:
    procs.append(subprocess.Popen([sys.executable, "-c", code]))
    return procs[-1].pid


def workers_msg(pids: list[int], seq: int = 0, t_ns: int = 123) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "workers",
        "run_key": "k",
        "loader_seq": seq,
        "workers": [{"worker_id": i, "pid": p} for i, p in enumerate(pids)],
        "t_ns": t_ns,
    }


def by_pid(readings: list[Any]) -> dict[int, Any]:
    return {r.pid: r for r in readings}


def test_a_busy_worker_accumulates_cpu_seconds_and_idle_ones_do_not(procs) -> None:
    pids = [start(procs, SPIN), start(procs, SLEEP), start(procs, SLEEP)]
    import psutil

    deadline = time.monotonic() + 30  # the sleepers past their start-up, however slow
    while time.monotonic() < deadline and not all(
        psutil.Process(p).status() == psutil.STATUS_SLEEPING for p in pids[1:]
    ):
        time.sleep(0.05)
    wc = WorkerCpu()
    wc.add(7, workers_msg(pids, seq=3, t_ns=555))
    first = by_pid(wc.sample({7: ME}, now_ns=1_000))
    assert set(first) == set(pids)  # every worker's first reading is reported
    assert {(r.run_id, r.loader_seq, r.first_mono_ns, r.last_mono_ns) for r in first.values()} == {
        (7, 3, 555, 1_000)
    }
    assert [first[p].worker_id for p in pids] == [0, 1, 2]
    time.sleep(1.0)
    second = by_pid(wc.sample({7: ME}, now_ns=2_000))
    busy = second[pids[0]]
    # ~1 CPU-s of spinning on a free box, a sliver of it on a busy one: it grew,
    # and the spinner was preempted, not asleep (its switches are involuntary)
    assert busy.cpu_s > first[pids[0]].cpu_s
    assert busy.ctx_involuntary is not None and busy.ctx_voluntary is not None
    assert busy.ctx_involuntary >= busy.ctx_voluntary
    assert busy.last_mono_ns == 2_000 and busy.first_mono_ns == 555
    assert set(second) == {pids[0]}  # idle workers' CPU seconds did not change: no rewrite
    assert wc.followed == 3


def test_exited_workers_are_forgotten_quietly(procs, caplog: pytest.LogCaptureFixture) -> None:
    pids = [start(procs, SLEEP), start(procs, SLEEP)]
    wc = WorkerCpu()
    wc.add(1, workers_msg(pids))
    assert len(wc.sample({1: ME}, 1)) == 2
    procs[0].kill()
    procs[0].wait(10)  # reaped: its pid names nothing now
    wc.sample({1: ME}, 2)
    assert wc.followed == 1
    procs[1].kill()  # not reaped yet: a zombie, then gone
    time.sleep(0.1)
    wc.sample({1: ME}, 3)
    procs[1].wait(10)
    wc.sample({1: ME}, 4)
    assert wc.followed == 0
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


def test_a_pid_reported_before_its_process_existed_is_not_that_worker(procs) -> None:
    """A worker that exited before the sampler looked, its pid already reused:
    the process now at that pid was created after the report arrived."""
    pid = start(procs, SPIN)
    time.sleep(0.1)
    arrived_long_ago = WorkerCpu(wall_clock=lambda: time.time() - 60)
    arrived_long_ago.add(1, workers_msg([pid]))
    assert arrived_long_ago.sample({1: ME}, 1) == [] and arrived_long_ago.followed == 0
    arrived_now = WorkerCpu()
    arrived_now.add(1, workers_msg([pid]))
    assert [r.pid for r in arrived_now.sample({1: ME}, 1)] == [pid]


def test_unknown_pids_and_ended_runs_are_dropped(procs) -> None:
    pid = start(procs, SLEEP)
    wc = WorkerCpu()
    wc.add(1, workers_msg([pid]))
    wc.add(2, workers_msg([2**22 + 7]))  # above Linux's largest pid_max: no such process
    assert [r.run_id for r in wc.sample({1: ME, 2: ME}, 1)] == [1]
    assert wc.followed == 1
    assert wc.sample({2: ME}, 2) == []  # run 1 ended: its workers are not read again
    assert wc.followed == 0


def test_reports_beyond_the_limits_are_counted_not_followed(procs, monkeypatch) -> None:
    monkeypatch.setattr(host_sampler, "MAX_PENDING_POOLS", 2)
    monkeypatch.setattr(host_sampler, "MAX_TRACKED_WORKERS", 2)
    pids = [start(procs, SLEEP) for _ in range(3)]
    wc = WorkerCpu()
    wc.add(1, workers_msg(pids[:1], seq=0))
    wc.add(1, workers_msg(pids[1:], seq=1))
    wc.add(1, workers_msg(pids, seq=2))  # a third pool waiting: over MAX_PENDING_POOLS
    assert wc.dropped == 3
    assert len(wc.sample({1: ME}, 1)) == 2  # pids[2] is over MAX_TRACKED_WORKERS
    assert wc.dropped == 4 and wc.followed == 2


def test_a_same_pool_reported_twice_is_one_row_per_worker(procs) -> None:
    pid = start(procs, SLEEP)
    wc = WorkerCpu()
    wc.add(1, workers_msg([pid]))
    wc.add(1, workers_msg([pid]))
    assert len(wc.sample({1: ME}, 1)) == 1 and wc.followed == 1


def test_only_descendants_of_the_runs_process_are_its_workers(procs) -> None:
    """A pid that is not a child (or deeper) of the run's training process is
    not its worker, whoever reported it: the training process itself, init,
    the parent of the training process, a pid reused by an unrelated process."""
    child = start(procs, SLEEP)
    grandchild_of = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            "print(p.pid, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
    )
    procs.append(grandchild_of)
    assert grandchild_of.stdout is not None
    grandchild = int(grandchild_of.stdout.readline())
    grandchild_of.stdout.close()
    try:
        wc = WorkerCpu()
        wc.add(1, workers_msg([ME, 1, os.getppid(), child, grandchild]))
        assert {r.pid for r in wc.sample({1: ME}, 1)} == {child, grandchild}
        assert wc.followed == 2
        other = WorkerCpu()  # the same pids for a run whose process is the child
        other.add(2, workers_msg([child, grandchild]))
        assert other.sample({2: child}, 1) == [] and other.followed == 0
    finally:
        os.kill(grandchild, signal.SIGKILL)  # not ours to reap: its parent is


def test_a_flood_of_pools_is_bounded_by_workers_not_pools(procs) -> None:
    """1024 pools of 1024 made-up pids (the protocol's limits) once took one
    host tick 25 s of psutil look-ups, stalling every run's host sampling:
    the pids waiting for a look are capped, the rest counted as dropped."""
    pid = start(procs, SLEEP)
    wc = WorkerCpu()
    wc.add(1, workers_msg([pid]))
    made_up = [2**22 + 10 + i for i in range(1024)]
    for seq in range(1, 1025):
        wc.add(1, workers_msg(made_up, seq=seq))
    dropped = wc.dropped
    assert dropped >= 1024 * 1024 - host_sampler.MAX_PENDING_WORKERS
    t0 = time.monotonic()
    assert [r.pid for r in wc.sample({1: ME}, 1)] == [pid]
    assert time.monotonic() - t0 < 5.0
    wc.add(1, workers_msg(made_up, seq=2000))  # room again once looked at
    assert wc.dropped == dropped


# --- a real gpuprofd ---------------------------------------------------------------


def test_the_daemon_stores_reported_workers_cpu_and_skips_foreign_namespaces(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int, procs
) -> None:
    db = tmp_path / "g.db"
    _, client = daemons.start_ready(sock_dir, db)
    busy, idle, foreign = start(procs, SPIN), start(procs, SLEEP), start(procs, SPIN)
    local = client.request(h.hello("local", my_pid))
    other = client.request(h.hello("other", my_pid, pid_ns="pid:[4026532999]"))
    assert local is not None and other is not None and local["ok"] and other["ok"]
    t = time.monotonic_ns()
    client.push(workers_msg([busy, idle], seq=0, t_ns=t) | {"run_key": "local"})
    client.push(workers_msg([foreign], seq=0, t_ns=t) | {"run_key": "other"})
    sql = "SELECT cpu_s FROM worker_cpu WHERE run_id = ? AND pid = ? AND cpu_s > 0.5"
    deadline = time.monotonic() + 15
    while not h.query(db, sql, (local["run_id"], busy)) and time.monotonic() < deadline:
        time.sleep(0.1)
    rows = h.query(db, "SELECT * FROM worker_cpu ORDER BY worker_id")
    assert [(r["run_id"], r["loader_seq"], r["worker_id"], r["pid"]) for r in rows] == [
        (local["run_id"], 0, 0, busy),
        (local["run_id"], 0, 1, idle),
    ]
    assert rows[0]["cpu_s"] > 0.5 and rows[1]["cpu_s"] < 0.3
    assert all(r["first_mono_ns"] == t < r["last_mono_ns"] for r in rows)
    reply = client.ping()
    assert reply is not None and reply["dropped"] == {}
    assert reply["received"] == 2
