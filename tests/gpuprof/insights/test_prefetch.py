"""prefetch_queue_starved: a timed loader whose queue runs dry now and then."""

from __future__ import annotations

import pytest

from gpuprof.insights import run_rules
from gpuprof.insights.base import LoaderConfig
from gpuprof.insights.prefetch import prefetch_queue_starved

from .conftest import make_ctx


def bursty(every: int, wait_ms: float, n: int = 40, step_ms: float = 100.0, **kw):
    """*n* steps of *step_ms*; every *every*-th step waited *wait_ms* for its
    batch, the others 1 ms; a timed DataLoader unless told otherwise."""
    waits = [wait_ms if i % every == 0 else 1.0 for i in range(n)]
    kw.setdefault("explicit_wait", True)
    return make_ctx([step_ms] * n, waits, **kw)


def test_fires_when_a_quarter_of_the_steps_wait_on_an_empty_queue():
    ctx = bursty(4, 50.0, loaders=(LoaderConfig(2, False, False, 2),))
    ins = prefetch_queue_starved(ctx)
    assert ins is not None and ins.severity == "MED"
    # steady steps 3..39: 4, 8, ..., 36 waited 50 ms: 9 of 37
    assert ins.evidence["starved_steps"] == 9 and ins.evidence["steady_steps"] == 37
    assert ins.title == "The loader's prefetch queue ran dry on 24% of steps (50 ms waits)"
    assert ins.fix == (
        "Keep the queue full: raise prefetch_factor from 2 to 4; set "
        "persistent_workers=True (workers start again each epoch)."
    )
    # the loop waits 11 % of the time: under the stall threshold, so no stall finding
    found = {i.rule: i.to_dict() for i in run_rules(ctx)}
    assert "dataloader_stall" not in found
    gain = found["prefetch_queue_starved"]
    assert gain["gain_ms_per_iteration"] == pytest.approx(50.0 * 9 / 37, abs=1e-3)
    assert gain["gain_parts_ms"] == {"loader_wait": pytest.approx(12.162, abs=1e-3)}


@pytest.mark.parametrize(
    ("loader", "fix"),
    [
        (None, "Raise the DataLoader's prefetch_factor (e.g. 4) and set persistent_workers=True"),
        (LoaderConfig(0, False, False, None), "Load in worker processes (num_workers > 0)"),
        (LoaderConfig(4, True, False, 8), "Keep the queue full: raise num_workers from 4"),
    ],
)
def test_the_fix_fits_the_loaders_settings(loader, fix):
    ins = prefetch_queue_starved(bursty(4, 50.0, loaders=(loader,) if loader else ()))
    assert ins is not None and ins.fix.startswith(fix)


@pytest.mark.parametrize(
    "ctx",
    [
        bursty(4, 25.0),  # the waits are short: the queue covers them
        bursty(10, 50.0),  # long waits, but on 8 % of the steps
        bursty(4, 50.0, explicit_wait=False),  # no timed loader: a gap, not a queue
        bursty(2, 60.0),  # a stall (23 % waiting): the stall findings speak
        bursty(4, 50.0, n=8),  # too few steady steps to say
    ],
)
def test_silent_when_the_queue_is_not_the_story(ctx):
    assert prefetch_queue_starved(ctx) is None


def test_a_stall_is_the_stall_findings_not_this_one():
    found = {i.rule for i in run_rules(bursty(2, 60.0))}
    assert "dataloader_stall" in found and "prefetch_queue_starved" not in found
