"""Suite-wide checks. The leak check runs after every test: gpuprof must
leave torch exactly as it found it (patched methods restored, global
optimizer hooks removed, no global module hooks, every forward detector's
root hooks removed). torch is only inspected if a test imported it."""

from __future__ import annotations

import sys

import pytest


def torch_leaks() -> list[str]:
    """What gpuprof (or anyone) left patched in torch; empty if clean."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    import torch.optim.optimizer as optim_mod

    leaks = []
    for cls, name in (
        (torch.nn.Module, "train"),
        (torch.utils.data.DataLoader, "__iter__"),
        (torch.utils.data.dataloader._BaseDataLoaderIter, "__next__"),
    ):
        if hasattr(vars(cls)[name], "__wrapped__"):
            leaks.append(f"{cls.__name__}.{name} is {vars(cls)[name]!r}")
    if vars(torch.nn.Module)["__call__"] is not torch.nn.Module._wrapped_call_impl:
        leaks.append(f"torch.nn.Module.__call__ is {torch.nn.Module.__call__!r}")
    backward = vars(torch.Tensor)["backward"]
    if (backward.__module__, backward.__qualname__) != ("torch._tensor", "Tensor.backward"):
        leaks.append(f"torch.Tensor.backward is {backward!r}")
    ag = torch.autograd.backward
    if (ag.__module__, ag.__qualname__) != ("torch.autograd", "backward"):
        leaks.append(f"torch.autograd.backward is {ag!r}")
    scaler_step = vars(torch.amp.GradScaler)["step"]
    if scaler_step.__qualname__ != "GradScaler.step" or hasattr(scaler_step, "__wrapped__"):
        leaks.append(f"torch.amp.GradScaler.step is {scaler_step!r}")
    if optim_mod._global_optimizer_pre_hooks:
        leaks.append(f"optimizer pre hooks left: {dict(optim_mod._global_optimizer_pre_hooks)}")
    if optim_mod._global_optimizer_post_hooks:
        leaks.append(f"optimizer post hooks left: {dict(optim_mod._global_optimizer_post_hooks)}")
    if torch.nn.modules.module._has_any_global_hook():
        leaks.append("a global nn.Module hook is registered")
    forwards = sys.modules.get("gpuprof_shim.forwards")
    if forwards is not None and forwards.live_detectors():
        # their root hooks / compiled-call wrappers were never removed
        leaks.append(f"forward detectors left installed: {forwards.live_detectors()}")
    return leaks


@pytest.fixture(autouse=True)
def _no_torch_patch_leaks():
    yield
    leaks = torch_leaks()
    assert not leaks, f"torch left patched: {leaks}"


def pytest_report_header(config: pytest.Config) -> str:
    """Say up front whether the storage tests also run on Postgres."""
    from tests.backends import PG_URL, postgres_missing

    reason = postgres_missing()
    if reason:
        return f"gpuprof storage tests: SQLite only; Postgres cases skipped: {reason}"
    return f"gpuprof storage tests: SQLite and Postgres ({PG_URL})"
