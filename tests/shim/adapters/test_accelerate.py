"""HF accelerate needs no adapter: under ``accelerator.accumulate(model)`` its
wrapped optimizer's ``step()`` is called every micro-batch but calls the
real ``optimizer.step()`` only when gradients sync, so auto mode counts real
updates. Real accelerate on the CPU, against the fake daemon."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import gpuprof
from gpuprof_shim.session import Profiler

accelerate = pytest.importorskip("accelerate")


def profile(socket_dir: Path) -> Profiler:
    return gpuprof.profile("acc", socket_dir=socket_dir, autostart=False, print_summary=False)


def run(batches: int, accumulation: int) -> int:
    """A standard accelerate loop; returns how many real updates it made."""
    torch.manual_seed(0)
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(
        torch.randn(batches * 4, 8), torch.randint(0, 2, (batches * 4,))
    )
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    updates = 0
    for x, y in loader:
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()  # every micro-batch; a real update only on sync
            updates += accelerator.sync_gradients
            opt.zero_grad()
    accelerator.end_training()
    return updates


@pytest.mark.parametrize(
    ("batches", "accumulation", "micro"),
    [(6, 3, [3, 3]), (5, 2, [2, 2, 1]), (4, 1, [1, 1, 1, 1])],
)
def test_accumulate_counts_real_updates(socket_dir, fake_daemon, batches, accumulation, micro):
    with profile(socket_dir):
        updates = run(batches, accumulation)
    steps = fake_daemon.steps
    # accelerate syncs at the end of the loader too: a short last window steps
    assert updates == len(micro)
    assert [s["micro"] for s in steps] == micro
    for s in steps:
        assert [(o["name"], o["updates"], o["skipped"]) for o in s["optimizers"]] == [
            ("SGD#0", 1, 0)
        ]
        assert s["phases"]["forward"] > 0 and s["phases"]["backward"] > 0
