"""The forward detector on real CPU training loops: wrappers (DDP, FSDP2) are
one forward per micro-batch, the steady state runs torch's own
``Module.__call__`` with hooks on the roots only, and what the hooks must
survive (a raising forward, a new model, pickling, copies)."""

from __future__ import annotations

import copy
import io
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import gpuprof
from gpuprof_shim.auto import forwards as fw
from gpuprof_shim.auto.machine import StepMachine
from gpuprof_shim.session import Profiler

from .training import MLP


def profile(socket_dir: Path) -> Profiler:
    return gpuprof.profile("wrappers", socket_dir=socket_dir, autostart=False, print_summary=False)


def detector(prof: Profiler) -> fw.ForwardDetector:
    return prof._patches.wrappers.forwards


@pytest.fixture
def gloo(tmp_path: Path) -> Iterator[None]:
    """A one-rank gloo process group in this process (FileStore rendezvous)."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    yield
    dist.destroy_process_group()


def run(model: nn.Module, steps: int, accum: int, params: nn.Module | None = None) -> None:
    opt = torch.optim.SGD((params or model).parameters(), lr=0.1)
    for _ in range(steps):
        for _ in range(accum):
            nn.functional.cross_entropy(
                model(torch.randn(4, 8)), torch.randint(0, 3, (4,))
            ).backward()
        opt.step()
        opt.zero_grad()


def test_steady_state_is_torch_own_call_with_hooks_on_the_root(socket_dir, fake_daemon, forwards):
    model = MLP()
    with profile(socket_dir) as prof:
        run(model, steps=3, accum=2)
        det = detector(prof)
        assert not det.discovering
        assert vars(nn.Module)["__call__"] is nn.Module._wrapped_call_impl
        assert det.hooked_roots() == [model]
        assert det.windows == 1
        assert vars(model)["_compiled_call_impl"].__wrapped__ == model._call_impl
        assert "_compiled_call_impl" not in vars(model.head)
        assert not model._forward_pre_hooks and not model._forward_hooks  # torch's fast path
    assert "_compiled_call_impl" not in vars(model)  # as it was found
    assert [s["micro"] for s in fake_daemon.steps] == [2, 2, 2]
    assert len(forwards) == 6


def test_ddp_is_one_forward_per_micro_batch(socket_dir, fake_daemon, forwards, gloo):
    model = MLP()
    ddp = nn.parallel.DistributedDataParallel(model)
    with profile(socket_dir) as prof:
        run(ddp, steps=3, accum=2)
        assert detector(prof).hooked_roots() == [ddp]  # not the inner .module
    assert [s["micro"] for s in fake_daemon.steps] == [2, 2, 2]
    assert len(forwards) == 6
    assert all(s["phases"]["forward"] > 0 for s in fake_daemon.steps)


def test_fsdp2_is_one_forward_per_micro_batch(socket_dir, fake_daemon, forwards, gloo):
    from torch.distributed.fsdp import fully_shard

    model = MLP()
    fully_shard(model.body)
    fully_shard(model)  # the root's pre hook all-gathers: inside our span
    hooks = (dict(model._forward_pre_hooks), dict(model._forward_hooks))
    with profile(socket_dir) as prof:
        run(model, steps=3, accum=2)
        assert detector(prof).hooked_roots() == [model]
        assert vars(model)["_compiled_call_impl"].__wrapped__ == model._call_impl
        assert (dict(model._forward_pre_hooks), dict(model._forward_hooks)) == hooks
    assert [s["micro"] for s in fake_daemon.steps] == [2, 2, 2]
    assert len(forwards) == 6


def test_a_raising_forward_leaves_the_hooks_balanced(socket_dir, fake_daemon, forwards):
    model = MLP()
    with profile(socket_dir) as prof:
        run(model, steps=2, accum=1)  # discovery over: hooks from here on
        assert not detector(prof).discovering
        with pytest.raises(RuntimeError, match="shape"):
            model(torch.randn(4, 5))  # wrong width: raises inside the forward
        assert (detector(prof).owner, detector(prof).others, detector(prof).depth.n) == (0, 0, 0)
        run(model, steps=2, accum=1)
    assert [s["micro"] for s in fake_daemon.steps] == [1, 1, 1, 1]
    # the raising call started the third step's forward (the machine then
    # takes the next call as part of it): 2 + 1 + 1 after it
    assert len(forwards) == 4


def test_a_new_model_is_found_by_its_backward(socket_dir, fake_daemon, forwards):
    first, second = MLP(), MLP()
    with profile(socket_dir) as prof:
        run(first, steps=2, accum=1)
        run(second, steps=3, accum=1)  # its first backward has no forward seen
        det = detector(prof)
        assert det.windows == 2
        assert set(det.hooked_roots()) == {first, second}
    assert [s["micro"] for s in fake_daemon.steps] == [1] * 5
    # second's first forward ran under no hook and no patch: its step starts at
    # the backward; every later one is seen
    assert len(forwards) == 4


def test_two_backward_calls_per_forward_stop_rediscovery(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir) as prof:
        for _ in range(10):
            out = model(torch.randn(4, 8))
            out.sum().backward(retain_graph=True)
            out.square().mean().backward()  # no forward before it: not a new root
            opt.step()
            opt.zero_grad()
        assert detector(prof).windows == 1 + fw.MAX_FRUITLESS
    assert [s["micro"] for s in fake_daemon.steps] == [2] * 10


def test_no_grad_calls_of_a_root_are_timed_for_the_machine(socket_dir, fake_daemon, monkeypatch):
    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(StepMachine, "wants_eval", lambda self: True)
    monkeypatch.setattr(StepMachine, "on_eval_call", lambda self, a, b: calls.append((a, b)))
    model = MLP()
    with profile(socket_dir) as prof:
        run(model, steps=2, accum=1)
        assert not detector(prof).discovering
        with torch.no_grad():
            for _ in range(3):
                model(torch.randn(4, 8))
        with torch.inference_mode():
            model(torch.randn(4, 8))
        nn.ReLU()(torch.randn(2))  # no parameters, not a root: not seen
    assert len(calls) == 4
    assert all(0 < b - a < 1_000_000_000 for a, b in calls)


def test_a_hooked_model_can_be_pickled_and_copied(socket_dir, fake_daemon, forwards):
    model = MLP()
    with profile(socket_dir):
        run(model, steps=2, accum=1)
        buf = io.BytesIO()
        torch.save(model, buf)  # a whole-module checkpoint inside the loop
        twin = copy.deepcopy(model)  # e.g. an EMA copy
    assert "_compiled_call_impl" not in vars(model)  # removed at exit
    assert "_compiled_call_impl" not in vars(twin)  # torch copies it not
    assert torch.equal(twin(torch.ones(1, 8)), model(torch.ones(1, 8)))
    # the checkpoint loads where gpuprof is not installed: nothing of gpuprof in it
    script = (
        "import sys, io, torch; sys.modules['gpuprof'] = sys.modules['gpuprof_shim'] = None\n"
        "m = torch.load(io.BytesIO(sys.stdin.buffer.read()), weights_only=False)\n"
        "print(m(torch.ones(1, 8)).tolist(), sorted(k for k in vars(m) if 'compiled' in k),"
        " len(m._forward_hooks) + len(m._forward_pre_hooks))"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        input=buf.getvalue(),
        capture_output=True,
        timeout=60,
        cwd=str(Path(__file__).resolve().parents[2]),  # the repo: tests.shim.training.MLP
    )
    assert out.returncode == 0, out.stderr.decode()[-800:]
    assert out.stdout.decode().strip() == f"{model(torch.ones(1, 8)).tolist()} [] 0"


def test_wrappers_are_removed_even_if_the_loop_raises(socket_dir, fake_daemon):
    model = MLP()
    with pytest.raises(ValueError, match="boom"):
        with profile(socket_dir):
            run(model, steps=2, accum=1)
            raise ValueError("boom")
    assert "_compiled_call_impl" not in vars(model)
    assert fw.live_detectors() == []


def test_the_fast_tracing_check_answers_as_is_compiling(monkeypatch):
    tracing = fw.Tracing.of(torch.compiler)
    assert tracing.dynamo is torch.compiler.is_dynamo_compiling
    check = lambda: tracing.dynamo() or tracing.flags._is_compiling_flag  # noqa: E731
    assert check() is torch.compiler.is_compiling() is False
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)  # export, a compile session
    assert check() is torch.compiler.is_compiling() is True


def test_the_fast_tracing_check_is_true_while_dynamo_traces_with_no_graph_break():
    dynamo, flags = fw.Tracing.of(torch.compiler)

    @torch.compile(backend="eager", fullgraph=True)  # a graph break would raise
    def traced(x: torch.Tensor) -> torch.Tensor:
        return x + 1 if dynamo() or flags._is_compiling_flag else x - 1

    try:
        assert traced(torch.zeros(1)).item() == 1
    finally:
        torch._dynamo.reset()


def test_a_torch_without_the_fast_check_keeps_is_compiling():
    class OldCompiler:
        @staticmethod
        def is_compiling() -> bool:
            return True

    tracing = fw.Tracing.of(OldCompiler)
    assert tracing.dynamo is OldCompiler.is_compiling
    assert tracing.flags._is_compiling_flag is False
