"""Auto mode with the training loop in a non-main thread."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import torch

import gpuprof
from gpuprof_shim import patches
from gpuprof_shim.session import active_profiler

from .training import MLP, train


class Trainer:
    """One model and optimizer, trained a few steps at a time from any thread."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = MLP()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            self.model(torch.randn(4, 8)).square().mean().backward()
            self.opt.step()
            self.opt.zero_grad()


def profile(socket_dir: Path, name: str):
    return gpuprof.profile(name, socket_dir=socket_dir, autostart=False, print_summary=False)


def run_in_thread(fn: Callable[[], object]) -> object:
    """Run *fn* in a new thread, let the main thread idle until it is done
    (a handshake, not a sleep), and return its result or raise its error."""
    done = threading.Event()
    out: dict[str, object] = {}

    def target() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            out["error"] = exc
        finally:
            done.set()

    t = threading.Thread(target=target, name="trainer")
    t.start()
    while not done.wait(0.05):  # the main thread idles
        assert t.is_alive() or done.is_set()
    t.join(30)
    if "error" in out:
        raise out["error"]  # type: ignore[misc]
    return out.get("result")


def assert_steps(fake_daemon, prof, n: int, micro: int) -> None:
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == list(range(n))
    assert [s["micro"] for s in steps] == [micro] * n
    assert {s["run_key"] for s in steps} == {prof.run_key}
    for s in steps:
        assert {"forward", "backward", "optimizer"} <= set(s["phases"])
        assert all(s["phases"][k] > 0 for k in ("forward", "backward", "optimizer"))
    (bye,) = fake_daemon.of_type("bye")
    sent = n + fake_daemon.stacks_sent(prof.run_key)
    assert (bye["status"], bye["sent"], bye["dropped"]) == ("finished", sent, 0)


def test_profile_and_loop_in_a_worker_thread(socket_dir, fake_daemon):
    def work():
        with profile(socket_dir, "thread") as prof:
            train(steps=4, accum=3)
        return prof

    prof = run_in_thread(work)
    assert_steps(fake_daemon, prof, 4, 3)
    assert active_profiler() is None and patches.current_owner() is None


def test_profile_in_main_thread_loop_in_another(socket_dir, fake_daemon):
    with profile(socket_dir, "main") as prof:
        run_in_thread(lambda: train(steps=5, accum=2))
    assert_steps(fake_daemon, prof, 5, 2)


def test_loops_in_two_threads_one_after_the_other(socket_dir, fake_daemon):
    trainer = Trainer()
    with profile(socket_dir, "relay") as prof:
        run_in_thread(lambda: trainer.run(2))
        trainer.run(1)  # and the main thread between them
        run_in_thread(lambda: trainer.run(2))
    assert_steps(fake_daemon, prof, 5, 1)


def test_failure_in_the_training_thread_is_reported(socket_dir, fake_daemon):
    def boom(i: int) -> None:
        if i == 1:
            raise ValueError("boom in thread")

    def work():
        with profile(socket_dir, "thread-fail"):
            train(steps=3, on_step=boom)

    try:
        run_in_thread(work)
    except ValueError as exc:
        assert str(exc) == "boom in thread"
    else:
        raise AssertionError("the thread's error was lost")
    (bye,) = fake_daemon.of_type("bye")
    assert (bye["status"], bye["error"]) == ("failed", "ValueError: boom in thread")
    assert [s["i"] for s in fake_daemon.steps] == [0, 1]
    assert active_profiler() is None and patches.current_owner() is None
