"""DDP per-bucket comm timing (gpuprof_shim.comm) with real torch and a real
single-rank gloo process group on CPU; the CUDA-event path with fake events."""

from __future__ import annotations

import logging
import pickle
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import gpuprof
from gpuprof.comm import COMM_PHASE, BucketTiming, ClockOffset
from gpuprof_shim.comm import HOLD_NS, CommHook, CommTimer
from gpuprof_shim.steps import StepRecord
from tests.shim.training import MLP

#: A bucket cap small enough that MLP's ~1.9 KB of gradients make two buckets.
CAP_MB = 0.0005


@pytest.fixture
def pg(tmp_path: Path) -> Iterator[None]:
    """A single-rank gloo process group (FileStore: no port to pick)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def profile(socket_dir: Path, **kw: Any) -> gpuprof.Profiler:
    return gpuprof.profile("ddp", socket_dir=socket_dir, autostart=False, print_summary=False, **kw)


def make_ddp(**kw: Any) -> DDP:
    torch.manual_seed(0)
    return DDP(MLP(), bucket_cap_mb=CAP_MB, **kw)


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(n)
    ]


def train(model: DDP, steps: int, accum: int = 1, marks: list[int] | None = None) -> DDP:
    """*steps* SGD steps of *accum* micro-batches, all but the last under
    ``no_sync()``; *marks* gets the time before each step's synced micro-batch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = torch.nn.CrossEntropyLoss()
    data = iter(batches(steps * accum))
    for _ in range(steps):
        for k in range(accum):
            x, y = next(data)
            if k < accum - 1:
                with model.no_sync():
                    (loss_fn(model(x), y) / accum).backward()
            else:
                if marks is not None:
                    marks.append(time.monotonic_ns())
                (loss_fn(model(x), y) / accum).backward()
        opt.step()
        opt.zero_grad()
    return model


def params(model: DDP) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def plain_params(steps: int, accum: int = 1) -> list[torch.Tensor]:
    """The same training with plain DDP (no gpuprof)."""
    return params(train(make_ddp(), steps, accum))


def param_bytes(model: DDP) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def assert_no_comm_patch() -> None:
    assert not hasattr(vars(DDP)["register_comm_hook"], "__wrapped__")


def counting_hook(state, bucket):  # unannotated: DDP compares them with its own types
    """A user comm hook (module level: DDP pickles with it): counts its calls."""
    state["calls"] += 1
    return default_hooks.allreduce_hook(None, bucket)


def test_buckets_timed_per_step(pg, socket_dir, fake_daemon):
    model = make_ddp()
    with profile(socket_dir) as prof:
        train(model, 6)
    steps = fake_daemon.steps
    assert len(steps) == 6
    for s in steps:
        rows = [BucketTiming.from_wire(r) for r in s["comm"]]
        assert sum(b.nbytes for b in rows) == param_bytes(model)
        assert len({b.bucket for b in rows}) == len(rows)
        assert all(s["t0"] <= b.start_ns <= b.end_ns <= s["t1"] for b in rows)
        assert COMM_PHASE in s["phases"]
        assert sum(s["phases"].values()) <= s["t1"] - s["t0"]
    # DDP rebuilds its buckets after the first step: two with this cap
    assert {len(s["comm"]) for s in steps[1:]} == {2}
    assert prof._comm is not None and prof._comm.dropped == 0
    assert_no_comm_patch()
    # the default hook leaves DDP's own bookkeeping as without gpuprof
    assert model._comm_hooks == [] and "comm_hook" not in model._get_ddp_logging_data()


def test_gradients_equal_plain_ddp(pg, socket_dir, fake_daemon):
    model = make_ddp()
    with profile(socket_dir):
        train(model, 5)
    for a, b in zip(params(model), plain_params(5), strict=True):
        assert torch.equal(a, b)


