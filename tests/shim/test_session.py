"""Profiler lifecycle: misuse errors, a dead or unhelpful daemon, defaults."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch
import torch.optim.optimizer as optim_mod
from torch import nn

import gpuprof
from gpuprof_shim import control
from gpuprof_shim.session import active_profiler

from .training import train


def profile(socket_dir: Path, name: str = "s", **kw):
    return gpuprof.profile(name, socket_dir=socket_dir, autostart=False, **kw)


def test_nested_profile_raises_and_leaves_the_first_intact(socket_dir, fake_daemon):
    with profile(socket_dir, "outer") as outer:
        patched_call = nn.Module.__call__
        with pytest.raises(RuntimeError, match=r"profile 'outer' is already active"):
            with profile(socket_dir, "inner"):
                pass
        assert nn.Module.__call__ is patched_call is not nn.Module._wrapped_call_impl
        assert active_profiler() is outer
        train(steps=2)
    assert active_profiler() is None
    assert len(fake_daemon.steps) == 2
    assert [h["run_name"] for h in fake_daemon.of_type("hello")] == ["outer"]


def test_concurrent_profile_from_another_thread_is_refused(socket_dir, fake_daemon):
    errors: list[BaseException] = []

    def other() -> None:
        try:
            with profile(socket_dir, "other", auto=False):
                pass
        except RuntimeError as exc:
            errors.append(exc)

    with profile(socket_dir, "main", auto=False):
        t = threading.Thread(target=other)
        t.start()
        t.join(10)
    assert len(errors) == 1 and "'main'" in str(errors[0])


def test_a_profiler_is_entered_once(socket_dir, fake_daemon):
    prof = profile(socket_dir, auto=False, print_summary=False)
    with prof:
        pass
    with pytest.raises(RuntimeError, match="already used"):
        prof.__enter__()


def test_dead_daemon_training_completes_and_reports_drops(socket_dir, capsys):
    # nothing bound in socket_dir; no stack samples, whose events a busy host
    # may or may not make in 4 steps: the count is the steps'
    prof = profile(socket_dir, "dead", stacks=False)
    t = time.monotonic()
    with prof:
        train(steps=4)
        t_exit = time.monotonic()
    exit_s = time.monotonic() - t_exit
    assert time.monotonic() - t < 30
    assert exit_s < 3.0  # no bye attempted to a daemon that never answered
    assert prof.sender is not None and prof.sender.dropped == 4 and prof.sender.sent == 0
    assert prof.run_id is None
    out = capsys.readouterr().out
    assert "gpuprof · dead  (4 steps, avg" in out
    assert "gpuprofd unreachable" in out and "4 events not recorded (dropped)" in out
    assert "Full report" not in out  # no run id: no report to point at
    assert prof.summary is not None and prof.summary["steps"] == 4
    assert prof.summary["avg_step_ms"] > 0


def test_daemon_that_stops_answering_before_bye(socket_dir, make_daemon, monkeypatch, capsys):
    daemon = make_daemon(answer_bye=False)
    monkeypatch.setattr(control, "BYE_TIMEOUT_MS", 300)
    with profile(socket_dir, "mute") as prof:
        train(steps=2)
    assert len(daemon.of_type("bye")) == 1
    out = capsys.readouterr().out
    assert "did not answer at exit" in out
    assert "gpuprofctl insights" in out and out.rstrip().count(" 7\n") == 1  # the run id
    assert prof.summary["steps"] == 2 and prof.summary["run_id"] == 7


def test_daemon_refusing_the_run(socket_dir, make_daemon, capsys):
    daemon = make_daemon(hello_reply=lambda msg: {"ok": False, "error": "disk full"})
    with profile(socket_dir, "refused", auto=False) as prof:
        with prof.step(0):
            pass
    assert daemon.of_type("bye") == []  # the daemon has no run to end
    assert "gpuprofd refused the run: disk full" in capsys.readouterr().out


def test_malformed_hello_reply_counts_as_no_daemon(socket_dir, make_daemon, capsys):
    make_daemon(hello_reply=lambda msg: {"ok": True, "db": "/x"})  # no run_id
    with profile(socket_dir, "odd", auto=False) as prof:
        pass
    assert prof.run_id is None
    assert "gpuprofd unreachable" in capsys.readouterr().out


def test_socket_path_too_long_degrades_instead_of_failing(tmp_path, capsys):
    long_dir = tmp_path / ("d" * 120)
    with profile(long_dir, "long", auto=False) as prof:
        with prof.step(0):
            pass
    out = capsys.readouterr().out
    assert "gpuprofd unreachable (socket path" in out
    assert "(1 step" in out and "(1 steps" not in out


def test_print_summary_false_prints_nothing(socket_dir, fake_daemon, capsys):
    with profile(socket_dir, auto=False, print_summary=False) as prof:
        pass
    assert capsys.readouterr().out == ""
    assert prof.summary is not None and prof.summary["run_name"] == "s"


@pytest.mark.parametrize(
    ("rank", "asked", "printed"),
    [
        (None, None, True),
        ("0", None, True),
        ("3", None, False),
        ("3", True, True),
        ("0", False, False),
    ],
)
def test_the_summary_prints_on_rank_0_unless_asked(
    socket_dir, fake_daemon, capsys, monkeypatch, rank, asked, printed
):
    # under torchrun every rank would print its block; one is read, all are stored
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("WORLD_SIZE", "4")
    kw = {} if asked is None else {"print_summary": asked}
    with profile(socket_dir, auto=False, **kw) as prof:
        pass
    assert ("gpuprof · s" in capsys.readouterr().out) is printed
    assert prof.summary is not None and prof.summary["run_name"] == "s"


def test_manual_mode_leaves_torch_unpatched(socket_dir, fake_daemon):
    with profile(socket_dir, auto=False):
        assert vars(nn.Module)["__call__"] is nn.Module._wrapped_call_impl
        assert not optim_mod._global_optimizer_post_hooks


def test_defaults_come_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPROF_SOCKET", str(tmp_path / "sock"))
    monkeypatch.setenv("GPUPROF_DB", "rel.db")
    monkeypatch.chdir(tmp_path)
    prof = gpuprof.profile("env")
    assert prof.socket_dir == tmp_path / "sock"
    assert prof.db == str(tmp_path / "rel.db")
    assert len(prof.run_key) == 32 and int(prof.run_key, 16) >= 0


def test_bad_rank_env_falls_back_to_defaults(monkeypatch):
    monkeypatch.setenv("RANK", "two")
    monkeypatch.setenv("WORLD_SIZE", "4")
    ranks = gpuprof.profile("r").ranks
    assert (ranks.rank, ranks.local_rank, ranks.world_size) == (0, 0, 4)


@pytest.mark.parametrize(
    "bad",
    [
        {"flops_per_step": -1},
        {"flops_per_step": True},
        {"flops_per_step": "1e12"},
        {"dtype": "x" * 40},
    ],
)
def test_invalid_options_are_rejected_before_anything_starts(bad):
    with pytest.raises(ValueError, match="gpuprof"):
        gpuprof.profile("bad", **bad)
    assert active_profiler() is None


def test_sys_exit_zero_inside_the_loop_is_a_normal_end(socket_dir, fake_daemon):
    with pytest.raises(SystemExit):
        with profile(socket_dir, auto=False, print_summary=False):
            raise SystemExit(0)
    with pytest.raises(SystemExit):
        with profile(socket_dir, auto=False, print_summary=False):
            raise SystemExit(2)
    first, second = fake_daemon.of_type("bye")
    assert first["status"] == "finished" and "error" not in first
    assert (second["status"], second["error"]) == ("failed", "SystemExit: 2")


def test_patches_are_removed_before_bye_and_even_if_finishing_fails(
    socket_dir, fake_daemon, monkeypatch
):
    seen_at_bye = []
    real_request = control.request

    def spy(ctx, endpoint, msg, *a, **kw):
        if msg["type"] == "bye":
            seen_at_bye.append(vars(nn.Module)["__call__"] is nn.Module._wrapped_call_impl)
        return real_request(ctx, endpoint, msg, *a, **kw)

    monkeypatch.setattr(control, "request", spy)
    with profile(socket_dir, print_summary=False):
        train(steps=1)
    assert seen_at_bye == [True]

    def broken(self, exc):
        raise RuntimeError("internal")

    monkeypatch.setattr("gpuprof_shim.session.Profiler._finish", broken)
    boom = KeyError("user")
    with pytest.raises(KeyError) as info:
        with profile(socket_dir, print_summary=False):
            train(steps=1)
            raise boom
    assert info.value is boom  # gpuprof's own failure never replaces the user's error
    assert vars(nn.Module)["__call__"] is nn.Module._wrapped_call_impl
    assert active_profiler() is None


def test_step_events_go_out_in_bursts_or_after_50_ms() -> None:
    from gpuprof_shim import batcher as batcher_mod
    from gpuprof_shim.batcher import StepBatcher
    from gpuprof_shim.steps import StepRecord

    class Capture:
        def __init__(self) -> None:
            self.bursts: list[list[int]] = []

        def send_batch(self, run_key: str, events) -> int:
            assert run_key == "rk"
            self.bursts.append([e["i"] for e in events])
            return len(events)

    sender = Capture()
    batcher = StepBatcher(sender, "rk", read_memory=lambda: None)  # type: ignore[arg-type]
    ms = 1_000_000
    every = batcher_mod.SEND_EVERY_STEPS
    n = 2 * every + 1
    for i in range(n):  # 0.1 ms steps: bursts by count
        t0 = 10**12 + i * ms // 10
        batcher.add(StepRecord(i, t0, t0 + ms // 20, 0, False, 1, {}))
    # the first step goes at once (nothing sent yet), then one burst per `every` steps
    assert sender.bursts == [[0], list(range(1, every + 1)), list(range(every + 1, 2 * every + 1))]
    assert batcher.pending == 0
    last = 10**12 + (n - 1) * ms // 10 + ms // 20  # the last burst's time
    batcher.add(StepRecord(n, last, last + ms, 0, False, 1, {}))
    assert batcher.pending == 1  # 1 ms after the last burst: it waits
    slow_t1 = last + batcher_mod.SEND_EVERY_NS
    batcher.add(StepRecord(n + 1, slow_t1 - ms, slow_t1, 0, False, 1, {}))
    assert sender.bursts[-1] == [n, n + 1]  # 50 ms later: everything pending goes
    batcher.add(StepRecord(n + 2, slow_t1 + ms, slow_t1 + 2 * ms, 0, False, 1, {}))
    batcher.flush(slow_t1 + 3 * ms, final=True)
    assert sender.bursts[-1] == [n + 2]
    assert sum(map(len, sender.bursts)) == n + 3  # each step exactly once


def test_start_stop_without_with_and_a_failed_stop(socket_dir, fake_daemon):
    prof = profile(socket_dir, "callbacks", print_summary=False).start()
    assert active_profiler() is prof
    train(steps=2)
    prof.stop(RuntimeError("trainer crashed"))
    prof.stop()  # a second stop does nothing
    assert active_profiler() is None
    (bye,) = fake_daemon.of_type("bye")
    assert (bye["status"], bye["error"]) == ("failed", "RuntimeError: trainer crashed")
    assert len(fake_daemon.steps) == 2


def test_external_step_source_ends_steps_only_when_told(socket_dir, fake_daemon):
    with profile(socket_dir, "ext", step_source="external", print_summary=False) as prof:
        model = nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(6):  # a framework: optimizer.step() on every other micro-batch
            model(torch.randn(3, 4)).sum().backward()
            if i % 2:
                opt.step()
            if i in (1, 5):
                prof.mark_step_end(skipped=i == 5, micro=2 if i == 1 else None)
    steps = fake_daemon.steps
    # micro-batches 2-3 had no step end before 4-5's: one step with 4 counted backwards
    assert [(s["i"], s["micro"], s.get("skipped", False)) for s in steps] == [
        (0, 2, False),
        (1, 4, True),
    ]
    assert [o["updates"] for o in steps[1]["optimizers"]] == [2]


def test_mark_step_end_outside_external_mode_does_nothing(socket_dir, fake_daemon):
    with profile(socket_dir, "opt", print_summary=False) as prof:
        prof.mark_step_end()  # auto mode finds steps itself; never raises
        train(steps=3)
        prof.mark_step_end()
    assert len(fake_daemon.steps) == 3


def test_bad_step_source_is_refused():
    with pytest.raises(ValueError, match="step_source"):
        gpuprof.profile("x", step_source="batch")


def test_a_name_or_group_with_a_lone_surrogate_is_escaped_not_raised(socket_dir, fake_daemon):
    # profile("x", group="\ud800") raised UnicodeEncodeError into the user's code
    with profile(socket_dir, "run-\ud800", group="job-\ud800", print_summary=False):
        train(steps=2)
    (hello,) = fake_daemon.of_type("hello")
    assert hello["run_name"] == "run-\\ud800" and hello["group"] == "job-\\ud800"
    assert len(fake_daemon.steps) == 2


def test_the_run_ends_when_its_block_does_not_after_the_wrap_up(
    socket_dir, fake_daemon, monkeypatch
):
    # gpuprofd slow to acknowledge: exit waits for it, but the run's end (the
    # bye's clocks: its duration, GPU-hours, cost) is the block's end
    from gpuprof_shim.link import DaemonLink

    real_settle = DaemonLink.settle
    settle_began: list[int] = []

    def slow_settle(self, wait_s=None):
        settle_began.append(time.monotonic_ns())
        time.sleep(0.3)
        return real_settle(self, wait_s)

    monkeypatch.setattr(DaemonLink, "settle", slow_settle)
    with profile(socket_dir, "ends"):
        train(steps=2)
    (bye,) = fake_daemon.of_type("bye")
    steps_end = max(s["t1"] for s in fake_daemon.steps)
    assert settle_began and steps_end <= bye["mono_ns"] < settle_began[0]
