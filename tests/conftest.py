"""Suite-wide checks. The leak check runs after every test: gpuprof must
leave torch exactly as it found it (patched methods restored: auto mode's,
the trace windows' profiler guard, DDP's comm-hook registration; global
optimizer hooks removed, no global module hooks, every forward detector's
root hooks removed, no patch set or patch owner left). torch is only
inspected if a test imported it."""

from __future__ import annotations

import os
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
    legacy = torch.autograd.profiler
    for cls, name in (
        (legacy.profile, "_prepare_trace"),
        (legacy.profile, "__exit__"),
        (legacy.record_function, "__enter__"),
        (legacy.record_function, "__exit__"),
    ):
        if _ours(vars(cls).get(name)):
            leaks.append(f"{cls.__name__}.{name} is gpuprof's {vars(cls)[name]!r}")
    ddp_mod = sys.modules.get("torch.nn.parallel.distributed")
    ddp_cls = getattr(ddp_mod, "DistributedDataParallel", None)
    for name in ("register_comm_hook", "_register_builtin_comm_hook"):
        if ddp_cls is not None and _ours(vars(ddp_cls).get(name)):
            leaks.append(f"DistributedDataParallel.{name} is gpuprof's {vars(ddp_cls)[name]!r}")
    patches = sys.modules.get("gpuprof_shim.patches")
    if patches is not None:
        if patches.live_patches():
            leaks.append(f"gpuprof patches left: {patches.live_patches()}")
        if patches.current_owner() is not None:
            leaks.append(f"a patch owner is left installed: {patches.current_owner()!r}")
    forwards = sys.modules.get("gpuprof_shim.auto.forwards")
    if forwards is not None and forwards.live_detectors():
        # their root hooks / compiled-call wrappers were never removed
        leaks.append(f"forward detectors left installed: {forwards.live_detectors()}")
    return leaks


def _ours(fn: object) -> bool:
    """True if *fn* is a function gpuprof's shim made (a wrapper left behind)."""
    return str(getattr(fn, "__module__", "")).startswith("gpuprof_shim")


@pytest.fixture(autouse=True)
def _no_torch_patch_leaks():
    yield
    leaks = torch_leaks()
    assert not leaks, f"torch left patched: {leaks}"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--hog",
        action="store_true",
        default=False,
        help="run the tests beside a competing CPU load: one busy process per core "
        "for the whole session (a shared, busy host)",
    )


@pytest.fixture(scope="session", autouse=True)
def _session_hog(request: pytest.FixtureRequest):
    """With ``--hog``: one busy process per core from the first test to the last."""
    if not request.config.getoption("hog"):
        yield None
        return
    from tests.integration.hog import Hog

    with Hog() as hog:
        yield hog


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say up front whether the storage tests also run on Postgres, and
    whether a CPU hog competes with the tests."""
    from tests.backends import PG_URL, postgres_missing

    reason = postgres_missing()
    lines = [
        f"gpuprof storage tests: SQLite only; Postgres cases skipped: {reason}"
        if reason
        else f"gpuprof storage tests: SQLite and Postgres ({PG_URL})"
    ]
    if config.getoption("hog"):
        lines.append(f"--hog: {os.cpu_count()} busy processes compete for the CPU")
    return lines
