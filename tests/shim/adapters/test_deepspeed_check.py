"""gpuprof.wrap_deepspeed_engine refuses what is not a DeepSpeed engine
before any run is created; anything with the engine's interface is one
(DeepSpeed itself is not needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import gpuprof
from gpuprof_shim.session import active_profiler

EXPECTS = (
    "gpuprof.wrap_deepspeed_engine expects a DeepSpeed engine (the first value "
    "deepspeed.initialize returns): callable (the forward), with step() and global_steps "
    "or is_gradient_accumulation_boundary(); got "
)


class DuckEngine(nn.Module):
    """The engine's interface and nothing of DeepSpeed: a step per step()."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.global_steps = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).sum()

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self) -> None:
        self.opt.step()
        self.opt.zero_grad()
        self.global_steps += 1


def wrap(engine: Any, socket_dir: Path) -> Any:
    return gpuprof.wrap_deepspeed_engine(
        engine, "ds", socket_dir=socket_dir, autostart=False, print_summary=False
    )


def test_a_non_engine_is_refused_before_any_run(socket_dir, fake_daemon):
    with pytest.raises(TypeError) as err:
        wrap(object(), socket_dir)
    assert str(err.value).startswith(EXPECTS + "object <object object at 0x")
    assert str(err.value).endswith(
        ", which lacks __call__, step() and global_steps/is_gradient_accumulation_boundary()"
    )
    with pytest.raises(TypeError) as err:
        wrap(nn.Linear(2, 2), socket_dir)  # the model, not the engine
    assert str(err.value) == (
        EXPECTS + "Linear Linear(in_features=2, out_features=2, bias=True), which lacks "
        "step() and global_steps/is_gradient_accumulation_boundary()"
    )
    assert active_profiler() is None
    assert fake_daemon.of_type("hello") == []  # no run was created


def test_anything_with_the_engines_interface_is_profiled(socket_dir, fake_daemon):
    with wrap(DuckEngine(), socket_dir) as engine:
        for _ in range(3):
            engine.backward(engine(torch.randn(2, 4)))
            engine.step()
    assert [s["i"] for s in fake_daemon.steps] == [0, 1, 2]
    (bye,) = fake_daemon.of_type("bye")
    assert bye["status"] == "finished"
