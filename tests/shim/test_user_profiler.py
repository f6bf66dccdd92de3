"""Auto mode while the user runs ``torch.profiler.profile()`` themselves:
their profiler still records, and steps are counted exactly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

import gpuprof

from .training import MLP, train


def profile(socket_dir: Path, name: str = "user-profiler"):
    return gpuprof.profile(name, socket_dir=socket_dir, autostart=False, print_summary=False)


def recorded(tprof) -> set[str]:
    return {e.key for e in tprof.key_averages()}


def assert_exact_steps(fake_daemon, n: int, micro: int = 1) -> None:
    steps = fake_daemon.steps
    assert [s["i"] for s in steps] == list(range(n))
    assert [s["micro"] for s in steps] == [micro] * n
    assert all({"forward", "backward", "optimizer"} <= set(s["phases"]) for s in steps)
    (bye,) = fake_daemon.of_type("bye")
    sent = n + fake_daemon.stacks_sent()
    assert (bye["status"], bye["sent"], bye["dropped"]) == ("finished", sent, 0)


def test_user_profiler_around_gpuprof(socket_dir, fake_daemon):
    with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as tprof:
        with profile(socket_dir):
            train(steps=3, accum=2)
    names = recorded(tprof)
    assert "aten::addmm" in names  # nn.Linear's matmul, through gpuprof's Module.__call__
    assert "Optimizer.step#SGD.step" in names  # torch's own optimizer step annotation
    assert_exact_steps(fake_daemon, 3, micro=2)


def test_user_profiler_inside_the_loop_with_a_schedule(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen_traces: list[set[str]] = []
    with profile(socket_dir):
        with torch.profiler.profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=2, repeat=1),
            on_trace_ready=lambda p: seen_traces.append(recorded(p)),
            record_shapes=True,
            with_stack=True,
        ) as tprof:
            for _ in range(6):
                with record_function("user_step"):
                    model(torch.randn(4, 8)).sum().backward()
                    opt.step()
                    opt.zero_grad()
                tprof.step()
    assert len(seen_traces) == 1  # one active window of 2 steps
    assert {"user_step", "aten::addmm", "Optimizer.step#SGD.step"} <= seen_traces[0]
    assert "nn.Module: MLP_0" in {e.name for e in tprof.events()}  # with_stack's module view
    assert_exact_steps(fake_daemon, 6)


WITH_STACK_SCRIPT = """
import json, sys
import torch
from torch.profiler import ProfilerActivity
import gpuprof
sys.path.insert(0, sys.argv[2])
from training import train

with gpuprof.profile("stack", socket_dir=sys.argv[1], autostart=False, print_summary=False):
    # the process's first with_stack profiler starts while torch is patched:
    # torch caches Module.__call__'s code (gpuprof's wrapper) for good
    with torch.profiler.profile(activities=[ProfilerActivity.CPU], with_stack=True) as tprof:
        train(steps=3)
print(json.dumps(sorted({e.name for e in tprof.events()})))
"""


def test_first_with_stack_profiler_started_under_gpuprof_sees_modules(socket_dir, make_daemon):
    for _attempt in range(3):
        fake_daemon = make_daemon()
        proc = subprocess.run(
            [sys.executable, "-c", WITH_STACK_SCRIPT, str(socket_dir), str(Path(__file__).parent)],
            capture_output=True,
            timeout=60,
        )
        # torch 2.13 sometimes fails to decode a with_stack event name as UTF-8
        # while parsing its own trace, with or without gpuprof (about 1 run in
        # 15 on this machine, measured 2026-11-30): that run says nothing, retry
        if b"UnicodeDecodeError" not in proc.stderr:
            break
        fake_daemon.close()
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    names = set(json.loads(proc.stdout.decode().splitlines()[-1]))
    # the tracer found each module through gpuprof's wrapper frame
    assert {"nn.Module: MLP_0", "nn.Module: Linear_0", "aten::addmm"} <= names
    assert_exact_steps(fake_daemon, 3)


def test_user_profiler_entered_and_left_inside_gpuprof_per_step(socket_dir, fake_daemon):
    model = MLP()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with profile(socket_dir):
        for _ in range(3):
            with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as tprof:
                model(torch.randn(4, 8)).sum().backward()
                opt.step()
            assert "aten::addmm" in recorded(tprof)
    assert_exact_steps(fake_daemon, 3)


def test_legacy_autograd_profiler_around_gpuprof(socket_dir, fake_daemon):
    with torch.autograd.profiler.profile() as tprof:
        with profile(socket_dir):
            train(steps=2)
    assert "aten::addmm" in recorded(tprof)
    assert_exact_steps(fake_daemon, 2)