def test_no_sync_times_only_the_synced_micro_batch(pg, socket_dir, fake_daemon):
    model = make_ddp()
    marks: list[int] = []
    with profile(socket_dir):
        train(model, 4, accum=4, marks=marks)
    steps = fake_daemon.steps
    assert [s["micro"] for s in steps] == [4] * 4
    for s, mark in zip(steps, marks, strict=True):
        rows = [BucketTiming.from_wire(r) for r in s["comm"]]
        assert sum(b.nbytes for b in rows) == param_bytes(model)  # one all-reduce per step
        assert all(b.start_ns > mark for b in rows)  # in the last micro-batch only
    for a, b in zip(params(model), plain_params(4, accum=4), strict=True):
        assert torch.equal(a, b)


def test_user_hook_registered_inside_is_wrapped(pg, socket_dir, fake_daemon):
    state = {"calls": 0}
    with profile(socket_dir):
        model = make_ddp()
        model.register_comm_hook(state, counting_hook)
        train(model, 4)
    assert state["calls"] >= 4 * 2 - 1  # every bucket of every step (2 from step 1)
    assert all(len(s["comm"]) >= 1 for s in fake_daemon.steps)
    hook, hook_state = model._comm_hooks[0]
    assert isinstance(hook, CommHook) and hook.user_hook is counting_hook and hook_state is state
    assert model._get_ddp_logging_data()["comm_hook"] == counting_hook.__qualname__
    assert pickle.loads(pickle.dumps(hook)) is counting_hook
    calls = state["calls"]
    train(model, 1)  # after the profile: theirs still runs, ours records nothing
    assert state["calls"] > calls
    assert_no_comm_patch()


def test_user_hook_registered_after_the_first_forward_is_wrapped(pg, socket_dir, fake_daemon):
    state = {"calls": 0}
    with profile(socket_dir):
        model = make_ddp()
        train(model, 2)  # our default hook is on the reducer now
        model.register_comm_hook(state, counting_hook)
        train(model, 2)
    assert state["calls"] >= 2 * 2
    assert all(len(s["comm"]) >= 1 for s in fake_daemon.steps)
    assert model._comm_hooks[0][0].user_hook is counting_hook
    with pytest.raises(RuntimeError, match="only be called once"):
        model.register_comm_hook(state, counting_hook)  # as without gpuprof


def test_user_hook_registered_before_is_left_alone_with_one_notice(
    pg, socket_dir, fake_daemon, caplog
):
    state = {"calls": 0}
    model = make_ddp()
    model.register_comm_hook(state, counting_hook)
    other = DDP(MLP(), bucket_cap_mb=CAP_MB)
    other.register_comm_hook(state, counting_hook)
    with caplog.at_level(logging.WARNING, "gpuprof.shim"), profile(socket_dir) as prof:
        train(model, 3)
        train(other, 1)
    assert all("comm" not in s for s in fake_daemon.steps)
    notes = [n for n in prof.summary["notes"] if "comm hook" in n]
    assert len(notes) == 1 and "counting_hook" in notes[0]
    # it says what to do
    assert notes[0].endswith(": register it inside `with gpuprof.profile(...)` to time its buckets")
    assert len([r for r in caplog.records if "comm hook" in r.getMessage()]) == 1
    assert model._comm_hooks[0][0] is counting_hook
    for a, b in zip(params(model), plain_params(3), strict=True):
        assert torch.equal(a, b)


def test_builtin_hook_registered_before_gets_a_notice(pg, socket_dir, fake_daemon):
    model = make_ddp()
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
    with profile(socket_dir) as prof:
        train(model, 3)
    assert all("comm" not in s for s in fake_daemon.steps)
    assert any("ALLREDUCE" in n for n in prof.summary["notes"])


