"""The manual API (``auto=False``): steps, phases, wrap_dataloader; and that
it needs no torch at all."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import gpuprof
from gpuprof_shim.manual import NullStep


class Clock:
    """Fake monotonic clock: each read adds 1 ns; tests advance it."""

    def __init__(self) -> None:
        self.now = 10_000

    def __call__(self) -> int:
        self.now += 1
        return self.now


def manual(socket_dir: Path, clock: Clock | None = None, **kw):
    prof = gpuprof.profile("m", auto=False, socket_dir=socket_dir, autostart=False, **kw)
    if clock is not None:
        prof.clock = clock
    return prof


def slow_loader(clock: Clock, n: int) -> Iterator[int]:
    """Yields 0..n-1; fetching item k costs 1000·(k+1) ns, and the final
    next() (the one that raises StopIteration) costs 50 000 ns."""
    for k in range(n):
        clock.now += 1_000 * (k + 1)
        yield k
    clock.now += 50_000


def test_wrap_dataloader_times_each_next_as_the_next_steps_wait(socket_dir, fake_daemon):
    clock = Clock()
    with manual(socket_dir, clock) as prof:
        for i, batch in enumerate(prof.wrap_dataloader(slow_loader(clock, 3))):
            with prof.step(i) as s:
                assert s.i == batch
                clock.now += 200
        with prof.step(3):  # after the loop: the StopIteration next() is not wait
            clock.now += 5
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == [0, 1, 2, 3]
    assert [s["explicit"] for s in steps] == [True] * 4
    # each next() costs its 1000·(k+1) plus the clock read inside the timing (+1)
    assert [s["wait"] for s in steps] == [1_001, 2_001, 3_001, 0]
    assert [s["micro"] for s in steps] == [1] * 4
    assert steps[0]["t1"] - steps[0]["t0"] == 201


def test_without_wrap_dataloader_wait_is_the_gap_between_steps(socket_dir, fake_daemon):
    clock = Clock()
    with manual(socket_dir, clock) as prof:
        clock.now += 700
        with prof.step(0):
            clock.now += 10
        clock.now += 300
        with prof.step(1):
            pass
    s0, s1 = fake_daemon.steps
    assert (s0["explicit"], s1["explicit"]) == (False, False)
    assert s0["wait"] == 701  # from the profile start
    assert s1["wait"] == 301
    assert s1["t0"] - s0["t1"] == s1["wait"]


def test_phases_sum_repeats_and_count_same_name_nesting_once(socket_dir, fake_daemon):
    clock = Clock()
    with manual(socket_dir, clock) as prof:
        with prof.step(0) as s:
            with s.phase("forward"):
                clock.now += 100
                with s.phase("forward"):  # nested same name: counted once
                    clock.now += 10
            with s.phase("forward"):  # repeated: adds up
                clock.now += 1_000
            with s.phase("backward"):
                clock.now += 50
                with s.phase("comm"):  # nested other name: its own phase
                    clock.now += 20
    (step,) = fake_daemon.steps
    # each count includes the 1 ns clock reads made inside the phase
    assert step["phases"] == {"forward": 1_112, "backward": 73, "comm": 21}


def test_phase_names_are_cleaned_and_bounded(socket_dir, fake_daemon):
    with manual(socket_dir) as prof:
        with prof.step(0) as s:
            with s.phase("bad\nname"):
                pass
            for k in range(40):
                with s.phase(f"p{k}"):
                    pass
    (step,) = fake_daemon.steps
    assert "bad name" in step["phases"]
    assert len(step["phases"]) == 32 and "other" in step["phases"]


def test_step_index_defaults_and_bad_indices(socket_dir, fake_daemon):
    with manual(socket_dir) as prof:
        with prof.step(5):
            pass
        with prof.step():
            pass
        with prof.step("x"):
            pass
    assert [s["i"] for s in fake_daemon.steps] == [5, 6, 7]


def test_nested_step_is_ignored_not_raised(socket_dir, fake_daemon):
    with manual(socket_dir) as prof:
        with prof.step(0):
            with prof.step(1):
                pass
    assert [s["i"] for s in fake_daemon.steps] == [0]


def test_prof_step_in_auto_mode_records_nothing(socket_dir, fake_daemon):
    with gpuprof.profile("a", socket_dir=socket_dir, autostart=False) as prof:
        with prof.step(0) as s:
            with s.phase("x"):
                pass
    assert isinstance(s, NullStep)
    assert fake_daemon.steps == []


def test_manual_mode_runs_with_torch_unimportable(socket_dir, fake_daemon):
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules["torch"] = None  # import torch now raises ImportError
        import gpuprof
        try:
            gpuprof.profile("x", socket_dir={str(socket_dir)!r}, autostart=False).__enter__()
        except ImportError as exc:
            print("AUTO-REFUSED", "auto=False" in str(exc))
        with gpuprof.profile("no-torch", auto=False, socket_dir={str(socket_dir)!r},
                             autostart=False) as prof:
            for i, b in enumerate(prof.wrap_dataloader(range(3))):
                with prof.step(i) as s:
                    with s.phase("work"):
                        sum(range(1000))
        print("TORCH", sys.modules["torch"])
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "AUTO-REFUSED True" in proc.stdout
    assert "TORCH None" in proc.stdout
    assert "gpuprof · no-torch  (3 steps" in proc.stdout
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == [0, 1, 2]
    assert all(s["explicit"] and s["phases"]["work"] > 0 for s in steps)
    hellos = fake_daemon.of_type("hello")
    assert [h["auto"] for h in hellos] == [False]  # the refused auto run never said hello
