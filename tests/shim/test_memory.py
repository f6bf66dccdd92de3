"""torch's CUDA allocator figures on step events. Real torch on the CPU; only
the missing GPU is mocked: ``torch.cuda.is_initialized`` says yes, and the
allocator's counters come from a fake ``memory_stats_as_nested_dict``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import gpuprof
from gpuprof.protocol import MAX_MEMORY_BYTES
from gpuprof_shim import batcher, memory

from .training import train

GIB = 2**30
#: torch.cuda's memory readers: none may run when CUDA is not in use.
READERS = (
    "memory_stats_as_nested_dict",
    "memory_stats",
    "memory_allocated",
    "memory_reserved",
    "max_memory_allocated",
    "max_memory_reserved",
    "current_device",
)


def _stats(allocated: int, reserved: int, peak: int) -> dict[str, Any]:
    """The slice of ``torch.cuda.memory_stats_as_nested_dict`` the shim reads."""
    pool = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}
    return {
        "allocated_bytes": {
            "all": {**pool, "current": allocated, "peak": peak},
            "large_pool": dict(pool),
            "small_pool": dict(pool),
        },
        "reserved_bytes": {
            "all": {**pool, "current": reserved, "peak": reserved},
            "large_pool": dict(pool),
            "small_pool": dict(pool),
        },
        "num_ooms": 0,
    }


class FakeAllocator:
    """A CUDA device whose allocator grows by 1 GiB per read: read k (from 0)
    gives allocated (k+1) GiB, reserved (k+3) GiB, peak (k+2) GiB."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, device: int = 1) -> None:
        self.devices: list[Any] = []
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: device)
        monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", self.read)

    def read(self, device: Any = None) -> dict[str, Any]:
        k = len(self.devices)
        self.devices.append(device)
        return _stats((k + 1) * GIB, (k + 3) * GIB, (k + 2) * GIB)

    @staticmethod
    def expected(k: int) -> list[int]:
        return [(k + 1) * GIB, (k + 3) * GIB, (k + 2) * GIB]


def profile(socket_dir: Path, **kw: Any) -> Any:
    return gpuprof.profile("mem", socket_dir=socket_dir, autostart=False, print_summary=False, **kw)


def test_cpu_run_sends_no_mem_and_never_reads_cuda_memory(socket_dir, fake_daemon, monkeypatch):
    called: list[str] = []
    for name in READERS:
        monkeypatch.setattr(torch.cuda, name, lambda *a, _n=name, **k: called.append(_n))
    checks: list[bool] = []
    real_check = torch.cuda.is_initialized
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: checks.append(real_check()) or False)
    with profile(socket_dir):
        train(steps=20)
    assert len(fake_daemon.steps) == 20
    assert all("mem" not in s for s in fake_daemon.steps)
    assert called == []
    # the "CUDA in use?" check ran (the path was taken), once per burst, not per step
    assert 1 <= len(checks) < 20 and checks == [False] * len(checks)


def test_each_step_carries_the_figures_read_at_its_end(socket_dir, fake_daemon, monkeypatch):
    monkeypatch.setattr(batcher, "SEND_EVERY_STEPS", 1)  # a burst per step: a read per step
    cuda = FakeAllocator(monkeypatch, device=1)
    with profile(socket_dir):
        train(steps=5)
    assert [s["mem"] for s in fake_daemon.steps] == [FakeAllocator.expected(k) for k in range(5)]
    assert cuda.devices == [1] * 5  # the current device, the one hello's UUID names


def test_one_read_per_burst_on_its_last_step(socket_dir, fake_daemon, monkeypatch):
    monkeypatch.setattr(batcher, "SEND_EVERY_NS", 10**15)  # bursts by count only
    cuda = FakeAllocator(monkeypatch)
    with profile(socket_dir):
        train(steps=2 * batcher.SEND_EVERY_STEPS + 3)
    with_mem = [(s["i"], s["mem"]) for s in fake_daemon.steps if "mem" in s]
    n = batcher.SEND_EVERY_STEPS
    # two full bursts, then the 3 left over at exit: the last of each carries a read
    assert with_mem == [
        (n - 1, FakeAllocator.expected(0)),
        (2 * n - 1, FakeAllocator.expected(1)),
        (2 * n + 2, FakeAllocator.expected(2)),
    ]
    assert len(cuda.devices) == 3


def test_manual_mode_steps_carry_the_figures_too(socket_dir, fake_daemon, monkeypatch):
    monkeypatch.setattr(batcher, "SEND_EVERY_STEPS", 1)
    FakeAllocator(monkeypatch)
    with profile(socket_dir, auto=False) as prof:
        for i in range(3):
            with prof.step(i):
                pass
    assert [s["mem"] for s in fake_daemon.steps] == [FakeAllocator.expected(k) for k in range(3)]


def test_a_failing_read_costs_the_figures_not_the_step(socket_dir, fake_daemon, monkeypatch):
    monkeypatch.setattr(batcher, "SEND_EVERY_STEPS", 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)

    def broken(device: Any = None) -> dict[str, Any]:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", broken)
    with profile(socket_dir):
        train(steps=3)
    assert len(fake_daemon.steps) == 3 and all("mem" not in s for s in fake_daemon.steps)


@pytest.mark.parametrize(
    "stats",
    [
        {},  # an allocator that keeps no stats (another backend)
        {"allocated_bytes": {"all": {"current": 1, "peak": 2}}},  # reserved missing
        _stats(1, 2, MAX_MEMORY_BYTES + 1),  # garbage the daemon would reject
        _stats(-1, 2, 3),
        _stats(1.5, 2, 3),  # type: ignore[arg-type]
    ],
)
def test_unusable_figures_are_left_out(monkeypatch, stats):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: stats)
    assert memory.cuda_memory() is None


def test_reads_nothing_without_torch_imported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: pytest.fail("torch was used"))
    monkeypatch.delitem(sys.modules, "torch")
    assert memory.cuda_memory() is None
