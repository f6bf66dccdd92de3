"""Auto mode on a real CPU training loop, against a fake daemon made of real
ZeroMQ sockets: what arrives, step by step."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from torch import nn

import gpuprof
from gpuprof_shim.auto.forwards import DISCOVERY_BACKWARDS
from gpuprof_shim.auto.machine import StepMachine

from .training import MLP, train


def profile(socket_dir: Path, name: str = "t", **kw):
    return gpuprof.profile(name, socket_dir=socket_dir, autostart=False, **kw)


def test_gradient_accumulation_sends_one_step_per_optimizer_step(socket_dir, fake_daemon, capsys):
    with profile(socket_dir, "accum") as prof:
        train(steps=3, accum=4)
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == [0, 1, 2]
    assert [s["micro"] for s in steps] == [4, 4, 4]
    assert {s["run_key"] for s in steps} == {prof.run_key}
    for s in steps:
        # loading micro-batches 2-4 happens inside the step: the "data" phase
        # (plus "gpuprof" on steps where the shim sent a burst of events)
        assert set(s["phases"]) - {"gpuprof"} == {"forward", "backward", "optimizer", "data"}
        assert all(v > 0 for v in s["phases"].values())
        assert sum(s["phases"].values()) <= s["t1"] - s["t0"]
        assert s["explicit"] is False
    assert steps[1]["t0"] >= steps[0]["t1"]
    assert steps[1]["wait"] == steps[1]["t0"] - steps[0]["t1"]
    (bye,) = fake_daemon.of_type("bye")
    sent = 3 + fake_daemon.stacks_sent()
    assert (bye["status"], bye["sent"], bye["dropped"]) == ("finished", sent, 0)
    assert "error" not in bye
    assert prof.run_id == 7
    out = capsys.readouterr().out
    assert "gpuprof · accum  (3 steps, median 12.0 ms)" in out
    assert "Note: from the fake daemon" in out


def test_hello_carries_identity_and_options(socket_dir, fake_daemon, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "8")
    with profile(socket_dir, "bad\x00name ", flops_per_step=1e12, dtype=torch.bfloat16):
        pass
    (hello,) = fake_daemon.of_type("hello")
    assert hello["run_name"] == "bad name"
    assert (hello["rank"], hello["local_rank"], hello["world_size"]) == (3, 1, 8)
    assert hello["options"] == {"flops_per_step": 1e12, "dtype": "bfloat16", "flops_source": "user"}
    assert hello["auto"] is True
    assert "cuda_uuid" not in hello  # CPU torch: CUDA never initialized
    assert "project" not in hello and "tags" not in hello  # none given, none in the env


def test_hello_carries_project_and_tags_over_the_environment(socket_dir, fake_daemon, monkeypatch):
    monkeypatch.setenv("GPUPROF_PROJECT", "from-env")
    monkeypatch.setenv("GPUPROF_TAGS", "team=nlp, queue=a100")
    with profile(socket_dir, "p", project="llm\x1b[31m", tags={"queue": "h200", "k": 1}):
        pass
    (hello,) = fake_daemon.of_type("hello")
    assert hello["project"] == "llm[31m"  # the argument wins; control characters go
    assert hello["tags"] == {"team": "nlp", "queue": "h200", "k": "1"}  # the argument's keys win
    with profile(socket_dir, "q"):
        pass
    second = fake_daemon.of_type("hello")[1]
    assert (second["project"], second["tags"]) == ("from-env", {"team": "nlp", "queue": "a100"})


class Clock:
    """A monotonic fake clock: each read adds 1 ns; modules advance it."""

    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        self.now += 1
        return self.now


class Ticking(nn.Module):
    """Advances the fake clock by ``ns`` when called; optionally parameterless."""

    def __init__(self, clock: Clock, ns: int, params: bool = True) -> None:
        super().__init__()
        self.clock, self.ns = clock, ns
        self.lin = nn.Linear(4, 4) if params else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.now += self.ns
        return self.lin(x) if self.lin is not None else x * 1.0


def test_loss_module_after_model_is_part_of_the_same_forward(socket_dir, fake_daemon):
    clock = Clock()
    model, loss_fn = Ticking(clock, 100), Ticking(clock, 1_000, params=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = profile(socket_dir)
    prof.clock = clock
    with prof:
        loss_fn(model(torch.randn(2, 4))).sum().backward()
        opt.step()
    (step,) = fake_daemon.steps
    assert step["micro"] == 1
    # model (100) + loss (1000) + a few 1 ns clock reads; a loss module taken
    # for a new forward would leave only ~1000 here.
    assert 1_100 <= step["phases"]["forward"] < 1_120


def test_parameterless_module_before_the_model_does_not_start_the_step(socket_dir, fake_daemon):
    clock = Clock()
    transform, model = Ticking(clock, 5_000, params=False), Ticking(clock, 100)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = profile(socket_dir)
    prof.clock = clock
    with prof:
        x = transform(torch.randn(2, 4))  # e.g. a torchvision v2 transform in the loader
        before_model = clock.now
        model(x).sum().backward()
        opt.step()
    (step,) = fake_daemon.steps
    assert step["t0"] > before_model
    assert step["wait"] >= 5_000  # the transform's time is loader time, not forward


def test_only_outermost_module_calls_are_seen(socket_dir, fake_daemon, monkeypatch):
    seen = []
    original = StepMachine.on_forward_end
    monkeypatch.setattr(
        StepMachine, "on_forward_end", lambda self, t: (seen.append(t), original(self, t))
    )
    with profile(socket_dir):
        train(steps=2, accum=3)  # MLP: 6 modules, loss: 1 more per micro-batch
    # model + loss per micro-batch while discovering (no submodules), then the
    # model (the one root) alone: its hooks see nothing else
    found = DISCOVERY_BACKWARDS
    assert len(seen) == 2 * found + (2 * 3 - found)
    assert [s["micro"] for s in fake_daemon.steps] == [3, 3]


def test_no_grad_evaluation_is_not_a_step(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir):
        for _ in range(2):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            with torch.no_grad():
                model(torch.randn(2, 8))
    assert [s["micro"] for s in fake_daemon.steps] == [1, 1]
    assert len(fake_daemon.steps) == 2


def test_direct_autograd_backward_and_tensor_backward_count_once(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir):
        model(torch.randn(2, 8)).sum().backward()  # Tensor.backward -> autograd.backward
        opt.step()
        torch.autograd.backward(model(torch.randn(2, 8)).sum())
        opt.step()
    assert [s["micro"] for s in fake_daemon.steps] == [1, 1]


def test_reentrant_checkpointing_backward_inside_backward_counts_once(socket_dir, fake_daemon):
    """``checkpoint(use_reentrant=True)`` calls ``torch.autograd.backward`` from
    inside the engine for each checkpointed block: part of the one backward."""
    from torch.utils.checkpoint import checkpoint

    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    calls = []
    original = torch.autograd.backward
    with profile(socket_dir):
        patched = torch.autograd.backward

        def spy(*a, **kw):  # on top of ours: every call, the reentrant ones too
            calls.append(1)
            return patched(*a, **kw)

        torch.autograd.backward = spy
        try:
            for _ in range(3):
                x = torch.randn(2, 8, requires_grad=True)
                h = checkpoint(model.body, x, use_reentrant=True)
                model.head(h).sum().backward()
                opt.step()
        finally:
            torch.autograd.backward = patched
    assert torch.autograd.backward is original
    assert len(calls) == 6  # each step: the loop's backward and the checkpoint's inside it
    assert [s["micro"] for s in fake_daemon.steps] == [1, 1, 1]


def test_a_micro_batch_never_stepped_is_not_a_step_but_a_note(socket_dir, fake_daemon, capsys):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir):
        model(torch.randn(2, 8)).sum().backward()
        opt.step()
        model(torch.randn(2, 8)).sum().backward()  # never stepped
    assert [s["micro"] for s in fake_daemon.steps] == [1]
    assert (
        "Note: 1 micro-batch after the last optimizer update (no update followed) "
        "not counted as a step" in capsys.readouterr().out
    )


NO_STEPS_NOTE = (
    "  Note: 0 steps: auto mode counts a step at each optimizer.step() (or a framework "
    "callback's step end) and this run made none; for inference or a custom loop, use "
    "gpuprof.profile(..., auto=False) and `with prof.step(i):` around each iteration\n"
)


def test_an_inference_loop_in_auto_mode_says_why_it_has_no_steps(socket_dir, fake_daemon, capsys):
    model = MLP().eval()
    with profile(socket_dir, "infer-auto") as prof, torch.no_grad():
        for _ in range(20):
            model(torch.randn(4, 8))
    assert fake_daemon.steps == [] and prof.summary is not None
    out = capsys.readouterr().out
    assert "gpuprof · infer-auto  (0 steps" in out
    assert out.count(NO_STEPS_NOTE) == 1
    assert out.index(NO_STEPS_NOTE) < out.index("Note: from the fake daemon")
    # the same loop, as the note says: auto=False and prof.step(i)
    with profile(socket_dir, "infer-manual", auto=False) as prof, torch.no_grad():
        for i in range(3):
            with prof.step(i):
                model(torch.randn(4, 8))
    assert len(fake_daemon.steps) == 3
    assert "0 steps:" not in capsys.readouterr().out


def test_no_steps_note_only_for_an_auto_run_that_ended_normally(socket_dir, fake_daemon, capsys):
    with profile(socket_dir, "trains"):
        train(steps=2)
    with profile(socket_dir, "manual-empty", auto=False):
        pass
    with pytest.raises(ValueError), profile(socket_dir, "fails-first"):
        raise ValueError("before any step")
    assert "0 steps:" not in capsys.readouterr().out


def test_second_optimizer_does_not_add_steps_or_crash(socket_dir, fake_daemon):
    model = MLP()
    opt_a = torch.optim.SGD(model.body.parameters(), lr=0.1)
    opt_b = torch.optim.Adam(model.head.parameters(), lr=0.1)
    with profile(socket_dir):
        for _ in range(3):
            model(torch.randn(2, 8)).sum().backward()
            opt_a.step()
            opt_b.step()
    assert [s["i"] for s in fake_daemon.steps] == [0, 1, 2]


def test_wrap_dataloader_in_auto_mode_makes_waits_explicit(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [torch.randn(2, 8) for _ in range(6)]
    with profile(socket_dir) as prof:
        it = iter(prof.wrap_dataloader(batches))
        for _ in range(3):
            for _micro in range(2):
                model(next(it)).sum().backward()
            opt.step()
    steps = fake_daemon.steps
    assert [s["explicit"] for s in steps] == [True, True, True]
    assert [s["micro"] for s in steps] == [2, 2, 2]
    # the second micro-batch's fetch happens inside the step: its data phase
    assert all(s["phases"]["data"] > 0 for s in steps)
    # a list's next() costs microseconds, far below the inter-step gap
    assert all(s["wait"] < 5_000_000 for s in steps)


def test_loop_raising_restores_torch_and_reports_failed(socket_dir, fake_daemon, capsys):
    boom = ValueError("boom at step 1")

    def explode(i: int) -> None:
        if i == 1:
            raise boom

    with pytest.raises(ValueError) as info:
        with profile(socket_dir, "raises"):
            train(steps=5, on_step=explode)
    assert info.value is boom
    assert vars(nn.Module)["__call__"] is nn.Module._wrapped_call_impl
    (bye,) = fake_daemon.of_type("bye")
    assert bye["status"] == "failed"
    assert bye["error"] == "ValueError: boom at step 1"
    assert len(fake_daemon.steps) == 2
    assert "[FAILED]" in capsys.readouterr().out


def test_long_error_is_cut_to_protocol_limit(socket_dir, fake_daemon):
    with pytest.raises(RuntimeError):
        with profile(socket_dir, print_summary=False):
            raise RuntimeError("x" * 5000)
    (bye,) = fake_daemon.of_type("bye")
    assert len(bye["error"]) == 2000 and bye["error"].startswith("RuntimeError: xxx")


def test_step_indices_continue_across_many_steps(socket_dir, fake_daemon):
    with profile(socket_dir, print_summary=False):
        train(steps=25)
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == list(range(25))
    assert all(b["t0"] >= a["t1"] for a, b in itertools.pairwise(steps))


class _WorkerDataset(torch.utils.data.Dataset):
    """Runs a parameterless module (like a torchvision v2 transform) and
    tries to send through the inherited profiler, inside a forked worker."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        from gpuprof_shim.session import active_profiler

        prof = active_profiler()
        sent = prof.sender.send({"v": 1, "type": "mark"}) if prof and prof.sender else None
        x = nn.ReLU()(torch.randn(8))
        return x, torch.tensor(int(bool(sent))), torch.tensor(prof.sender.dropped)


@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
def test_forked_dataloader_workers_send_nothing_and_steps_stay_right(socket_dir, fake_daemon):
    loader = torch.utils.data.DataLoader(
        _WorkerDataset(), batch_size=2, num_workers=2, multiprocessing_context="fork"
    )
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir, print_summary=False) as prof:
        sent_flags, child_drops = [], []
        for x, sent, dropped in loader:
            sent_flags += sent.tolist()
            child_drops += dropped.tolist()
            model(x).sum().backward()
            opt.step()
    assert sent_flags == [0] * 8  # a worker's send is refused...
    assert all(d >= 1 for d in child_drops)  # ...and counted in the worker only
    assert [s["i"] for s in fake_daemon.steps] == [0, 1, 2, 3]
    # no worker's mark: the parent's steps and its reports of the loader and its workers
    types = [m["type"] for m in fake_daemon.data if m["type"] != "stacks"]
    assert types == ["loaders", "workers"] + ["step"] * 4
    (bye,) = fake_daemon.of_type("bye")
    assert (bye["sent"], bye["dropped"]) == (6 + fake_daemon.stacks_sent(), 0)
    assert prof.sender.dropped == 0
