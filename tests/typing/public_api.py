"""Checked by mypy (scripts/test.sh), never run: what an editor sees of
gpuprof's public API. Each ``type: ignore`` marks a call that must be an
error (mypy's ``warn_unused_ignores`` fails the check if it is not). torch's
types are not followed here (too slow), so ``dtype`` accepts anything to this
check; an editor with torch installed reads ``torch.dtype | str | None``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gpuprof


def typed_usage(loader: list[int]) -> float | None:
    arch = gpuprof.TransformerArch(layers=2, d_model=64, heads=4, seq_len=32, vocab=100)
    prof: gpuprof.Profiler = gpuprof.profile(
        "run",
        arch=arch,
        tokens_per_step=256,
        samples_per_step=8,
        dtype="bf16",
        step_source="external",
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


def adapters(engine: Any) -> list[gpuprof.Profiler | None]:
    lightning = gpuprof.LightningCallback("fit", flops_per_step=1e12)
    hf = gpuprof.HFTrainerCallback("train", dtype="bf16")
    with hf:
        pass
    wrapped = gpuprof.wrap_deepspeed_engine(engine, "ds")
    return [lightning.profiler, hf.profiler, wrapped.profiler]


def misuse() -> None:
    gpuprof.profile("run", trace_evry_n_steps=5)  # type: ignore[call-arg]
    gpuprof.profile("run", wandb="yes")  # type: ignore[arg-type]
    gpuprof.profile("run", trace_range=(1, 2, 3))  # type: ignore[arg-type]
    gpuprof.profile(run_name=3)  # type: ignore[arg-type]
    gpuprof.profile("run", webhook_format="slak")  # type: ignore[arg-type]
    gpuprof.profile("run", step_source="optimiser")  # type: ignore[arg-type]
    gpuprof.LightningCallback(3)  # type: ignore[arg-type]
    gpuprof.HFTrainerCallback(run_name=None)  # type: ignore[arg-type]
    gpuprof.wrap_deepspeed_engine(object(), 3)  # type: ignore[arg-type]
