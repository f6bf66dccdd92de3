"""Trace windows (gpuprof_shim.trace) on real CPU torch training loops:
which steps are profiled, what the ``kernels`` events carry, the user's own
profiler, failures, bounded memory and disk, the Nsight bridge."""

from __future__ import annotations

import gc
import logging
import os
import sqlite3
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
import torch.autograd.profiler as legacy_profiler
from torch.profiler import ProfilerActivity

import gpuprof
from gpuprof.kernels import MAX_ROWS, KernelAgg
from gpuprof_shim.patches import current_owner
from gpuprof_shim.trace import windows as trace_mod
from gpuprof_shim.trace.fold import fold_kineto
from gpuprof_shim.trace.options import TraceOptions

from .training import MLP, train

ORIGINAL_PREPARE = vars(legacy_profiler.profile)["_prepare_trace"]
ORIGINAL_EXIT = vars(legacy_profiler.profile)["__exit__"]


def profile(socket_dir: Path, name: str = "trace", **kw):
    return gpuprof.profile(
        name, socket_dir=socket_dir, autostart=False, print_summary=False, count_flops=False, **kw
    )


def kernels(fake_daemon) -> list[dict]:
    return [m for m in fake_daemon.data if m["type"] == "kernels"]


def traced(fake_daemon) -> list[int]:
    return [s["i"] for s in fake_daemon.steps if s.get("traced")]


def assert_nothing_left() -> None:
    """No profiler running, the guard and torch patches gone."""
    assert not torch._C._autograd._profiler_enabled()
    assert vars(legacy_profiler.profile)["_prepare_trace"] is ORIGINAL_PREPARE
    assert vars(legacy_profiler.profile)["__exit__"] is ORIGINAL_EXIT
    assert current_owner() is None


# --- options ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"trace_every_n_steps": 0}, "trace_every_n_steps must be between 1"),
        ({"trace_every_n_steps": 2.5}, "trace_every_n_steps must be an int"),
        ({"trace_every_n_steps": True}, "trace_every_n_steps must be an int"),
        ({"trace_range": 5}, "trace_range must be a pair"),
        ({"trace_range": "ab"}, "trace_range must be a pair"),
        ({"trace_range": (1, 2, 3)}, "trace_range must be a pair"),
        ({"trace_range": (5, 2)}, "a <= b"),
        ({"trace_range": (-1, 2)}, "trace_range start must be between 0"),
        ({"continuous_traces_hz": 0}, "continuous_traces_hz must be a number in (0, 10]"),
        ({"continuous_traces_hz": 11}, "continuous_traces_hz must be"),
        ({"continuous_traces_hz": float("nan")}, "continuous_traces_hz must be"),
        ({"continuous_traces_hz": "1"}, "continuous_traces_hz must be"),
        ({"trace_dir": "/tmp/x"}, "trace_dir needs a trace mode"),
        ({"trace_dir": 3, "trace_every_n_steps": 5}, "trace_dir must be a directory path"),
        (
            {"trace_every_n_steps": 5, "trace_dir_max_mb": 0},
            "trace_dir_max_mb must be a positive number",
        ),
    ],
)
def test_bad_trace_options_raise_clear_value_errors(kw, message):
    with pytest.raises(ValueError, match="gpuprof: ") as info:
        gpuprof.profile("x", **kw)
    assert message in str(info.value)


def test_trace_dir_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(ValueError, match="exists and is not a directory"):
        TraceOptions.parse(trace_every_n_steps=3, trace_dir=f)


def test_options_parse_and_default_off():
    assert not TraceOptions.parse().enabled
    opts = TraceOptions.parse(10, [2, 4], 0.5, None)
    assert (opts.every_n, opts.range, opts.hz) == (10, (2, 4), 0.5)


# --- which steps -------------------------------------------------------------------


