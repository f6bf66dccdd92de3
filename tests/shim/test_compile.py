"""Auto mode around ``torch.compile``: the shim adds no graph break and no
recompile, whether it is attached before or after the first compiled call,
and each micro-batch's forward through the ``OptimizedModule`` is one forward.

Real dynamo on the CPU: the ``eager`` and ``aot_eager`` backends and inductor
(which builds C++ with the system compiler)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn
from torch._dynamo.utils import counters

import gpuprof

BACKENDS = [
    "eager",
    "aot_eager",
    pytest.param(
        "inductor",
        marks=[
            pytest.mark.skipif(shutil.which("g++") is None, reason="inductor needs g++"),
            # torch's own: inductor's first use imports torch.utils.mkldnn, which
            # warns at import time with or without gpuprof
            pytest.mark.filterwarnings(
                "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
            ),
        ],
    ),
]


class Net(nn.Module):
    """A user-defined model (dynamo traces into its forward), nested modules inside."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Sequential(nn.ReLU(), nn.Sequential(nn.Linear(16, 4)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


@pytest.fixture
def dynamo() -> Iterator[None]:
    """Fresh dynamo caches and counters; a recompile raises instead of passing quietly."""
    torch._dynamo.reset()
    counters.clear()
    old = torch._dynamo.config.error_on_recompile
    torch._dynamo.config.error_on_recompile = True
    yield
    torch._dynamo.config.error_on_recompile = old
    torch._dynamo.reset()
    counters.clear()


def _steps(compiled: nn.Module, opt: torch.optim.Optimizer, steps: int, accum: int) -> None:
    for _ in range(steps):
        for _ in range(accum):
            loss = compiled(torch.randn(4, 8)).square().mean()
            (loss / accum).backward()
        opt.step()
        opt.zero_grad()


def _dynamo_state() -> tuple[dict, int, int]:
    return (
        dict(counters["graph_break"]),
        counters["stats"]["unique_graphs"],
        counters["frames"]["total"],
    )


@pytest.mark.parametrize("attach", ["before", "after"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_model_no_graph_break_no_recompile_one_forward_per_micro_batch(
    backend: str, attach: str, socket_dir: Path, fake_daemon, dynamo, forwards: list[int]
) -> None:
    torch.manual_seed(0)
    model = Net()
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if attach == "after":
        _steps(compiled, opt, steps=1, accum=1)  # the first compiled call, unprofiled
        assert _dynamo_state() == ({}, 1, 1)
    with gpuprof.profile("compiled", socket_dir=socket_dir, autostart=False, print_summary=False):
        _steps(compiled, opt, steps=3, accum=2)
    _steps(compiled, opt, steps=1, accum=1)  # after the profile: still no recompile
    assert _dynamo_state() == ({}, 1, 1)
    assert [s["micro"] for s in fake_daemon.steps] == [2, 2, 2]
    assert len(forwards) == 6
    assert all(s["phases"]["forward"] > 0 for s in fake_daemon.steps)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compile_called_inside_the_profile(
    backend: str, socket_dir: Path, fake_daemon, dynamo, forwards: list[int]
) -> None:
    """``torch.compile(model)`` while gpuprof is attached, then used after the
    profile too: no recompile, nothing of the shim left behind."""
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuprof.profile("compiled", socket_dir=socket_dir, autostart=False, print_summary=False):
        compiled = torch.compile(model, backend=backend)
        _steps(compiled, opt, steps=2, accum=2)
    _steps(compiled, opt, steps=1, accum=1)
    assert _dynamo_state() == ({}, 1, 1)
    assert [s["micro"] for s in fake_daemon.steps] == [2, 2]
    assert len(forwards) == 4


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_compiled_submodule_inside_an_eager_model(
    backend: str, socket_dir: Path, fake_daemon, dynamo, forwards: list[int]
) -> None:
    """An eager root whose block is compiled: the root is the forward. (The
    compiled block comes first: dynamo reading ``.grad`` of a non-leaf input
    warns, with or without gpuprof.)"""
    torch.manual_seed(0)
    model = nn.Sequential(torch.compile(Net(), backend=backend), nn.Linear(4, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with gpuprof.profile("compiled", socket_dir=socket_dir, autostart=False, print_summary=False):
        _steps(model, opt, steps=3, accum=2)
    _steps(model, opt, steps=1, accum=1)
    assert _dynamo_state() == ({}, 1, 1)
    assert [s["micro"] for s in fake_daemon.steps] == [2, 2, 2]
    assert len(forwards) == 6


@pytest.mark.parametrize("attach", ["before", "after"])
def test_module_compile_in_place(
    attach: str, socket_dir: Path, fake_daemon, dynamo, forwards: list[int]
) -> None:
    """``model.compile()`` (dynamo traces ``_call_impl`` with its hooks)."""
    torch.manual_seed(0)
    model = Net()
    model.compile(backend="eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if attach == "after":
        _steps(model, opt, steps=1, accum=1)
    with gpuprof.profile("compiled", socket_dir=socket_dir, autostart=False, print_summary=False):
        _steps(model, opt, steps=3, accum=2)
    _steps(model, opt, steps=1, accum=1)
    assert _dynamo_state() == ({}, 1, 1)
    assert [s["micro"] for s in fake_daemon.steps] == [2, 2, 2]
    assert len(forwards) == 6
