"""A tiny real training loop (CPU torch) for the shim tests."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Two Linear layers with a nested Sequential inside: submodule calls
    must not look like new forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 16)))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def train(
    steps: int,
    accum: int = 1,
    *,
    use_loss_module: bool = True,
    on_step: object = None,
) -> nn.Module:
    """Run *steps* optimizer steps of *accum* micro-batches each; the loss is a
    module call after the model (``nn.CrossEntropyLoss``) unless disabled.
    ``on_step(i)`` runs after each optimizer step (it may raise)."""
    torch.manual_seed(0)
    model = MLP()
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        for _ in range(accum):
            x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
            out = model(x)
            loss = loss_fn(out, y) if use_loss_module else out.square().mean()
            (loss / accum).backward()
        opt.step()
        opt.zero_grad()
        if callable(on_step):
            on_step(i)
    return model
