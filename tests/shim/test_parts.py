"""Direct tests of the profile's parts, each on its own: the daemon link
(``link.DaemonLink``), the model probes (``probes.ModelProbes``), the summary
notes (``notes.add_notes``) and the trace-window and clock-alignment wiring
(``sidecars``)."""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from gpuprof.comm import ClockOffset
from gpuprof.protocol import PROTOCOL_VERSION
from gpuprof_shim import probes as probes_mod
from gpuprof_shim.auto.machine import StepMachine
from gpuprof_shim.link import DaemonLink
from gpuprof_shim.manual import ManualRecorder
from gpuprof_shim.notes import add_notes
from gpuprof_shim.probes import ModelProbes
from gpuprof_shim.sidecars import ClockSync, TraceWindows
from gpuprof_shim.steps import WaitTracker


def _hello(run_key: str = "k" * 32) -> dict[str, Any]:
    return {
        "v": PROTOCOL_VERSION,
        "type": "hello",
        "run_key": run_key,
        "run_name": "parts",
        "pid": 1,
        "host": "h",
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "local_world_size": 1,
        "wall_ns": time.time_ns(),
        "mono_ns": time.monotonic_ns(),
        "auto": False,
        "options": {},
    }


# --- link.DaemonLink -----------------------------------------------------------


def test_link_hello_sets_run_id_and_the_daemons_db(socket_dir, fake_daemon):
    link = DaemonLink(socket_dir, "/tmp/asked.db", autostart=False)
    built: list[int] = []
    try:
        link.connect(lambda: built.append(1) or _hello())
        assert link.ok and link.problem is None
        assert link.run_id == 7 and link.db == fake_daemon.db
        assert built == [1]  # one attempt, one message built
        assert link.sender is not None
    finally:
        link.close()
    assert [m["type"] for m in fake_daemon.control] == ["hello"]


def test_link_without_daemon_and_no_autostart_records_the_problem(socket_dir):
    link = DaemonLink(socket_dir, "/tmp/asked.db", autostart=False)
    try:
        link.connect(_hello)
        assert not link.ok and link.run_id is None
        assert link.problem == f"gpuprofd unreachable at {socket_dir}"
        assert link.db == "/tmp/asked.db"  # unchanged
        note = link.local_note(3)
        assert note.startswith(f"gpuprofd unreachable at {socket_dir}: ")
        assert "not recorded (dropped)" in note
    finally:
        link.close()


def test_link_refused_run_keeps_the_reason(socket_dir, make_daemon):
    make_daemon(hello_reply=lambda msg: {"ok": False, "error": "disk full"})
    link = DaemonLink(socket_dir, "/tmp/asked.db", autostart=False)
    try:
        link.connect(_hello)
        assert not link.ok
        assert link.problem == "gpuprofd refused the run: disk full"
    finally:
        link.close()


def test_link_bye_returns_the_daemons_summary(socket_dir, fake_daemon):
    link = DaemonLink(socket_dir, "/tmp/asked.db", autostart=False)
    try:
        link.connect(_hello)
        bye = {
            "v": PROTOCOL_VERSION,
            "type": "bye",
            "run_key": "k" * 32,
            "status": "finished",
            "sent": 0,
            "dropped": 0,
            "mono_ns": time.monotonic_ns(),
            "wall_ns": time.time_ns(),
        }
        summary = link.bye(bye)
        assert summary is not None and summary["notes"] == ["from the fake daemon"]
        assert link.problem is None
    finally:
        link.close()


def test_link_bye_without_an_answer_says_so(socket_dir, make_daemon, monkeypatch):
    from gpuprof_shim import control

    monkeypatch.setattr(control, "BYE_TIMEOUT_MS", 200)
    make_daemon(answer_bye=False)
    link = DaemonLink(socket_dir, "/tmp/asked.db", autostart=False)
    try:
        link.connect(_hello)
        bye = {
            "v": PROTOCOL_VERSION,
            "type": "bye",
            "run_key": "k" * 32,
            "status": "finished",
            "sent": 0,
            "dropped": 0,
            "mono_ns": time.monotonic_ns(),
            "wall_ns": time.time_ns(),
        }
        assert link.bye(bye) is None
        assert link.problem is not None and "did not answer at exit" in link.problem
        assert link.local_note(2).startswith(link.problem + " (")
    finally:
        link.close()