@pytest.mark.parametrize("kind", ["ALLREDUCE", "FP16_COMPRESS"])
@pytest.mark.parametrize("after_forward", [False, True])
def test_builtin_hook_registered_inside_is_timed_and_trains_as_without_gpuprof(
    pg, socket_dir, fake_daemon, kind, after_forward
):
    # after the first forward our hook is on the reducer: the builtin one was
    # refused ("can only be called once"), raising in code that works without
    # gpuprof; before it, the hook was skipped with "registered before the profile"
    hook_type = getattr(dist.BuiltinCommHookType, kind)
    plain = make_ddp()
    if after_forward:
        train(plain, 1)
    plain._register_builtin_comm_hook(hook_type)
    train(plain, 3)
    with profile(socket_dir) as prof:
        model = make_ddp()
        if after_forward:
            train(model, 1)
        model._register_builtin_comm_hook(hook_type)
        train(model, 3)
    assert not [n for n in prof.summary["notes"] if "hook" in n], prof.summary["notes"]
    assert all(s.get("comm") for s in fake_daemon.steps)
    assert model._get_ddp_logging_data()["comm_hook"] == str(hook_type)
    assert not hasattr(vars(DDP)["_register_builtin_comm_hook"], "__wrapped__")
    for a, b in zip(params(model), params(plain), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(RuntimeError, match="only be called once"):
        model._register_builtin_comm_hook(hook_type)  # a second one, as without gpuprof


def test_a_user_hook_returning_no_future_fails_as_without_gpuprof(pg, socket_dir, fake_daemon):
    # our wrapper called .then on what their hook returned: AttributeError
    # ("'Tensor' object has no attribute 'then'") instead of DDP's own error
    def no_future(state, bucket):
        return bucket.buffer()

    def error_of(model: DDP) -> str:
        model.register_comm_hook(None, no_future)
        x, y = batches(1)[0]
        with pytest.raises(Exception) as info:
            torch.nn.functional.cross_entropy(model(x), y).backward()
        return type(info.value).__name__

    plain = error_of(make_ddp())
    with profile(socket_dir):
        assert error_of(make_ddp()) == plain == "RuntimeError"


def test_refused_registration_is_a_notice(pg, socket_dir, fake_daemon, monkeypatch):
    def refuse(*args: Any) -> None:
        raise RuntimeError("the reducer says no")

    monkeypatch.setattr(dist, "_register_comm_hook", refuse)
    model = make_ddp()
    with profile(socket_dir) as prof:
        train(model, 3)
    assert len(fake_daemon.steps) == 3 and all("comm" not in s for s in fake_daemon.steps)
    assert any("the reducer says no" in n for n in prof.summary["notes"])


def test_after_exit_our_hook_is_a_pass_through(pg, socket_dir, fake_daemon):
    model = make_ddp()
    with profile(socket_dir) as prof:
        train(model, 2)
    timer = prof._comm
    assert timer is not None and not timer.recording
    assert_no_comm_patch()
    before = timer.attached
    train(model, 3)  # the hook stays on the reducer: plain all-reduce now
    assert timer.pending() == 0 and timer.attached == before
    plain = train(train(make_ddp(), 2), 3)
    for a, b in zip(params(model), params(plain), strict=True):
        assert torch.equal(a, b)


def test_a_later_profile_takes_over_the_hook(pg, socket_dir, make_daemon):
    model = make_ddp()
    first = make_daemon()
    with profile(socket_dir):
        train(model, 2)
    first.close()
    second = make_daemon()
    state = {"calls": 0}
    with profile(socket_dir) as prof:
        model.register_comm_hook(state, counting_hook)  # ours is on the reducer: no refusal
        train(model, 2)
    assert prof.summary is not None and not [n for n in prof.summary["notes"] if "hook" in n]
    assert state["calls"] >= 2 and all(s.get("comm") for s in second.steps)
    assert len(second.steps) == 2


def test_time_comm_false_registers_nothing(pg, socket_dir, fake_daemon):
    model = make_ddp()
    with profile(socket_dir, time_comm=False):
        train(model, 3)
    assert len(fake_daemon.steps) == 3
    assert all("comm" not in s and COMM_PHASE not in s["phases"] for s in fake_daemon.steps)
    model.register_comm_hook({"calls": 0}, counting_hook)  # the reducer has no hook of ours


def test_ddp_inside_a_wrapper_root_is_found(pg, socket_dir, fake_daemon):
    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ddp = make_ddp()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.ddp(x)

    root = Wrapper()
    opt = torch.optim.SGD(root.parameters(), lr=0.1)
    with profile(socket_dir):
        for x, y in batches(3):
            torch.nn.functional.cross_entropy(root(x), y).backward()
            opt.step()
            opt.zero_grad()
    assert all(s.get("comm") for s in fake_daemon.steps)


# --- CommTimer without a process group: fake buckets, futures, CUDA events ------


class FakeBuffer:
    def __init__(self, numel: int, cuda: bool) -> None:
        self._numel, self.is_cuda = numel, cuda

    def numel(self) -> int:
        return self._numel

    def element_size(self) -> int:
        return 4


class FakeBucket:
    def __init__(self, index: int, numel: int = 10, cuda: bool = False) -> None:
        self._index, self._buf = index, FakeBuffer(numel, cuda)

    def index(self) -> int:
        return self._index

    def buffer(self) -> FakeBuffer:
        return self._buf


class FakeFuture:
    def __init__(self, value: Any) -> None:
        self._value = value

    def value(self) -> Any:
        return self._value


class FakeEvent:
    """A CUDA event: done once ``done`` is set; at GPU time ``t_ms``."""

    def __init__(self, t_ms: float) -> None:
        self.t_ms, self.done = t_ms, False

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.done and end.done  # never asked before both completed
        return end.t_ms - self.t_ms


class Clock:
    def __init__(self) -> None:
        self.t = 1_000

    def __call__(self) -> int:
        return self.t


def step(i: int, t0: int, t1: int, backward: int = 500) -> StepRecord:
    return StepRecord(i, t0, t1, 0, False, 1, {"forward": 100, "backward": backward})


def _cuda_timer() -> tuple[CommTimer, Clock, list[FakeEvent], list[Any]]:
    """A timer with two CUDA buckets launched in a step (1, then 0), their
    callbacks run; events 0-2 complete, the second bucket's end (3) not yet."""
    clock = Clock()
    timer = CommTimer(clock=clock)
    events: list[FakeEvent] = []

    def new_event() -> FakeEvent:
        events.append(FakeEvent(len(events) * 0.25))  # 0, .25, .5, .75 ms
        return events[-1]

    timer.new_event = new_event  # type: ignore[method-assign]
    recs = []
    for idx in (1, 0):
        clock.t += 100
        rec = timer.begin(FakeBucket(idx, cuda=True))
        assert rec is not None
        recs.append(rec)
    # the callbacks run (the collectives are launched on the GPU's stream)
    assert timer.done_callback(recs[0], first=True)(FakeFuture(["t0"])) == "t0"
    assert timer.done_callback(recs[1], first=False)(FakeFuture("t1")) == "t1"
    events[0].done = events[1].done = events[2].done = True
    return timer, clock, events, recs


def test_a_step_waits_for_its_cuda_events_then_goes_with_them():
    timer, _, events, _ = _cuda_timer()
    steps = [step(0, 1_000, 2_000), step(1, 2_100, 2_900)]
    # the second bucket's GPU work is still running: neither step is ready
    assert timer.attach(steps, now_ns=3_000) == 0
    assert steps[0].comm == () and timer.pending() == 2 and timer.unresolved == 0
    events[3].done = True  # the GPU caught up by the next send
    assert timer.attach(steps, now_ns=4_000) == 2
    s = steps[0]  # given its buckets and comm phase
    # start + GPU time between the events: (0.5 - 0) ms and (0.75 - 0.25) ms
    assert s.comm == [
        BucketTiming(1, 1_100, 1_100 + 500_000, 40),
        BucketTiming(0, 1_200, 1_200 + 500_000, 40),
    ]
    assert timer.unresolved == 0 and timer.pending() == 0
    assert s.phases["backward"] == 0 and s.phases[COMM_PHASE] == 500  # capped by backward


def test_cuda_events_still_running_after_the_hold_or_at_the_end_are_counted():
    for kwargs in ({"now_ns": 2_000 + HOLD_NS}, {"now_ns": 3_000, "final": True}):
        timer, *_ = _cuda_timer()
        steps = [step(0, 1_000, 2_000)]
        assert timer.attach(steps, **kwargs) == 1
        assert steps[0].comm == [BucketTiming(1, 1_100, 1_100 + 500_000, 40)]
        assert timer.unresolved == 1 and timer.pending() == 0
        assert any("left out" in n for n in timer.summary_notes())


def test_settle_waits_for_running_events_but_not_forever():
    timer, _, events, _ = _cuda_timer()
    t = time.monotonic()
    timer.settle(0.05)  # event 3 never completes: gives up
    assert 0.04 <= time.monotonic() - t < 1.0
    events[3].done = True
    t = time.monotonic()
    timer.settle(5.0)
    assert time.monotonic() - t < 0.5  # all complete: returns at once


def test_wall_clock_records_attach_to_their_steps_and_drop_outside():
    clock = Clock()
    timer = CommTimer(clock=clock, max_pending=4)
    starts_ends = [(500, 600), (1_100, 1_300), (1_200, 1_250), (2_500, 2_600), (3_100, 3_200)]
    for k, (start, end) in enumerate(starts_ends):
        clock.t = start
        rec = timer.begin(FakeBucket(k))
        clock.t = end
        timer.done_callback(rec, first=True)(FakeFuture([None]))
    # bounded: the oldest record went
    assert timer.dropped == 1 and timer.pending() == 4
    steps = [step(0, 1_000, 2_000), step(1, 2_100, 2_400)]
    timer.attach(steps)
    a, b = steps
    assert [t.bucket for t in a.comm] == [1, 2] and b.comm == ()
    assert a.phases[COMM_PHASE] == 1_300 - 1_200 and a.phases["backward"] == 400
    assert COMM_PHASE not in b.phases
    # launched after the last step sent: they wait for the next one
    assert timer.dropped == 1 and timer.pending() == 2
    steps = [step(2, 3_000, 3_500)]
    timer.attach(steps)
    assert [t.bucket for t in steps[0].comm] == [4]
    assert timer.dropped == 2 and timer.pending() == 0  # 2500: between steps


def test_hook_bookkeeping_errors_never_reach_training():
    timer = CommTimer(clock=Clock())

    class Broken:
        def index(self) -> int:
            raise ValueError("boom")

        def buffer(self) -> FakeBuffer:
            return FakeBuffer(1, False)

    assert timer.begin(Broken()) is None
    assert timer.pending() == 0


# --- clock alignment wiring (a stand-in ClockAligner) ------------------------


class FakeAligner:
    made: list[FakeAligner] = []

    def __init__(self, on_result: Any, **kw: Any) -> None:
        self.on_result, self.started, self.closed = on_result, 0, 0
        self.note: str | None = "clock alignment: a note"
        FakeAligner.made.append(self)

    def start(self) -> bool:
        self.started += 1
        self.on_result(ClockOffset(1_500, 20, 40, 64))
        return True

    def close(self) -> None:
        self.closed += 1


@pytest.fixture
def fake_aligner(monkeypatch: pytest.MonkeyPatch) -> list[FakeAligner]:
    module = types.ModuleType("gpuprof_shim.clock_align")
    module.ClockAligner = FakeAligner  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "gpuprof_shim.clock_align", module)
    FakeAligner.made = []
    return FakeAligner.made


def test_aligner_starts_at_enter_in_a_process_group(pg, socket_dir, fake_daemon, fake_aligner):
    model = make_ddp()
    with profile(socket_dir) as prof:
        assert len(fake_aligner) == 1 and fake_aligner[0].started == 1
        train(model, 2)
    assert len(fake_aligner) == 1 and fake_aligner[0].closed >= 1
    clocks = [m for m in fake_daemon.data if m["type"] == "clock"]
    assert [(c["offset_ns"], c["uncertainty_ns"], c["rtt_ns"]) for c in clocks] == [(1_500, 20, 40)]
    assert "clock alignment: a note" in prof.summary["notes"]


def test_aligner_starts_at_the_first_ddp_when_the_group_comes_later(
    tmp_path, socket_dir, fake_daemon, fake_aligner
):
    with profile(socket_dir):
        assert fake_aligner == []  # no process group yet
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            train(make_ddp(), 2)
            train(make_ddp(), 1)  # a second DDP: no second aligner
        finally:
            dist.destroy_process_group()
    assert len(fake_aligner) == 1 and fake_aligner[0].started == 1
    assert [bool(s.get("comm")) for s in fake_daemon.steps][:2] == [True, True]
