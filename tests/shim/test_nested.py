"""One ``profile()`` per process: a second one, nested or from another
thread, is refused with a clear error and leaves the first one whole."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
import torch.optim.optimizer as optim_mod
from torch import nn

import gpuprof
from gpuprof_shim import patches
from gpuprof_shim.session import active_profiler

from .training import train


def profile(socket_dir: Path, name: str, **kw):
    return gpuprof.profile(name, socket_dir=socket_dir, autostart=False, print_summary=False, **kw)


def torch_state() -> tuple:
    """Everything of torch's that gpuprof may have changed, as raw objects."""
    return (
        vars(nn.Module)["__call__"],
        vars(torch.Tensor)["backward"],
        torch.autograd.backward,
        dict(optim_mod._global_optimizer_pre_hooks),
        dict(optim_mod._global_optimizer_post_hooks),
    )


def assert_exact_steps(fake_daemon, prof, n: int) -> None:
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == list(range(n))
    assert [s["micro"] for s in steps] == [1] * n
    assert {s["run_key"] for s in steps} == {prof.run_key}
    (hello,) = fake_daemon.of_type("hello")  # the refused one never said hello
    assert hello["run_name"] == prof.run_name
    (bye,) = fake_daemon.of_type("bye")
    sent = n + fake_daemon.stacks_sent(prof.run_key)
    assert (bye["run_key"], bye["sent"], bye["dropped"]) == (prof.run_key, sent, 0)


def test_nested_profile_is_refused_and_the_first_keeps_working(socket_dir, fake_daemon):
    with profile(socket_dir, "outer") as outer:
        train(steps=2)
        before = torch_state()
        inner = profile(socket_dir, "inner")
        with pytest.raises(RuntimeError, match=r"profile 'outer' is already active") as info:
            with inner:
                pytest.fail("the body of a refused profile must not run")
        assert "'inner'" in str(info.value)
        assert torch_state() == before  # nothing patched, restored or unhooked
        assert active_profiler() is outer
        assert patches.current_owner() is outer._patches and outer._patches.installed
        train(steps=3)
    assert active_profiler() is None and patches.current_owner() is None
    assert_exact_steps(fake_daemon, outer, 5)


def test_profile_from_another_thread_is_refused(socket_dir, fake_daemon):
    errors: list[BaseException] = []

    def second() -> None:
        try:
            with profile(socket_dir, "beside"):
                train(steps=4)  # must never run
        except BaseException as exc:  # noqa: BLE001 - handed to the main thread
            errors.append(exc)

    with profile(socket_dir, "first") as first:
        train(steps=1)
        before = torch_state()
        t = threading.Thread(target=second)
        t.start()
        t.join(30)
        assert not t.is_alive()
        assert torch_state() == before
        assert active_profiler() is first
        train(steps=2)
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError)
    assert "profile 'first' is already active" in str(errors[0])
    assert_exact_steps(fake_daemon, first, 3)


def test_profile_refused_in_main_while_a_thread_holds_one(socket_dir, fake_daemon):
    entered, release = threading.Event(), threading.Event()
    holder: list = []

    def run() -> None:
        with profile(socket_dir, "in-thread") as prof:
            holder.append(prof)
            train(steps=1)
            entered.set()
            release.wait(30)
            train(steps=1)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert entered.wait(30)
        with pytest.raises(RuntimeError, match=r"profile 'in-thread' is already active"):
            with profile(socket_dir, "main"):
                pass
    finally:
        release.set()
        t.join(30)
    assert not t.is_alive()
    assert_exact_steps(fake_daemon, holder[0], 2)


@pytest.mark.parametrize(("first_auto", "second_auto"), [(False, True), (True, False)])
def test_manual_and_auto_profiles_do_not_mix(socket_dir, fake_daemon, first_auto, second_auto):
    with profile(socket_dir, "one", auto=first_auto):
        with pytest.raises(RuntimeError, match=r"profile 'one' is already active"):
            with profile(socket_dir, "two", auto=second_auto):
                pass
    assert active_profiler() is None and patches.current_owner() is None
    assert [h["run_name"] for h in fake_daemon.of_type("hello")] == ["one"]


def test_after_exit_a_new_profile_may_start_but_not_the_same_one_again(socket_dir, make_daemon):
    daemon = make_daemon()
    first = profile(socket_dir, "first")
    with first:
        train(steps=1)
    with profile(socket_dir, "second") as second:
        train(steps=2)
    with pytest.raises(RuntimeError, match=r"'first' was already used once"):
        with first:
            pass
    assert active_profiler() is None and patches.current_owner() is None
    by_run = [[s["run_key"] for s in daemon.steps].count(p.run_key) for p in (first, second)]
    assert by_run == [1, 2]
