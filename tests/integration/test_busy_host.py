"""Diagnoses on a shared, busy host: real torch loops beside a CPU load the
test starts itself. Each test asserts what holds whatever else the host is
doing: a verdict's inputs are read back from the database (the per-step
host and run CPU the rules were given) and checked against the verdict."""

from __future__ import annotations

import asyncio
import json
import os
import re

import pytest

from gpuprof.insights import RunContext, build_context
from gpuprof.insights.contention import contended
from gpuprof.insights.steps import high_step_variance
from gpuprofd.storage import queries, reads
from gpuprofd.storage.reader import open_reader

from .busy_scripts import BURSTS, EVERY_20, LOADER
from .conftest import Node

CORES = os.cpu_count() or 1


def _context(node: Node, run_id: int | None = None) -> RunContext:
    """The context gpuprofctl and the daemon's runner rebuild from the database."""

    async def read() -> RunContext:
        async with open_reader(node.db) as reader:
            return await reads.run_context(reader, await reads.get_run(reader, run_id))

    return asyncio.run(read())


def _summary(node: Node, run_id: int) -> dict:
    out = node.ctl("insights", str(node.db), str(run_id), "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _rules(summary: dict) -> dict[str, dict]:
    return {i["rule"]: i for i in summary["insights"]}


def test_cpu_heavy_loader_beside_a_hog_is_a_stall_caused_by_contention(node: Node):
    node.start_daemon()  # up before the load: auto-start would race the hog
    # the script starts 2 busy processes per core once torch is loaded: others
    # then hold most of the host
    out = node.run_script(LOADER, "cpu-hog", "cpu", "3", "1", "2", timeout=110)
    assert out.returncode == 0, out.stderr
    summary = _summary(node, 1)
    first = summary["insights"][0]
    # the stall is the headline, with its number; contention is its cause
    assert first["rule"] == "cpu_bound_dataloader", summary["insights"]
    assert re.match(
        r"\d+% of step time waiting on the loader; the workers are starved of CPU: "
        rf"other processes hold \d+\.\d of {CORES} cores$",
        first["title"],
    ), first["title"]
    assert first["evidence"]["cause"] == "contention"
    assert "won't help" in first["fix"]
    assert summary["measured_under_contention"]["share_of_steps"] > 0.5
    assert "Measured under contention" in out.stdout
    assert out.stdout.count("Measured under contention") == 1


def test_sleeping_loader_beside_a_hog_is_a_plain_stall(node: Node):
    node.start_daemon()  # up before the load: auto-start would race the hog
    out = node.run_script(LOADER, "sleep-hog", "sleep", "3", "1", "2", timeout=110)
    assert out.returncode == 0, out.stderr
    summary = _summary(node, 1)
    found = _rules(summary)
    stall = found["dataloader_stall"]
    assert stall["title"].endswith("% of step time waiting on the loader (timed next() calls)")
    # its workers sleep: not CPU-bound, and not told to add workers
    assert stall["evidence"]["loader_busy"] is False, stall
    assert "num_workers" not in stall["fix"] and "persistent_workers" not in stall["fix"]
    assert "cpu_bound_dataloader" not in found
    # the run needs next to no CPU: other processes' CPU did not slow its steps
    assert "host_cpu_contention" not in found


def _others_on(ctx: RunContext, steps: list[int]) -> float | None:
    vals = [ctx.step_other_cores[i] for i in steps if ctx.step_other_cores[i] is not None]
    return sum(vals) / len(vals) if vals else None


def _injected_host(ctx_run: dict, bursts: list[tuple[int, int, int, int]], cores: int):
    """Host and run-CPU samples every 0.5 s over the run, as a host would have
    read them had nothing but the bursts competed: the host full and others
    holding all but 0.4 core during a burst, half idle outside."""
    host, own = [], []
    t, end = ctx_run["start_mono_ns"], ctx_run["end_mono_ns"]
    while t <= end + 500_000_000:
        t += 500_000_000
        busy = any(b[2] < t - 250_000_000 < b[3] for b in bursts)
        host.append({"mono_ns": t, "cpu_pct": 100.0 if busy else 50.0, "cpu_count": cores})
        own.append({"mono_ns": t, "cores": 0.4 if busy else 1.0})
    return host, own


def test_a_clean_loop_with_three_bursts_of_load_names_the_bursts(node: Node):
    out = node.run_script(BURSTS, "bursts", timeout=110)
    assert out.returncode == 0, out.stderr
    bursts = [tuple(map(int, m)) for m in re.findall(r"BURST (\d+) (\d+) (\d+) (\d+)", out.stdout)]
    assert len(bursts) == 3
    summary = _summary(node, 1)
    for ins in summary["insights"]:  # nothing here recurs at a regular interval
        assert "periodic" not in ins["detail"] and "every" not in ins["title"], ins
    var = _rules(summary)["high_step_variance"]
    slow = var["evidence"]["slow_step_numbers"]
    # the hog's bursts are named: at least two of the three hold named slow steps
    hit = [b for b in bursts if any(b[0] <= s <= b[1] for s in slow)]
    assert len(hit) >= 2, (slow, bursts)
    # tied to other processes' CPU exactly when the samples the rule was given
    # show it (a host already full of other work leaves the bursts no contrast)
    ctx = _context(node)
    rest = [i for i in range(3, ctx.steps) if i not in set(slow)]
    during, other = _others_on(ctx, slow), _others_on(ctx, rest)
    flags = contended(ctx)
    contrast = (
        during is not None
        and other is not None
        and during - other >= 0.3
        and sum(1 for s in slow if flags[s]) >= 0.6 * len(slow)
    )
    assert ("coincide with other processes' CPU" in var["title"]) is contrast, (var, during, other)

    # the same steps with the host samples of a host the bursts alone made
    # busy: the bursts are tied to other processes' CPU
    (run,) = node.query("SELECT * FROM runs")
    steps = [queries.step_from_row(r) for r in node.query(queries.STEPS_SQL, run["id"])]
    host, own = _injected_host(dict(run), bursts, CORES)
    replay = build_context(dict(run) | {"options": {}}, steps, host, run_cpu=own)
    found = high_step_variance(replay)
    assert found is not None
    assert "coincide with other processes' CPU" in found.title, found.title
    assert "every" not in found.title and "periodic" not in found.detail


def test_a_sleep_every_20th_step_is_periodic(node: Node):
    out = node.run_script(EVERY_20, "every-20", "200")
    assert out.returncode == 0, out.stderr
    var = _rules(_summary(node, 1))["high_step_variance"]
    assert var["title"].endswith("; slow every 20 steps"), var
    assert var["evidence"]["period_steps"] == 20
    assert "every 20 steps" in out.stdout


@pytest.mark.parametrize("attempt", range(10))
def test_a_one_second_cpu_bound_loader_run_gets_the_same_finding_ten_times(node: Node, attempt):
    # one 1-second run per test (each pays a torch import in its subprocess; 120 s a
    # test): the same finding, whatever the host's load, all ten times
    out = node.run_script(LOADER, f"short{attempt}", "cpu", "1", "1", timeout=110)
    assert out.returncode == 0, out.stderr
    found = _rules(_summary(node, 1))
    title = found["cpu_bound_dataloader"]["title"]
    assert re.match(r"\d+% of step time waiting on the loader; ", title), title
    assert "dataloader_stall" not in found
