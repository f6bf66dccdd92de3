"""``profile(wandb=True)`` against the real wandb package in offline mode:
what it wrote is read back from the run's record log (``wandb_records``)."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

import gpuprof
from gpuprof.protocol import DATA_PHASE, OWN_TIME_PHASE
from gpuprof.summary import memory_peaks
from gpuprof_shim import wandb_sink
from gpuprof_shim.steps import StepRecord
from gpuprof_shim.wandb_sink import WandbSink

from .training import train
from .wandb_records import read_run

wandb = pytest.importorskip("wandb")

FINDINGS = [
    {
        "rule": "cost_estimate",
        "severity": "LOW",
        "title": "Estimated cost: not estimated",
        "detail": "",
        "fix": "",
        "evidence": {},
    },
    {
        "rule": "high_step_variance",
        "severity": "MED",
        "title": "Step compute time is erratic",
        "detail": "",
        "fix": "",
        "evidence": {},
        "gain_ms_per_iteration": 5.0,
        "gain_pct": 10.0,
        "gain_speedup_max": 1.11,
        "gain_run_s": 0.03,
        "gain_usd": None,
        "gain_method": "the slow steps' time above the median",
    },
    {  # worth the most: the table's first row, though listed after a MED
        "rule": "dataloader_stall",
        "severity": "HIGH",
        "title": "Dataloader stall — 62% of step time waiting",
        "detail": "loader wait 31 ms of 50 ms",
        "fix": "num_workers=4",
        "evidence": {},
        "gain_ms_per_iteration": 31.0,
        "gain_pct": 62.0,
        "gain_speedup_max": 2.63,
        "gain_run_s": 0.19,
        "gain_usd": None,
        "gain_method": "the loader wait, removed",
    },
]
GAINS = {"fix_all_speedup_max": 3.57, "fix_all_ms_per_iteration": 36.0, "fix_all_run_s": 0.22}


@pytest.fixture
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """wandb in offline mode, writing under tmp_path; a run a test left
    open is finished after it."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DISABLE_GIT", "true")
    yield tmp_path
    if wandb.run is not None:
        wandb.run.finish()


def gpuprof_rows(history: list[dict]) -> list[dict]:
    return [row for row in history if "gpuprof/step_ms" in row]


def test_steps_findings_and_summary_go_to_the_active_run(offline, make_daemon, socket_dir):
    make_daemon(summary_extra={"insights": FINDINGS, "gains": GAINS, "micro_batches_per_step": 2.0})
    run = wandb.init(project="gpuprof-test", dir=offline)
    try:
        with gpuprof.profile("wb", wandb=True, socket_dir=socket_dir, autostart=False):
            train(6, accum=2, on_step=lambda i: wandb.log({"loss": 1.0 / (i + 1)}))
    finally:
        run.finish()
    got = read_run(offline)
    # the user's own rows are untouched: one per step, with their loss
    assert [row["loss"] for row in got.history if "loss" in row] == [
        1.0 / (i + 1) for i in range(6)
    ]
    # gpuprof's rows on its own step axis, one per step, with the breakdown
    rows = gpuprof_rows(got.history)
    assert [row["gpuprof/step"] for row in rows] == list(range(6))
    for row in rows:
        assert row["gpuprof/micro_batches"] == 2
        assert row["gpuprof/step_ms"] > 0 and row["gpuprof/loader_wait_ms"] >= 0
        assert row["gpuprof/forward_ms"] > 0 and row["gpuprof/backward_ms"] > 0
        assert row["gpuprof/optimizer_ms"] > 0
        assert "gpuprof/gpuprof_ms" not in row  # gpuprof's own time has its own name
        assert "gpuprof/mfu" not in row  # a CPU run: no GPU peak to compare with
    assert {"name": "", "glob_name": "gpuprof/*", "step_metric": "gpuprof/step"} in got.metrics
    # the findings as a table, the summary's figures in the run summary
    table = got.table("gpuprof/insights")
    assert table["columns"] == [
        "severity",
        "rule",
        "title",
        "detail",
        "fix",
        "gain_speedup_max",
        "gain_ms_per_iteration",
        "gain_pct",
        "gain_run_s",
        "gain_usd",
        "gain_method",
    ]
    # ranked by gain, severity shown; no gain: empty cells, after those with one
    assert table["data"] == [
        [
            "HIGH",
            "dataloader_stall",
            FINDINGS[2]["title"],
            "loader wait 31 ms of 50 ms",
            "num_workers=4",
            "2.63",
            "31.0",
            "62.0",
            "0.19",
            "",
            "the loader wait, removed",
        ],
        [
            "MED",
            "high_step_variance",
            "Step compute time is erratic",
            "",
            "",
            "1.11",
            "5.0",
            "10.0",
            "0.03",
            "",
            "the slow steps' time above the median",
        ],
        ["LOW", "cost_estimate", "Estimated cost: not estimated", *[""] * 8],
    ]
    s = got.summary
    assert (s["gpuprof/steps"], s["gpuprof/median_step_ms"], s["gpuprof/run_id"]) == (6, 12.0, 7)
    assert (s["gpuprof/findings"], s["gpuprof/micro_batches_per_step"]) == (3, 2.0)
    assert (s["gpuprof/top_gain_rule"], s["gpuprof/top_gain_speedup_max"]) == (
        "dataloader_stall",
        2.63,
    )
    assert s["gpuprof/fix_all_speedup_max"] == 3.57
    assert s["gpuprof/full_report"] == f"gpuprofctl insights {socket_dir / 'fake.db'} 7"
    logged = {k for row in got.history for k in row} | set(s)
    # the table's own fields (gpuprof/insights/path, ...) are the table's
    logged = {"/".join(k.split("/")[:2]) for k in logged if k.startswith("gpuprof/")}
    assert "gpuprof/insights" in logged and logged <= documented_keys()


