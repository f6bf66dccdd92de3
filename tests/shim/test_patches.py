"""The single owner of torch patches: exact restore, no second owner, and
politeness toward someone who patched on top of us."""

from __future__ import annotations

import pytest
import torch
import torch.optim.optimizer as optim_mod
from torch import nn

from gpuprof_shim import patches
from gpuprof_shim.auto.machine import StepMachine


def machine() -> StepMachine:
    return StepMachine(lambda rec: None, 0)


def originals() -> tuple:
    return (vars(nn.Module)["__call__"], vars(torch.autograd)["backward"])


def test_install_replaces_and_remove_restores_the_exact_objects():
    before, tensor_backward = originals(), vars(torch.Tensor)["backward"]
    p = patches.TorchPatches(machine())
    p.install()
    try:
        now = originals()
        assert all(a is not b for a, b in zip(before, now, strict=True))
        assert vars(torch.Tensor)["backward"] is tensor_backward  # untouched: it calls ours
        assert len(optim_mod._global_optimizer_pre_hooks) == 1
        assert len(optim_mod._global_optimizer_post_hooks) == 1
        assert patches.current_owner() is p
    finally:
        p.remove()
    assert all(a is b for a, b in zip(before, originals(), strict=True))
    assert not optim_mod._global_optimizer_pre_hooks
    assert patches.current_owner() is None
    p.remove()  # idempotent


def test_a_second_owner_is_refused_and_the_first_keeps_working():
    first, second = patches.TorchPatches(machine()), patches.TorchPatches(machine())
    first.install()
    try:
        patched = originals()
        with pytest.raises(RuntimeError, match="already patched"):
            second.install()
        assert originals() == patched  # the refused owner changed nothing
        assert patches.current_owner() is first
    finally:
        first.remove()


def test_wrappers_are_transparent_for_results_and_errors():
    p = patches.TorchPatches(machine())
    p.install()
    try:
        lin = nn.Linear(2, 2)
        x = torch.ones(1, 2, requires_grad=True)
        out = lin(x)
        assert torch.equal(out, torch.nn.functional.linear(x, lin.weight, lin.bias))
        out.sum().backward()
        assert x.grad is not None and x.grad.shape == (1, 2)
        with pytest.raises(RuntimeError, match="does not require grad"):
            torch.ones(1).sum().backward()
    finally:
        p.remove()


def test_someone_patching_on_top_keeps_their_patch_and_ours_goes_quiet():
    events = []

    class Spy(StepMachine):
        def on_forward(self, t: int, thread: int = 0) -> None:
            events.append(t)

    m = Spy(lambda rec: None, 0)
    p = patches.TorchPatches(m)
    p.install()
    ours = vars(nn.Module)["__call__"]

    def theirs(self, *a, **kw):
        return ours(self, *a, **kw)

    nn.Module.__call__ = theirs
    try:
        p.remove()
        assert vars(nn.Module)["__call__"] is theirs  # not clobbered
        nn.Linear(2, 2)(torch.ones(1, 2))
        assert events == []  # our wrapper, still in their chain, is a pass-through
    finally:
        nn.Module.__call__ = nn.Module._wrapped_call_impl


def test_the_leak_check_sees_every_patch_left_behind_and_no_owner_after_removal():
    from gpuprof_shim.comm import CommTimer
    from tests.conftest import torch_leaks

    comm = CommTimer()
    p = patches.TorchPatches(machine(), comm=comm)
    p.install()
    try:
        leaks = torch_leaks()
        assert any("a patch owner is left installed" in x for x in leaks), leaks
        assert any("auto mode: torch.autograd.backward" in x for x in leaks), leaks
        ddp = [x for x in leaks if x.startswith("DistributedDataParallel.register_comm_hook")]
        assert ddp and "gpuprof's" in ddp[0], leaks  # the DDP comm-hook patch is seen
    finally:
        p.remove()
        comm.close()
    assert torch_leaks() == []


def test_the_leak_check_sees_the_profiler_guard_left_behind():
    import torch.autograd.profiler as legacy

    from gpuprof_shim.trace.guard import TorchGuard as _TorchGuard
    from gpuprof_shim.trace.guard import range_ender as _range_ender
    from tests.conftest import torch_leaks

    guard = _TorchGuard(lambda: None)
    guard.install(legacy, _range_ender(torch))
    try:
        leaks = torch_leaks()
        assert any("profiler guard: record_function.__enter__" in x for x in leaks), leaks
        assert any(x.startswith("profile._prepare_trace is gpuprof's") for x in leaks), leaks
    finally:
        guard.remove()
    assert torch_leaks() == []