def test_link_with_an_endpoint_too_long_never_raises(tmp_path):
    deep = tmp_path / ("d" * 120)
    link = DaemonLink(deep, "/tmp/asked.db", autostart=False)
    link.connect(_hello)
    assert not link.ok and link.sender is None
    assert link.problem is not None and link.problem.startswith("gpuprofd unreachable (")
    link.close()  # nothing to close: fine


# --- probes.ModelProbes --------------------------------------------------------


def _machine() -> StepMachine:
    return StepMachine(lambda rec: None, 0, clock=lambda: 0)


def test_probes_with_dtype_and_flops_given_watch_nothing():
    opts = {"dtype": "bf16", "flops_per_step": 1e12, "count_flops": None}
    probes = ModelProbes(opts, lambda: True)
    machine = _machine()
    probes.start(machine)
    assert probes.dtype_probe is None and probes.flop_counter is None
    assert machine.on_forward_probe is None and machine.on_boundary is None
    assert probes.model_info("k") is None and probes.note() is None


def test_probes_on_cpu_stop_at_the_first_forward(monkeypatch):
    monkeypatch.setattr(probes_mod, "cuda_in_use", lambda: False)
    probes = ModelProbes({"dtype": None, "flops_per_step": None, "count_flops": None}, lambda: True)
    machine = _machine()
    probes.start(machine)
    assert probes.dtype_probe is not None and probes.flop_counter is not None
    assert machine.on_forward_probe == probes.on_forward_probe
    probes.on_forward_probe()
    # no CUDA: no peak to compare with, so nothing more runs between steps
    assert machine.on_forward_probe is None and machine.on_boundary is None
    assert probes.dtype_probe is None and probes.flop_counter is None
    assert probes.model_info("k") is None


def test_probes_count_flops_true_counts_from_the_first_boundary():
    opts = {"dtype": "fp32", "flops_per_step": None, "count_flops": True}
    probes = ModelProbes(opts, lambda: True)
    machine = _machine()
    probes.start(machine)
    assert probes.flop_counter is not None and probes.dtype_probe is None
    assert machine.on_boundary == probes.on_boundary  # asked for: on any device


def test_probes_model_info_goes_out_once(monkeypatch):
    probes = ModelProbes({"dtype": None, "flops_per_step": 1.0, "count_flops": False}, lambda: True)
    probes.start(_machine())
    assert probes.flop_counter is None and probes.dtype_probe is not None
    probes.dtype_probe.result = ("bfloat16", "autocast")
    info = probes.model_info("k" * 32)
    assert info is not None
    assert info["type"] == "model_info"
    assert (info["dtype"], info["dtype_source"]) == ("bfloat16", "autocast")
    assert "flops_counted" not in info
    assert probes.model_info("k" * 32) is None  # sent once


def test_probes_boundary_never_raises(monkeypatch):
    def broken(optimizer: Any) -> bool:
        raise RuntimeError("no device")

    monkeypatch.setattr(probes_mod, "on_mfu_device", broken)
    probes = ModelProbes({"dtype": None, "flops_per_step": None, "count_flops": True}, lambda: True)
    probes.start(_machine())
    probes.on_boundary(1, object())  # logged, not raised
    assert probes.traced == set()
    probes.abandon()  # no count running: nothing to give up


# --- notes.add_notes -----------------------------------------------------------


class _Parts:
    notes = ["trace: a window"]
    note = "clock alignment: offset 1 µs"

    def summary_notes(self) -> list[str]:
        return ["comm: 3 buckets"]


def test_notes_in_order():
    summary: dict[str, Any] = {"notes": ["daemon's"], "db": "/a.db"}
    parts = _Parts()
    add_notes(
        summary,
        flop_note="flops: counted",
        tracer=parts,
        comm=parts,
        aligner=parts,
        unfinished_micro=3,
        requested_db="/b.db",
        socket_dir=Path("/run/gp"),
    )
    assert summary["notes"] == [
        "daemon's",
        "flops: counted",
        "trace: a window",
        "comm: 3 buckets",
        "clock alignment: offset 1 µs",
        "3 micro-batches after the last optimizer update (no update followed) "
        "not counted as a step",
        "stored in /a.db, the database of the gpuprofd at /run/gp, not /b.db",
    ]


def test_notes_none_added_when_nothing_to_say():
    summary: dict[str, Any] = {"db": "/a.db"}
    add_notes(
        summary,
        flop_note=None,
        tracer=None,
        comm=None,
        aligner=types.SimpleNamespace(note=None),
        unfinished_micro=0,
        requested_db="/a.db",
        socket_dir=Path("/run/gp"),
    )
    assert "notes" not in summary