def test_snapshots_at_warmup_steps_and_every_n(socket_dir, fake_daemon):
    with profile(socket_dir, trace_every_n_steps=4):
        train(steps=13)
    want = [0, 1, 4, 5, 8, 12]
    assert traced(fake_daemon) == want
    wins = kernels(fake_daemon)
    assert [w["steps"] for w in wins] == [[i] for i in want]
    assert {w["source"] for w in wins} == {"snapshot"}
    steps = {s["i"]: s for s in fake_daemon.steps}
    for w in wins:  # each window spans its step and not its neighbours
        (i,) = w["steps"]
        assert w["t0"] <= steps[i]["t0"] and steps[i]["t1"] <= w["t1"]
        if i + 1 in steps and i + 1 not in want:
            assert w["t1"] < steps[i + 1]["t0"]
        if i - 1 in steps and i - 1 not in want:
            assert steps[i - 1]["t1"] < w["t0"]
    assert len(fake_daemon.steps) == 13
    assert_nothing_left()


def test_cpu_windows_carry_flop_ops_with_zero_device_time(socket_dir, fake_daemon):
    with profile(socket_dir, trace_range=(2, 2)):
        train(steps=4)
    (win,) = kernels(fake_daemon)
    rows = [KernelAgg.from_wire(r) for r in win["rows"]]
    assert rows and all(r.kind == "op" for r in rows)  # no device: no kernel rows
    assert all(r.total_ns == 0 and r.self_ns == 0 for r in rows)  # KernelAgg times: device
    by_name = {r.name: r for r in rows}
    # MLP: 3 Linear layers, batch 4: forward addmm 2*4*(8*16 + 16*16 + 16*3) FLOP
    addmm = by_name["aten::addmm"]
    assert addmm.count == 3
    assert addmm.flops == pytest.approx(2 * 4 * (8 * 16 + 16 * 16 + 16 * 3))
    assert by_name["aten::mm"].flops > 0  # backward's weight/input gradients
    assert "rows_dropped" not in win


def test_trace_range_covers_exactly_a_to_b(socket_dir, fake_daemon):
    with profile(socket_dir, trace_range=(3, 6)):
        train(steps=10)
    assert traced(fake_daemon) == [3, 4, 5, 6]
    assert [w["steps"] for w in kernels(fake_daemon)] == [[3], [4], [5], [6]]


def test_window_open_at_exit_is_dropped_not_sent(socket_dir, fake_daemon):
    with profile(socket_dir, trace_every_n_steps=3):
        train(steps=6)  # boundary 6 opens a window for a step that never comes
    assert [w["steps"] for w in kernels(fake_daemon)] == [[0], [1], [3], [5]]
    assert traced(fake_daemon) == [0, 1, 3, 5]
    assert_nothing_left()


def test_manual_mode_windows_follow_prof_step(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir, auto=False, trace_range=(2, 3)) as prof:
        for i in range(6):
            with prof.step(i):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
                opt.zero_grad()
    assert traced(fake_daemon) == [2, 3]
    wins = kernels(fake_daemon)
    assert [w["steps"] for w in wins] == [[2], [3]]
    assert any(r[0] == "aten::addmm" for r in wins[0]["rows"])
    assert_nothing_left()


def test_continuous_windows_are_sampled_steps_for_the_whole_run(socket_dir, fake_daemon):
    def slow(_i):
        time.sleep(0.012)  # ~12 ms steps: a 10 Hz window every ~8 steps

    with profile(socket_dir, continuous_traces_hz=10):
        train(steps=60, on_step=slow)
    wins = kernels(fake_daemon)
    steps = [w["steps"][0] for w in wins]
    assert {w["source"] for w in wins} == {"continuous"}
    assert steps[0] >= trace_mod.CONTINUOUS_FIRST_STEP
    assert all(
        b - a >= trace_mod.CONTINUOUS_MIN_STEPS_APART
        for a, b in zip(steps, steps[1:], strict=False)
    )
    assert len(steps) >= 3  # 10..59 at most every 10 steps
    assert traced(fake_daemon) == steps
    for a, b in zip(wins, wins[1:], strict=False):  # >= 1/hz apart
        assert b["t0"] - a["t0"] >= 100_000_000


def test_snapshot_and_continuous_together(socket_dir, fake_daemon):
    with profile(socket_dir, trace_every_n_steps=20, continuous_traces_hz=10):
        train(steps=41, on_step=lambda _i: time.sleep(0.012))
    wins = kernels(fake_daemon)
    snap = [w["steps"][0] for w in wins if w["source"] == "snapshot"]
    assert snap == [0, 1, 5, 20, 40]
    assert any(w["source"] == "continuous" for w in wins)
    assert traced(fake_daemon) == sorted(w["steps"][0] for w in wins)


