"""Auto mode with forked DataLoader workers (real torch on the CPU, real
ZeroMQ): no use of the training process's ZeroMQ in a worker (a worker's
stack sampler makes its own), nothing counted twice, no deadlock, and a
quick process exit."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
import zmq
from torch import nn
from torch.utils.data import DataLoader, Dataset

import gpuprof
from gpuprof_shim import session
from gpuprof_shim.session import active_profiler

from .training import MLP

pytestmark = pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")

#: ZeroMQ calls made in this process since :func:`_count_zmq_calls` ran (a worker's).
_zmq_calls = [0]


def _count_zmq_calls(worker_id: int) -> None:
    """``worker_init_fn``: in the worker only, count every ZeroMQ socket made
    or used, so the test can assert there were none."""

    def counting(name: str, orig):
        def call(*args, **kwargs):
            _zmq_calls[0] += 1
            return orig(*args, **kwargs)

        return call

    for cls, names in (
        (zmq.Context, ("socket", "term", "destroy")),
        (zmq.Socket, ("send", "recv", "poll", "connect", "close")),
    ):
        for name in names:
            setattr(cls, name, counting(name, getattr(cls, name)))


class ProbeDataset(Dataset):
    """Each item runs an ``nn.Linear`` transform (parameters, grad enabled)
    inside the worker and pokes the inherited shim's send path; it returns
    ``[pid, sent, dropped, has_context, zmq_calls]`` as seen in the worker."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.transform = nn.Linear(8, 8)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        prof = active_profiler()
        assert prof is not None and prof.sender is not None
        sender = prof.sender
        sent = sender.send({"v": 1, "type": "mark", "run_key": prof.run_key, "name": "w"})
        sender.connect()  # must refuse in a fork child, not build a context
        x = self.transform(torch.randn(8))
        seen = [os.getpid(), int(sent), sender.dropped, int(sender.context is not None)]
        return x.detach(), torch.tensor([*seen, _zmq_calls[0]])


def _loader(n: int, **kw) -> DataLoader:
    return DataLoader(
        ProbeDataset(n),
        batch_size=2,
        num_workers=2,
        multiprocessing_context="fork",
        worker_init_fn=_count_zmq_calls,
        **kw,
    )


def _train_epoch(loader, model, opt, seen: list[list[int]]) -> None:
    for x, probe in loader:
        seen += probe.tolist()
        model(x).sum().backward()
        opt.step()
        opt.zero_grad()


def profile(socket_dir: Path, name: str = "fork", stacks: bool = False):
    """The profile these tests run: without the workers' stack samplers
    unless *stacks* (those make a socket of their own in each worker, which
    :func:`test_worker_samplers_use_their_own_socket_never_the_parents` checks)."""
    return gpuprof.profile(
        name, socket_dir=socket_dir, autostart=False, print_summary=False, stacks=stacks
    )


def _assert_exact_steps(fake_daemon, prof, n: int, pools: list[set[int]]) -> None:
    """*n* steps and one ``workers`` event per worker pool in *pools* (the
    pids the workers saw themselves as), from the parent only."""
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == list(range(n))
    assert [s["micro"] for s in steps] == [1] * n
    others = [m for m in fake_daemon.data if m["type"] not in ("step", "loaders", "stacks")]
    assert [m["type"] for m in others] == ["workers"] * len(pools)  # no worker's mark
    assert [m["loader_seq"] for m in others] == list(range(len(pools)))
    assert [{w["pid"] for w in m["workers"]} for m in others] == pools
    for m in others:
        assert sorted(w["worker_id"] for w in m["workers"]) == list(range(len(m["workers"])))
    (bye,) = fake_daemon.of_type("bye")
    loaders = [m for m in fake_daemon.data if m["type"] == "loaders"]
    assert len(loaders) <= 1  # a DataLoader's settings are reported once
    sent = n + len(pools) + len(loaders) + fake_daemon.stacks_sent()
    assert (bye["sent"], bye["dropped"]) == (sent, 0)
    assert (prof.sender.sent, prof.sender.dropped) == (sent, 0)


def _assert_workers_used_no_zmq(seen: list[list[int]], items: int) -> set[int]:
    assert len(seen) == items
    pids = {row[0] for row in seen}
    assert os.getpid() not in pids and len(pids) == 2  # really two forked workers
    for _pid, sent, dropped, has_context, zmq_calls in seen:
        assert (sent, has_context, zmq_calls) == (0, 0, 0)
        assert dropped >= 1  # the refused send is counted, in the worker only
    return pids