DOCS = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"


def documented_keys() -> set[str]:
    """Every ``gpuprof/...`` key docs/integrations.md's W&B section names."""
    section = DOCS.read_text().split("## Weights & Biases", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`(gpuprof/[a-z_]+)`", section))


def test_the_docs_list_every_key_logged():
    phases = ("forward", "backward", "optimizer", "comm", DATA_PHASE, OWN_TIME_PHASE)
    rec = StepRecord(0, 0, 10**7, 10**6, False, 2, dict.fromkeys(phases, 10**6))
    per_step = (
        wandb_sink.step_row(rec._replace(traced=True), None).keys()
        | wandb_sink.step_row(rec, (1e12, 1e15)).keys()
    )
    gpu = SimpleNamespace(mem_used_max_bytes=7 << 30, mem_total_bytes=8 << 30)
    memory = memory_peaks(  # only its memory figures are read
        SimpleNamespace(gpu=gpu, torch_peak_allocated_bytes=1, torch_peak_reserved_bytes=2)
    )
    summary = {
        **dict.fromkeys(wandb_sink.SUMMARY_KEYS, 1),
        "insights": FINDINGS,
        "gains": GAINS,
        "memory": memory,
        "run_name": "r",
        "db": "/tmp/gpuprof.db",
    }
    at_end = wandb_sink.summary_figures(summary).keys()
    assert "gpuprof/gpuprof_overhead_ms" in per_step and "gpuprof/full_report" in at_end
    assert {*per_step, *at_end, wandb_sink.PREFIX + "insights"} == documented_keys()


def test_mfu_per_step_when_the_flop_and_the_peak_are_known(offline):
    run = wandb.init(project="gpuprof-test", dir=offline)
    ms = 1_000_000
    sink = WandbSink(run, wandb, mfu_inputs=lambda: (2e12, 100e12), interval_s=3600)
    for i in range(3):  # 40 ms steps after 10 ms of loader wait: 2e12 FLOP / 0.05 s / 1e14
        t0 = 100 * ms * i
        # a traced step's time says nothing of MFU
        rec = StepRecord(i, t0, t0 + 40 * ms, 10 * ms, explicit=True, micro=1, traced=i == 2)
        sink.add(rec)
    sink.finish({"run_name": "m", "steps": 3, "insights": [], "mfu": 0.4})
    run.finish()
    got = read_run(offline)
    rows = gpuprof_rows(got.history)
    assert [row.get("gpuprof/mfu") for row in rows] == [pytest.approx(0.4)] * 2 + [None]
    assert [row["gpuprof/traced"] for row in rows] == [0, 0, 1]
    assert got.summary["gpuprof/mfu"] == 0.4
    assert got.table("gpuprof/insights")["data"] == []


def test_no_active_run_is_a_noop_with_one_notice(offline, fake_daemon, socket_dir, caplog):
    assert wandb.run is None
    with caplog.at_level(logging.WARNING, logger="gpuprof.shim"):
        with gpuprof.profile("nowb", wandb=True, socket_dir=socket_dir, autostart=False) as prof:
            train(3)
    said = [r.getMessage() for r in caplog.records if "W&B" in r.getMessage()]
    assert said == [
        "gpuprof: wandb=True but no W&B run is active (call wandb.init() before "
        "gpuprof.profile()); not logging to W&B"
    ]
    assert prof.summary is not None and prof.summary["steps"] == 3
    assert not (offline / "wandb").exists()


def test_a_run_finished_midway_is_one_line_and_training_goes_on(
    offline, fake_daemon, socket_dir, caplog
):
    run = wandb.init(project="gpuprof-test", dir=offline)

    def finish_early(i: int) -> None:
        if i == 2:
            run.finish()  # the user's code ends the W&B run while training goes on

    with caplog.at_level(logging.WARNING, logger="gpuprof.shim"):
        with gpuprof.profile("early", wandb=True, socket_dir=socket_dir, autostart=False) as prof:
            train(5, on_step=finish_early)
    said = [r.getMessage() for r in caplog.records if "W&B" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith("gpuprof: logging to W&B failed, stopped: ")
    assert "is finished" in said[0]
    assert prof.summary is not None and prof.summary["steps"] == 5


def test_wandb_is_imported_only_when_asked(fake_daemon, socket_dir):
    sys.modules.pop("wandb", None)
    try:
        with gpuprof.profile("plain", socket_dir=socket_dir, autostart=False):
            train(2)
        assert "wandb" not in sys.modules
    finally:
        import wandb as _  # noqa: F401 - restore the module for the other tests


def test_wandb_not_installed_is_one_line(fake_daemon, socket_dir, caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with caplog.at_level(logging.WARNING, logger="gpuprof.shim"):
        with gpuprof.profile("nowb", wandb=True, socket_dir=socket_dir, autostart=False) as prof:
            train(2)
    said = [r.getMessage() for r in caplog.records if "wandb" in r.getMessage()]
    assert said == [
        "gpuprof: wandb=True but wandb is not installed: pip install -e "
        f"'{Path(gpuprof.__file__).resolve().parents[1]}[wandb]'"
    ]
    assert prof.summary is not None and prof.summary["steps"] == 2


class SlowRun:
    """A W&B run whose ``log`` takes *call_s* seconds: W&B behind training."""

    def __init__(self, call_s: float) -> None:
        self.call_s = call_s
        self.rows: list[dict] = []
        self.summary: dict = {}
        self.first_row = threading.Event()

    def define_metric(self, *args: object, **kwargs: object) -> None:
        pass

    def log(self, row: dict) -> None:
        time.sleep(self.call_s)
        self.rows.append(row)
        self.first_row.set()


class FakeWandb:
    @staticmethod
    def Table(columns: list[str], data: list[list[str]]) -> dict:  # noqa: N802 - wandb's name
        return {"columns": columns, "data": data}


def test_the_end_of_the_run_waits_at_most_finish_s_even_with_a_backlog(monkeypatch):
    monkeypatch.setattr(wandb_sink, "FINISH_S", 0.3)
    run = SlowRun(call_s=0.005)
    sink = WandbSink(run, FakeWandb, interval_s=0.01)
    for i in range(2000):  # 10 s of logging queued: the background round is in it
        sink.add(StepRecord(i, i, i + 1, 0, explicit=True, micro=1))
    assert run.first_row.wait(10)
    t = time.monotonic()
    sink.finish({"run_name": "slow", "steps": 2000, "insights": []})
    waited = time.monotonic() - t
    assert waited < 2.0  # 0.3 s and one call, not the 10 s of the whole backlog
    assert sink.logged == len(run.rows) - 1  # the findings table is the one more row
    assert sink.logged + sink.dropped == 2000 and sink.dropped > 0
    assert run.rows[-1] == {
        "gpuprof/insights": {"columns": list(wandb_sink.INSIGHT_COLUMNS), "data": []}
    }
    assert run.summary["gpuprof/steps"] == 2000
