"""gpuprof.wrap_deepspeed_engine with a real DeepSpeed engine on the CPU
(``deepspeed.initialize`` on a tiny model, gloo, world size 1), against
the fake daemon: exact steps, micro-batches and skipped updates."""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import gpuprof

deepspeed = pytest.importorskip("deepspeed")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x).float().square().mean()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def distributed() -> Iterator[None]:
    """World size 1 over gloo, as the launcher would set it up; torn down
    after the module so no other test sees an initialized process group.

    DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op at its
    first init (about 50 s here, then cached); with one rank there is nothing
    to reduce, so the test replaces its builder with "not available", which
    DeepSpeed handles as on a machine without a compiler.
    """
    mp = pytest.MonkeyPatch()
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "DS_ACCELERATOR": "cpu",
    }
    for key, value in env.items():
        mp.setenv(key, value)
    import deepspeed.comm.comm  # noqa: F401 - loads deepspeed.comm.torch

    mp.setattr(sys.modules["deepspeed.comm.torch"], "build_shm_op", lambda: None)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    mp.setattr(sys.modules["deepspeed.comm.comm"], "cdb", None)
    mp.undo()


def engine(accumulation: int, **config: Any) -> Any:
    torch.manual_seed(0)
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": accumulation,
        "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
        "steps_per_print": 10**9,
        **config,
    }
    eng, *_ = deepspeed.initialize(model=Net(), config=cfg)
    return eng


def wrap(eng: Any, socket_dir: Path, name: str = "ds") -> Any:
    return gpuprof.wrap_deepspeed_engine(
        eng, run_name=name, socket_dir=socket_dir, autostart=False, print_summary=False
    )


def train(eng: Any, micro_batches: int, poison: set[int] = frozenset()) -> None:
    """The DeepSpeed loop: forward, backward and step() every micro-batch;
    micro-batches in *poison* get an inf input (inf/NaN gradients)."""
    dtype = next(eng.parameters()).dtype
    for i in range(micro_batches):
        x = torch.randn(4, 8, dtype=dtype)
        if i in poison:
            x[0, 0] = float("inf")
        loss = eng(x)
        eng.backward(loss)
        eng.step()


@pytest.mark.usefixtures("distributed")
@pytest.mark.parametrize(
    ("accumulation", "micro_batches", "micro"), [(2, 6, [2, 2, 2]), (3, 3, [3])]
)
def test_a_step_is_an_accumulation_boundary(
    socket_dir, fake_daemon, accumulation, micro_batches, micro
):
    eng = wrap(engine(accumulation), socket_dir)
    train(eng, micro_batches)
    eng.destroy()
    assert eng.global_steps == len(micro)
    steps = fake_daemon.steps
    assert [s["micro"] for s in steps] == micro
    for s in steps:
        assert "skipped" not in s
        assert [(o["name"], o["updates"], o["skipped"]) for o in s["optimizers"]] == [
            ("SGD#0", 1, 0)
        ]
        assert s["phases"]["forward"] > 0 and s["phases"]["backward"] > 0
    (bye,) = fake_daemon.of_type("bye")
    assert (bye["status"], bye["sent"]) == ("finished", len(micro) + fake_daemon.stacks_sent())


@pytest.mark.usefixtures("distributed")
def test_an_unfinished_window_is_not_a_step(socket_dir, fake_daemon):
    eng = wrap(engine(2), socket_dir)
    train(eng, 5)  # boundaries after micro-batches 2 and 4; the 5th is left over
    eng.close()
    steps = fake_daemon.steps
    assert [s["micro"] for s in steps] == [2, 2]
    assert [sum(o["updates"] for o in s.get("optimizers", [])) for s in steps] == [1, 1]
    assert eng.profiler.machine.unfinished_micro == 1


@pytest.mark.usefixtures("distributed")
def test_skipped_steps_come_from_the_engine_counter(socket_dir, fake_daemon):
    """DeepSpeed counts an update skipped when its optimizer reports
    ``overflow`` (its fp16 optimizer, which the CPU accelerator does not
    support): the test sets that flag on the real engine's optimizer for the
    second window, so the real ``engine.step()`` takes its overflow path."""
    eng = wrap(engine(2), socket_dir)
    for window in range(3):
        eng.optimizer.overflow = window == 1
        train(eng, 2)
    eng.close()
    assert eng.skipped_steps == 1
    assert [s.get("skipped", False) for s in fake_daemon.steps] == [False, True, False]
    assert [s["micro"] for s in fake_daemon.steps] == [2, 2, 2]


@pytest.mark.usefixtures("distributed")
def test_grad_scaler_skip_under_torch_autocast_is_skipped(socket_dir, fake_daemon):
    """``torch_autocast`` fp16 without ZeRO steps through a torch
    ``GradScaler``; DeepSpeed's own ``skipped_steps`` misses its skips (the
    torch optimizer has no ``overflow``), gpuprof's GradScaler patch sees them."""
    eng = wrap(engine(1, torch_autocast={"enabled": True, "dtype": "torch.float16"}), socket_dir)
    train(eng, 3, poison={1})
    eng.close()
    assert eng.skipped_steps == 0
    steps = fake_daemon.steps
    assert [s.get("skipped", False) for s in steps] == [False, True, False]
    assert [(o["updates"], o["skipped"]) for s in steps for o in s["optimizers"]] == [
        (1, 0),
        (0, 1),
        (1, 0),
    ]


@pytest.mark.usefixtures("distributed")
def test_proxy_passes_everything_else_to_the_engine(socket_dir, fake_daemon):
    real = engine(1)
    eng = wrap(real, socket_dir)
    assert eng.__wrapped__ is real and isinstance(eng.__wrapped__, deepspeed.DeepSpeedEngine)
    assert eng.gradient_accumulation_steps() == 1
    assert eng.module is real.module
    eng.custom_flag = 3
    assert real.custom_flag == 3
    assert eng.profiler is not None
    eng.close()
    eng.close()  # twice: nothing more
    assert [m["type"] for m in fake_daemon.control] == ["hello", "bye"]
    train(eng, 1)  # the engine still trains after close; nothing is sent
    assert fake_daemon.steps == []


@pytest.mark.usefixtures("distributed")
def test_loop_raising_inside_with_marks_the_run_failed(socket_dir, fake_daemon):
    eng = wrap(engine(1), socket_dir)
    with pytest.raises(RuntimeError, match="loss went bad"):
        with eng:
            train(eng, 2)
            raise RuntimeError("loss went bad")
    (bye,) = fake_daemon.of_type("bye")
    assert (bye["status"], bye["error"]) == ("failed", "RuntimeError: loss went bad")
    assert len(fake_daemon.steps) == 2