# --- the user's profiler, failures, exit -----------------------------------------


def test_users_profiler_around_the_run_one_notice_no_windows(socket_dir, fake_daemon, caplog):
    caplog.set_level(logging.WARNING, logger="gpuprof.shim")
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as user:
        with profile(socket_dir, trace_every_n_steps=2) as prof:
            train(steps=7)
    assert kernels(fake_daemon) == []
    assert traced(fake_daemon) == []
    notices = [r for r in caplog.records if "your own torch.profiler is active" in r.message]
    assert len(notices) == 1
    assert any("your own torch.profiler" in n for n in prof._tracer.notes)
    assert "aten::addmm" in {e.key for e in user.key_averages()}  # theirs recorded everything
    assert len(fake_daemon.steps) == 7
    assert_nothing_left()


USER_SCHEDULE_SCRIPT = """
import sys
import torch
from torch.profiler import ProfilerActivity, schedule
import gpuprof
sys.path.insert(0, sys.argv[2])
from training import MLP

model = MLP()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
traces = []
with gpuprof.profile("sched", socket_dir=sys.argv[1], autostart=False, print_summary=False,
                     count_flops=False, trace_every_n_steps=1) as prof:
    with torch.profiler.profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=1, warmup=1, active=2, repeat=2),
        on_trace_ready=lambda p: traces.append({e.key for e in p.key_averages()}),
    ) as user:
        for _ in range(12):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            user.step()
print("TRACES", len(traces), all("aten::addmm" in t for t in traces))
print("NOTES", prof._tracer.notes)
print("WINDOWS", prof._tracer.windows)
"""


