"""A real CPU loop that checkpoints every 20th step, against a real gpuprofd."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def _save_checkpoint(state: dict, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def test_a_checkpoint_every_20_steps_is_named_a_periodic_gap(
    daemons, sock_dir: Path, tmp_path: Path
) -> None:
    import gpuprof

    db = tmp_path / "g.db"
    daemons.start_ready(sock_dir, db)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(8, 64)
    blob = {"model": model.state_dict(), "pad": torch.zeros(8 * 1024 * 1024)}  # 32 MB
    with gpuprof.profile(
        "ckpt", socket_dir=sock_dir, db=db, autostart=False, print_summary=False
    ) as prof:
        for i in range(200):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if i % 20 == 19:
                _save_checkpoint(blob, tmp_path / "ckpt.pt")
    summary = prof.summary
    assert summary is not None and summary["steps"] >= 190, summary
    (gap,) = [i for i in summary["insights"] if i["rule"] == "dataloader_stall"]
    assert "every 20 steps" in gap["title"], gap
    assert gap["evidence"]["every_steps"] == 20