def test_forked_workers_never_touch_zeromq_and_steps_are_exact(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[list[int]] = []
    with profile(socket_dir) as prof:
        _train_epoch(_loader(12), model, opt, seen)
    pids = _assert_workers_used_no_zmq(seen, 12)
    _assert_exact_steps(fake_daemon, prof, 6, [pids])


def test_worker_samplers_use_their_own_socket_never_the_parents(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[list[int]] = []
    with profile(socket_dir, stacks=True) as prof:
        _train_epoch(_loader(12), model, opt, seen)
    for _pid, sent, dropped, has_context, zmq_calls in seen:
        # the inherited sender refuses (counted in the worker); the worker's
        # sampler made a context and socket of its own (socket, connect, ...)
        assert (sent, has_context) == (0, 0) and dropped >= 1
        assert zmq_calls >= 2
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == list(range(6))
    assert not [m for m in fake_daemon.data if m["type"] == "mark"]  # no worker's mark
    # what the workers' samplers sent (at their exit) is theirs: source loader
    loader = [m for m in fake_daemon.data if m["type"] == "stacks" and m["source"] == "loader"]
    assert all(m["run_key"] == prof.run_key for m in loader)


def test_persistent_workers_across_epochs(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = _loader(8, persistent_workers=True)
    per_epoch: list[list[list[int]]] = []
    with profile(socket_dir) as prof:
        for _epoch in range(3):
            per_epoch.append([])
            _train_epoch(loader, model, opt, per_epoch[-1])
    pids = [_assert_workers_used_no_zmq(seen, 8) for seen in per_epoch]
    assert pids[0] == pids[1] == pids[2]  # the same workers served every epoch
    _assert_exact_steps(fake_daemon, prof, 12, [pids[0]])  # one pool, reported once
    del loader


def test_profile_exit_with_a_live_persistent_worker_iterator(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = _loader(8, persistent_workers=True, prefetch_factor=1)
    seen: list[list[int]] = []
    with profile(socket_dir) as prof:
        it = iter(loader)
        for _ in range(2):
            x, probe = next(it)
            seen += probe.tolist()
            model(x).sum().backward()
            opt.step()
    # the iterator and its workers outlive the profile, and still work
    for x, probe in it:
        seen += probe.tolist()
        model(x).sum().backward()
        opt.step()
    pids = _assert_workers_used_no_zmq(seen, 8)
    _assert_exact_steps(fake_daemon, prof, 2, [pids])
    del it, loader


def test_fork_child_never_collects_the_parents_socket(socket_dir, fake_daemon, monkeypatch):
    """The parent's socket and context, set aside in the child by the at-fork
    hook, are never garbage-collected there: their ``__del__`` would warn
    "Unclosed socket" (an error under ``-W error``) and try to close them."""
    unraisable: list[str] = []
    prof = profile(socket_dir)
    with prof:
        r, w = os.pipe()
        with warnings.catch_warnings():
            warnings.simplefilter("error", ResourceWarning)
            monkeypatch.setattr(sys, "unraisablehook", lambda u: unraisable.append(repr(u)))
            pid = os.fork()  # the at-fork hooks run in the child with these in place
            monkeypatch.undo()
        if pid == 0:  # the child: report what it saw, then leave at once
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", ResourceWarning)
                    ok = prof.sender.send({"v": 1, "type": "mark"})
                    gc.collect()
                os.write(w, json.dumps([ok, prof.sender.dropped, unraisable]).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            child = json.loads(f.read())
        os.waitpid(pid, 0)
        model = MLP()
        model(torch.randn(2, 8)).sum().backward()
        torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert child == [False, 1, []]
    assert unraisable == []
    _assert_exact_steps(fake_daemon, prof, 1, [])


def test_fork_child_leaving_the_block_does_not_end_the_parents_run(socket_dir, fake_daemon, capfd):
    """A child forked inside the block that leaves it (``sys.exit()`` in an
    ``os.fork()`` child) must not send the parent's ``bye`` (the daemon would
    end the run under the parent) nor print a summary."""
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuprof.profile("parent", socket_dir=socket_dir, autostart=False) as prof:
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child leaves the block as SystemExit(0) would, then exits
            try:
                with contextlib.redirect_stdout(io.StringIO()) as out:
                    prof.__exit__(SystemExit, SystemExit(0), None)
                os.write(w, json.dumps([prof.summary, out.getvalue()]).encode())
            finally:
                os._exit(0)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            child = json.loads(f.read())
        os.waitpid(pid, 0)
        assert fake_daemon.of_type("bye") == []
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
    assert child == [None, ""]
    _assert_exact_steps(fake_daemon, prof, 2, [])
    assert capfd.readouterr().out.count("gpuprof · parent") == 1  # the parent's summary only


def test_fork_child_gets_a_fresh_session_lock():
    """A thread of the parent may hold the session's lock when a worker
    forks; the child must not inherit it locked (leaving a block takes it)."""
    with session._active_lock:  # as another thread entering a profile would
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.write(w, b"1" if session._active_lock.acquire(timeout=2) else b"0")
            finally:
                os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        got = f.read()
    os.waitpid(pid, 0)
    assert got == b"1"


# --- process exit, measured in real subprocesses ------------------------------

EXIT_SCRIPT = """
import json, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

class DS(Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.randn(8), torch.randint(0, 3, ())

def train():
    loader = DataLoader(DS(), batch_size=4, num_workers=2, multiprocessing_context="fork",
                        persistent_workers=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for _epoch in range(2):
        for x, y in loader:
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            steps += 1
    it = iter(loader)
    next(it)  # a live iterator (busy persistent workers) left at exit
    return it, steps

import threading
threads = set(threading.enumerate())
exit_s = 0.0
if sys.argv[1] == "shim":
    import gpuprof
    with gpuprof.profile("exit", socket_dir=sys.argv[2], autostart=False, print_summary=False) as p:
        it, steps = train()
        t = time.monotonic()
    exit_s = time.monotonic() - t
    assert p.sender.context is None  # the ZeroMQ context is terminated
else:
    it, steps = train()
left = [t.name for t in set(threading.enumerate()) - threads if not t.daemon]
out = {"steps": steps, "profile_exit_s": exit_s, "threads_left": left}
print(json.dumps({**out, "end": time.monotonic()}), flush=True)
"""


def _run_exit_script(mode: str, socket_dir: Path) -> dict:
    """Run the script; ``exit_s`` is its last line to the process being gone
    (CLOCK_MONOTONIC is one clock for every process on the machine)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", EXIT_SCRIPT, mode, str(socket_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"{mode} script hung; stderr:\n{err.decode()[-3000:]}")
    gone = time.monotonic()
    assert proc.returncode == 0, err.decode()[-3000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    result["exit_s"] = gone - result["end"]
    return result


def test_process_exit_with_live_workers_leaves_no_thread_and_loses_nothing(socket_dir, fake_daemon):
    """Exit with persistent workers still alive, with and without gpuprof:
    nothing of gpuprof's is left for the interpreter to join, and every step
    arrives. (How long exit takes depends on the host's load; the figures
    print with ``-s``, the test asserts only what holds under any load.)"""
    plain, shim = [], []
    for _ in range(2):
        plain.append(_run_exit_script("plain", socket_dir))
        shim.append(_run_exit_script("shim", socket_dir))
    plain_s = min(r["exit_s"] for r in plain)
    shim_s = min(r["profile_exit_s"] + r["exit_s"] for r in shim)
    print(
        "\nexit with persistent workers alive (ms): plain "
        f"{[round(r['exit_s'] * 1e3) for r in plain]}; with gpuprof, profile() exit + process "
        f"exit {[(round(r['profile_exit_s'] * 1e3), round(r['exit_s'] * 1e3)) for r in shim]}; "
        f"added (fastest of each) {(shim_s - plain_s) * 1e3:.0f} ms"
    )
    assert [r["steps"] for r in plain + shim] == [8] * 4
    # no thread left behind that the interpreter would have to join at exit
    assert [r["threads_left"] for r in plain + shim] == [[]] * 4
    byes = fake_daemon.of_type("bye")
    # 8 steps + one workers and one loaders event: the persistent pool and its
    # settings are reported once, not per epoch
    assert [
        (b["sent"] - fake_daemon.stacks_sent(b["run_key"]), b["dropped"], b["status"]) for b in byes
    ] == [(10, 0, "finished")] * 2
    for bye in byes:
        steps = [s["i"] for s in fake_daemon.steps if s["run_key"] == bye["run_key"]]
        assert steps == list(range(8))