def test_notes_one_micro_batch_is_singular():
    summary: dict[str, Any] = {}
    add_notes(
        summary,
        flop_note=None,
        tracer=None,
        comm=None,
        aligner=None,
        unfinished_micro=1,
        requested_db="/a.db",
        socket_dir=Path("/run/gp"),
    )
    assert summary["notes"] == [
        "1 micro-batch after the last optimizer update (no update followed) not counted as a step"
    ]


# --- sidecars ------------------------------------------------------------------


class _FakeAligner:
    made: list[_FakeAligner] = []

    def __init__(self, on_result: Any, **kw: Any) -> None:
        self.on_result, self.started, self.closed = on_result, 0, 0
        _FakeAligner.made.append(self)

    def start(self) -> bool:
        self.started += 1
        self.on_result(ClockOffset(1_500, 20, 40, 64))
        return True

    def close(self) -> None:
        self.closed += 1
        raise RuntimeError("close failed")  # logged, never raised


@pytest.fixture
def fake_aligner(monkeypatch: pytest.MonkeyPatch) -> list[_FakeAligner]:
    module = types.ModuleType("gpuprof_shim.clock_align")
    module.ClockAligner = _FakeAligner  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuprof_shim.clock_align", module)
    _FakeAligner.made = []
    return _FakeAligner.made


def test_clock_sync_starts_once_and_sends_while_open(fake_aligner):
    sent: list[dict[str, Any]] = []
    is_open = [True]
    sync = ClockSync("k" * 32, lambda m: sent.append(m) or True, lambda: is_open[0])
    sync.start()
    sync.start()
    assert len(fake_aligner) == 1 and fake_aligner[0].started == 1
    assert sync.aligner is fake_aligner[0]
    assert [(m["type"], m["offset_ns"], m["run_key"]) for m in sent] == [("clock", 1_500, "k" * 32)]
    is_open[0] = False
    fake_aligner[0].on_result(ClockOffset(9, 1, 2, 3))  # a late result: not sent
    assert len(sent) == 1
    sync.close()
    assert fake_aligner[0].closed == 1


def test_clock_sync_not_without_a_sender_or_when_disabled(fake_aligner):
    ClockSync("k", None, lambda: True).start()
    ClockSync("k", lambda m: True, lambda: True, enabled=False).start()
    assert fake_aligner == []
    ClockSync("k", None, lambda: True).close()  # never started: nothing to close


def test_clock_sync_starts_in_a_process_group_only(fake_aligner):
    group = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False)
    sync = ClockSync("k", lambda m: True, lambda: True)
    sync.start_if_distributed(None)
    sync.start_if_distributed(group)
    assert fake_aligner == []

    def broken() -> bool:
        raise RuntimeError("no")

    sync.start_if_distributed(types.SimpleNamespace(is_available=broken))  # never raises
    group.is_initialized = lambda: True
    sync.start_if_distributed(group)
    assert len(fake_aligner) == 1


class _FakeTracer:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def open(self) -> None:
        self.calls.append(("open", None))

    def boundary(self, i: int) -> None:
        self.calls.append(("boundary", i))

    def start_window(self, i: int) -> None:
        self.calls.append(("start", i))

    def end_window(self) -> None:
        self.calls.append(("end", None))

    def after_step(self, i: int) -> None:  # as the tracer's when no evidence window is open
        self.end_window()

    def traced(self, t0: int, t1: int) -> bool:
        return t0 <= 5 <= t1

    def close(self) -> None:
        self.calls.append(("close", None))


def _windows() -> tuple[TraceWindows, _FakeTracer]:
    windows = TraceWindows.__new__(TraceWindows)
    windows.tracer = fake = _FakeTracer()  # type: ignore[assignment]
    return windows, fake


def test_trace_windows_on_the_step_machine_open_before_step_0():
    windows, fake = _windows()
    machine = _machine()
    windows.attach(machine, None)
    assert fake.calls == [("open", None), ("start", 0)]
    assert machine.boundary == fake.boundary
    assert windows.traced(0, 10) and not windows.traced(6, 10)
    windows.close()
    assert fake.calls[-1] == ("close", None)


def test_trace_windows_around_manual_steps():
    windows, fake = _windows()
    recorder = ManualRecorder(lambda rec: None, WaitTracker(0), clock=lambda: 0)
    windows.attach(None, recorder)
    assert fake.calls == [("open", None)]
    with recorder.step(3):
        pass
    assert fake.calls[1:] == [("start", 3), ("end", None)]
