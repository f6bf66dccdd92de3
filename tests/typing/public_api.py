"""Checked by mypy (scripts/test.sh), never run: what an editor sees of
gpuprof's public API. Each ``type: ignore`` marks a call that must be an
error (mypy's ``warn_unused_ignores`` fails the check if it is not)."""

from __future__ import annotations

from pathlib import Path

import gpuprof


def typed_usage(loader: list[int]) -> float | None:
    arch = gpuprof.TransformerArch(layers=2, d_model=64, heads=4, seq_len=32, vocab=100)
    prof: gpuprof.Profiler = gpuprof.profile(
        "run",
        arch=arch,
        tokens_per_step=256,
        trace_every_n_steps=100,
        trace_range=(10, 20),
        db=Path("gpuprof.db"),
        wandb=True,
        webhook="https://hooks.slack.com/services/T/B/X",
        webhook_format="json",
        dashboard=False,
        server="https://gpuprof.example:8000",
    )
    with prof as p:
        for i, _batch in enumerate(p.wrap_dataloader(loader)):
            with p.step(i) as s, s.phase("forward"):
                pass
    summary = prof.summary
    return summary["median_step_ms"] if summary else None


def misuse() -> None:
    gpuprof.profile("run", trace_evry_n_steps=5)  # type: ignore[call-arg]
    gpuprof.profile("run", wandb="yes")  # type: ignore[arg-type]
    gpuprof.profile("run", trace_range=(1, 2, 3))  # type: ignore[arg-type]
    gpuprof.profile(run_name=3)  # type: ignore[arg-type]
