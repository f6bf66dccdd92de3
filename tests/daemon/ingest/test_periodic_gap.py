"""A real CPU loop that checkpoints every 20th step, against a real gpuprofd:
the finding says "every 20 steps" and names torch.save and the line calling it."""

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
        # 300 steps: 14 saves with a step after them, so the period also
        # shows on a busy host (steps.VARIANCE_PERIOD_MIN_REPEATS_CONTENDED)
        for i in range(300):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
            if i % 20 == 19:
                _save_checkpoint(blob, tmp_path / "ckpt.pt")
    summary = prof.summary
    assert summary is not None and summary["steps"] >= 290, summary
    (gap,) = [i for i in summary["insights"] if i["rule"] == "dataloader_stall"]
    assert "every 20 steps" in gap["title"], gap
    assert gap["evidence"]["every_steps"] == 20
    # the pause is named: torch.save, at the line of this file that calls it
    # (beside open's truncation and os.fsync: their shares depend on the disk)
    text = Path(__file__).read_text().splitlines()
    line = next(n for n, t in enumerate(text, 1) if "torch.save(state, f)" in t)
    assert (
        f"torch.save, called from test_periodic_gap.py:{line} (_save_checkpoint)" in (gap["detail"])
    ), gap
    named = {(f["path"], f["line"], f["call"]) for f in gap["evidence"]["frames"]}
    assert (__file__, line, "torch.save") in named, gap
    assert {f["function"] for f in gap["evidence"]["frames"]} == {"_save_checkpoint"}, gap
    # gpuprofctl insights prints it (the summary with each finding's detail)
    from gpuprof.summary import format_summary

    shown = " ".join(format_summary(summary, details=True).split())
    assert f"torch.save, called from test_periodic_gap.py:{line} (_save_checkpoint)" in shown