def test_users_scheduled_profiler_inside_the_run_does_not_crash(socket_dir, fake_daemon):
    # gpuprof snapshots every step while the user's scheduled profiler goes
    # through wait/warmup/active: two Kineto sessions at once segfault torch
    # 2.13, so this runs in a child process (a crash fails the test, not pytest)
    proc = subprocess.run(
        [sys.executable, "-c", USER_SCHEDULE_SCRIPT, str(socket_dir), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "TRACES 2 True" in proc.stdout
    assert "your own torch.profiler is active" in proc.stdout
    # windows ran before the user's profiler prepared and after it finished
    windows = int(proc.stdout.split("WINDOWS ")[1].split()[0])
    assert windows >= 1


REPEATED_WINDOWS_SCRIPT = """
import sys
import gpuprof
sys.path.insert(0, sys.argv[2])
from training import train

for r in range(8):
    with gpuprof.profile("again", socket_dir=sys.argv[1], autostart=False, print_summary=False,
                         count_flops=False, trace_every_n_steps=2):
        train(steps=13)
print("DONE")
"""


def test_windows_ended_inside_the_optimizers_range_do_not_corrupt_memory(socket_dir):
    # A window ends in the optimizer's post hook, inside its Optimizer.step#
    # record_function range entered while the window recorded. Stopping Kineto
    # with that range open made its exit write into freed memory: without
    # _TorchGuard.end_open_ranges this script crashed (SIGSEGV/SIGABRT) on
    # every one of 4 runs on the CI VM.
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            REPEATED_WINDOWS_SCRIPT,
            str(socket_dir),
            str(Path(__file__).parent),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DONE" in proc.stdout


QUIET_SCRIPT = """
import os
import sys
import gpuprof
sys.path.insert(0, sys.argv[2])
from training import train

with gpuprof.profile("quiet", socket_dir=sys.argv[1], autostart=False, print_summary=False,
                     count_flops=False, trace_every_n_steps=8) as prof:
    train(steps=32)
print("WINDOWS", prof._tracer.windows)
print("LEVEL", os.environ.get("KINETO_LOG_LEVEL"))
"""


def _run_quiet_script(socket_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    return subprocess.run(
        [sys.executable, "-c", QUIET_SCRIPT, str(socket_dir), str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **env},
    )


def test_trace_windows_keep_kinetos_start_stop_lines_off_stderr(socket_dir, fake_daemon):
    # torch prints "USDT:... SyncActivityProfilerHandler.cpp:52] profiler_start"
    # and a profiler_stop line for every window unless KINETO_LOG_LEVEL is set
    proc = _run_quiet_script(socket_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "WINDOWS 6" in proc.stdout  # steps 0, 1, 5, 8, 16, 24
    assert "profiler_start" not in proc.stderr
    assert "profiler_stop" not in proc.stderr
    assert "USDT" not in proc.stderr
    # set for the first start only: the user's environment and children never see it
    assert "LEVEL None" in proc.stdout


def test_a_kineto_log_level_the_user_set_wins(socket_dir, fake_daemon):
    proc = _run_quiet_script(socket_dir, KINETO_LOG_LEVEL="5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the 6 windows sent and the one opened for step 32, dropped at exit
    assert proc.stderr.count("profiler_start") == 7
    assert proc.stderr.count("profiler_stop") == 7
    assert "LEVEL 5" in proc.stdout


def test_windows_fold_off_the_training_thread_and_are_all_sent_at_exit(
    socket_dir, fake_daemon, monkeypatch
):
    # the fold of every window waits until the loop is over: the steps go on
    # meanwhile, and exit sends each window's event, in order
    import threading

    released = threading.Event()
    threads: list[str] = []
    real_fold = trace_mod._fold

    def held_fold(*args):
        threads.append(threading.current_thread().name)
        released.wait(30)
        return real_fold(*args)

    monkeypatch.setattr(trace_mod, "_fold", held_fold)
    monkeypatch.setattr(trace_mod, "MAX_FOLDS_PENDING", 100)
    with profile(socket_dir, trace_every_n_steps=4) as prof:
        train(steps=13)
        assert kernels(fake_daemon) == []  # nothing folded yet, and 13 steps done
        assert prof._tracer.windows == 6
        released.set()
    want = [0, 1, 4, 5, 8, 12]
    assert [w["steps"] for w in kernels(fake_daemon)] == [[i] for i in want]
    assert threads == [trace_mod.FOLD_THREAD + "_0"] * 6
    assert not [t for t in threading.enumerate() if t.name.startswith(trace_mod.FOLD_THREAD)]
    assert_nothing_left()


def test_a_fold_that_cannot_keep_up_is_waited_for_not_piled_up(
    socket_dir, fake_daemon, monkeypatch
):
    # each fold takes 0.1 s, the steps a few ms: uncapped, the folds would pile up
    pending: list[int] = []
    real_send = trace_mod.Tracer._send_folded
    real_fold = trace_mod._fold

    def slow_fold(*args):
        time.sleep(0.1)
        return real_fold(*args)

    monkeypatch.setattr(trace_mod, "_fold", slow_fold)

    def counting(self, wait=False):
        pending.append(len(self._folding))
        real_send(self, wait)

    monkeypatch.setattr(trace_mod.Tracer, "_send_folded", counting)
    monkeypatch.setattr(trace_mod, "MAX_FOLDS_PENDING", 2)
    with profile(socket_dir, trace_every_n_steps=1):
        train(steps=12)
    assert max(pending) <= 3  # one over the cap at most, then waited for
    assert [w["steps"] for w in kernels(fake_daemon)] == [[i] for i in range(12)]


def test_loop_that_raises_inside_a_window_leaves_nothing_behind(socket_dir, fake_daemon):
    def boom(i):
        if i == 4:
            raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        with profile(socket_dir, trace_every_n_steps=5):
            train(steps=10, on_step=boom)  # window for step 5 opened at step 4's end
    assert_nothing_left()
    assert fake_daemon.of_type("bye")[0]["status"] == "failed"
    assert traced(fake_daemon) == [0, 1]


def test_profiler_failure_disables_tracing_with_a_note(socket_dir, fake_daemon, monkeypatch):
    calls = []

    def broken_start(self):
        calls.append(1)
        raise RuntimeError("kineto is broken")

    monkeypatch.setattr(torch.profiler.profile, "start", broken_start)
    with profile(socket_dir, trace_every_n_steps=2) as prof:
        train(steps=6)
    assert len(calls) == 1  # tried once, then off for the run
    assert kernels(fake_daemon) == [] and traced(fake_daemon) == []
    assert len(fake_daemon.steps) == 6
    assert any(
        "trace windows disabled" in n and "kineto is broken" in n for n in prof._tracer.notes
    )
    assert prof.summary is not None
    assert any("trace windows disabled" in n for n in prof.summary["notes"])
    assert_nothing_left()


def test_tracing_without_torch_in_manual_mode_is_a_note(socket_dir, fake_daemon, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.autograd.profiler", None)  # import fails
    with profile(socket_dir, auto=False, trace_every_n_steps=2) as prof:
        for i in range(3):
            with prof.step(i):
                pass
    assert [s["i"] for s in fake_daemon.steps] == [0, 1, 2]
    assert any("could not set up torch.profiler" in n for n in prof._tracer.notes)


# --- bounded memory and disk --------------------------------------------------------


def test_2000_steps_with_snapshots_every_200_keep_memory_flat(socket_dir):
    # no daemon: nothing collects the events in this process (drops are counted)
    marks: dict[int, int] = {}
    model_steps = 2000

    def sample(i):
        if i in (600, 1000, 1400, 1999):  # each right after a snapshot window (i % 200 == 0)
            gc.collect()
            marks[i] = tracemalloc.get_traced_memory()[0]

    def profilers() -> int:
        gc.collect()
        return sum(type(o) is torch.profiler.profile for o in gc.get_objects())

    before = profilers()  # earlier tests' (a logged error's traceback may hold one)
    tracemalloc.start()
    try:
        with profile(socket_dir, trace_every_n_steps=200) as prof:
            train(steps=model_steps, on_step=sample)
    finally:
        tracemalloc.stop()
    assert prof._tracer.windows == 3 + 9  # 0, 1, 5 and 200..1800 (2000 never starts)
    growth = marks[1999] - marks[600]
    assert growth < 256 * 1024, marks  # 7 more windows, well under 37 KiB each
    assert profilers() == before  # none of the 12 windows' profilers is kept


def test_trace_dir_writes_gzip_traces_under_the_cap(socket_dir, fake_daemon, tmp_path):
    out = tmp_path / "traces"
    with profile(socket_dir, trace_every_n_steps=1, trace_dir=out) as prof:
        train(steps=3)
    files = sorted(out.iterdir())
    assert [f.name.split("-step")[1] for f in files] == [
        "0-snapshot-0.pt.trace.json.gz",
        "1-snapshot-1.pt.trace.json.gz",
        "2-snapshot-2.pt.trace.json.gz",
    ]
    assert prof._tracer.bytes_written == sum(f.stat().st_size for f in files)

    one = files[0].stat().st_size
    capped = tmp_path / "capped"
    with profile(
        socket_dir,
        "capped",
        trace_every_n_steps=1,
        trace_dir=capped,
        trace_dir_max_mb=2.5 * one / 1e6,
    ) as prof2:
        train(steps=6)
    sizes = [f.stat().st_size for f in capped.iterdir()]
    assert 1 <= len(sizes) <= 2 and sum(sizes) <= 2.5 * one
    assert any("trace_dir cap" in n for n in prof2._tracer.notes)
    assert len(kernels(fake_daemon)) == 3 + 6  # aggregates keep coming after the cap


def test_a_repeated_manual_step_index_does_not_overwrite_its_trace(
    socket_dir, fake_daemon, tmp_path
):
    model = MLP()
    out = tmp_path / "traces"
    with profile(socket_dir, auto=False, trace_range=(0, 0), trace_dir=out) as prof:
        for _ in range(2):  # the user's loop restarts its counter: step 0 twice
            with prof.step(0):
                model(torch.randn(4, 8)).sum().backward()
    files = list(out.iterdir())
    assert len(files) == 2 == prof._tracer.files_written
    assert prof._tracer.bytes_written == sum(f.stat().st_size for f in files)


def test_the_trace_dir_cap_counts_earlier_runs_traces(socket_dir, fake_daemon, tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    (out / "earlier-run-step0-snapshot-0.pt.trace.json.gz").write_bytes(b"x" * 2_000_000)
    with profile(socket_dir, trace_every_n_steps=1, trace_dir=out, trace_dir_max_mb=2) as prof:
        train(steps=3)
    assert len(list(out.iterdir())) == 1 and prof._tracer.files_written == 0
    assert any("2.0 MB of it from earlier runs" in n for n in prof._tracer.notes)
    assert len(kernels(fake_daemon)) == 3  # aggregates are sent all the same


def test_no_trace_files_without_trace_dir(socket_dir, fake_daemon, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with profile(socket_dir, trace_every_n_steps=1):
        train(steps=2)
    assert list(tmp_path.iterdir()) == []


# --- the fold ------------------------------------------------------------------------


class FakeEvent:
    """A stand-in for torch's ``_KinetoEvent`` (the fold reads only methods)."""

    def __init__(
        self,
        name,
        dev="cpu",
        start=0,
        end=0,
        corr=0,
        linked=0,
        flops=0,
        act="cpu_op",
        thread=1,
        user=False,
    ):
        self._v = (name, dev, start, end, corr, linked, flops, act, thread, user)

    def name(self):
        return self._v[0]  # noqa: E704

    def device_type(self):
        return self._v[1]  # noqa: E704

    def start_ns(self):
        return self._v[2]  # noqa: E704

    def end_ns(self):
        return self._v[3]  # noqa: E704

    def duration_ns(self):
        return self._v[3] - self._v[2]  # noqa: E704

    def correlation_id(self):
        return self._v[4]  # noqa: E704

    def linked_correlation_id(self):
        return self._v[5]  # noqa: E704

    def flops(self):
        return self._v[6]  # noqa: E704

    def activity_type(self):
        return self._v[7]  # noqa: E704

    def start_thread_id(self):
        return self._v[8]  # noqa: E704

    def end_thread_id(self):
        return self._v[8]  # noqa: E704

    def is_user_annotation(self):
        return self._v[9]  # noqa: E704

    def is_python_function(self):
        return False  # noqa: E704

    def is_async(self):
        return False  # noqa: E704


def test_fold_charges_kernels_to_their_op_and_its_parents():
    ev = [
        FakeEvent("user", start=0, end=100, corr=1, user=True, act="user_annotation"),
        FakeEvent("aten::linear", start=1, end=50, corr=2),
        FakeEvent("aten::addmm", start=2, end=40, corr=3, flops=1000),
        FakeEvent("cudaLaunchKernel", start=3, end=4, corr=9, linked=3, act="cuda_runtime"),
        FakeEvent("sm90_gemm", dev="cuda", start=10, end=30, linked=3, act="kernel"),
        FakeEvent("sm90_gemm", dev="cuda", start=40, end=45, linked=3, act="kernel"),
        FakeEvent("Memcpy HtoD", dev="cuda", start=50, end=52, linked=5, act="gpu_memcpy"),
        FakeEvent("aten::copy_", start=60, end=70, corr=5),
        FakeEvent(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL", dev="cuda", start=0, end=7, act="kernel"
        ),
        FakeEvent("aten::view", start=80, end=81, corr=6),  # no device time, no FLOPs
    ]
    rows, dropped = fold_kineto(ev, "cpu")
    got = {(r.name, r.kind): r for r in rows}
    assert dropped == 0
    assert got["sm90_gemm", "kernel"] == KernelAgg("sm90_gemm", "kernel", "compute", 2, 25, 25)
    assert got["Memcpy HtoD", "kernel"].cls == "memcpy"
    assert got["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "kernel"].cls == "comm"
    assert got["aten::addmm", "op"] == KernelAgg("aten::addmm", "op", "compute", 1, 25, 25, 1000.0)
    assert got["aten::linear", "op"] == KernelAgg("aten::linear", "op", "compute", 1, 25, 0)
    assert got["aten::copy_", "op"].self_ns == 2
    assert ("user", "op") not in got and ("aten::view", "op") not in got
    assert ("cudaLaunchKernel", "op") not in got
    assert [r.name for r in rows][:2] == ["aten::addmm", "aten::linear"] or rows[0].total_ns == 25


def test_fold_reads_events_of_a_torch_without_every_method():
    # torch 2.11's _KinetoEvent has no is_python_function and no activity_type
    # (seen on an H200): the fold must still fold, skip user annotations by the
    # predicate it has, and class device activity by its name
    missing = ("is_python_function", "activity_type")
    older = type("OlderEvent", (), {k: v for k, v in vars(FakeEvent).items() if k not in missing})
    assert not any(hasattr(older, m) for m in missing)

    def events(cls):
        return [
            cls("user", start=0, end=100, corr=1, user=True, act="user_annotation"),
            cls("aten::addmm", start=2, end=40, corr=3, flops=1000),
            cls("sm90_gemm", dev="cuda", start=10, end=30, linked=3, act="kernel"),
            cls("aten::copy_", start=60, end=70, corr=5),
            cls("Memcpy HtoD (Pageable -> Device)", dev="cuda", start=62, end=66, linked=5),
        ]

    rows, dropped = fold_kineto(events(older), "cpu")
    assert (rows, dropped) == fold_kineto(events(FakeEvent), "cpu")
    got = {(r.name, r.kind): r for r in rows}
    assert got["aten::addmm", "op"].total_ns == 20 and ("user", "op") not in got
    assert got["Memcpy HtoD (Pageable -> Device)", "kernel"].cls == "memcpy"
    assert got["sm90_gemm", "kernel"].cls == "compute"


def test_fold_caps_rows_and_counts_the_cut():
    ev = [FakeEvent(f"k{i}", dev="cuda", start=0, end=i + 1, act="kernel") for i in range(400)]
    rows, dropped = fold_kineto(ev, "cpu")
    assert len(rows) == MAX_ROWS and dropped == 400 - (MAX_ROWS - 1)
    assert rows[-1].name == "(other)"
    assert sum(r.total_ns for r in rows) == sum(range(1, 401))


# --- Nsight bridge ---------------------------------------------------------------------


def test_nsys_capture_without_cuda_is_a_noop_with_one_notice(socket_dir, fake_daemon, caplog):
    caplog.set_level(logging.WARNING, logger="gpuprof.shim")
    with profile(socket_dir) as prof:
        for _ in range(2):
            with prof.nsys_capture():
                train(steps=1)
    notices = [r for r in caplog.records if "nsys_capture() does nothing here" in r.message]
    assert len(notices) == 1
    assert len(fake_daemon.steps) == 2


def test_nsys_capture_brackets_the_region_with_cuda_profiler_calls(
    socket_dir, fake_daemon, monkeypatch
):
    # no GPU here: only the CUDA calls are mocked
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    with profile(socket_dir) as prof:
        with prof.nsys_capture():
            calls.append("body")
        with pytest.raises(ValueError, match="user error"):
            with prof.nsys_capture():
                raise ValueError("user error")
    assert calls == ["start", "body", "stop", "start", "stop"]


def test_nested_nsys_captures_are_one_capture(socket_dir, fake_daemon, monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    with profile(socket_dir) as prof:
        with prof.nsys_capture():
            with prof.nsys_capture():  # e.g. a helper that brackets itself, called inside
                calls.append("inner")
            calls.append("outer")  # still captured: the inner exit did not stop it
    assert calls == ["start", "inner", "outer", "stop"]


# --- with the real daemon -----------------------------------------------------------


def test_real_daemon_stores_windows_and_traced_steps(tmp_path, socket_dir):
    db = tmp_path / "runs.db"
    with gpuprof.profile(
        "real",
        socket_dir=socket_dir,
        db=db,
        print_summary=False,
        count_flops=False,
        trace_every_n_steps=4,
    ) as prof:
        train(steps=10)
    try:
        conn = sqlite3.connect(db)
        got = [
            r[0]
            for r in conn.execute(
                "SELECT step FROM steps WHERE run_id = ? AND traced = 1 ORDER BY step",
                (prof.run_id,),
            )
        ]
        windows = conn.execute(
            "SELECT count(*) FROM kernel_windows WHERE run_id = ?", (prof.run_id,)
        ).fetchone()[0]
        conn.close()
    finally:
        from gpuprof_shim import autostart

        for p in autostart.spawned_processes():
            p.terminate()
            p.wait(timeout=20)
    assert got == [0, 1, 4, 5, 8]
    assert windows == 5
    assert prof.summary is not None and prof.summary["steps"] == 10


def test_users_profiler_after_the_run_is_untouched(socket_dir, fake_daemon):
    """The wrappers are gone after exit: a user profiler afterwards records normally."""
    with profile(socket_dir, trace_every_n_steps=1):
        train(steps=2)
    assert_nothing_left()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as p:
        torch.randn(3, 3).sum()
    assert "aten::sum" in {e.key for e in p.key_averages()}
