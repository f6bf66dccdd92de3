"""MFU end to end with a real daemon on the replayed H200: FLOPs declared by
an arch or counted by the shim (``model_info``), the dtype the shim saw,
the summary's MFU line, the run record's ``mfu`` / ``achieved_tflops``
columns and ``gpuprofctl runs --format json``."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from gpuprof.flops import TransformerArch
from gpuprof.summary import format_summary
from gpuprofd.ctl import main
from gpuprofd.storage import reads
from gpuprofd.storage.reader import open_reader
from gpuprofd.storage.reads import queries
from tests.daemon import h200_replay
from tests.daemon import helpers as h

#: The replayed H200's UUID as torch spells it (no "GPU-" prefix).
H200_UUID = "69cfecb8-dd0f-d46a-a967-785474cc5ca4"
#: Every iteration is 8 ms wait + 10 ms step (helpers.step): 18 ms median.
ITERATION_S = (h.STEP_NS + h.WAIT_NS) / 1e9
BF16_PEAK = 989.4


def _model_info(run_key: str, **fields: object) -> dict:
    return {"v": 1, "type": "model_info", "run_key": run_key, **fields}


def _start(daemons, sock_dir: Path, db: Path):
    trace = h200_replay.trace_path()
    _, client = daemons.start_ready(sock_dir, db, env={"GPUPROF_NVML": f"replay:{trace}"})
    return client


def _run(client, key: str, pid: int, options: dict, infos: list[dict]) -> dict:
    assert client.request(h.hello(key, pid, run_name=key, cuda_uuid=H200_UUID, options=options))[
        "ok"
    ]
    base = time.monotonic_ns()
    for i in range(12):
        client.push(h.step(key, i, base))
    for info in infos:
        client.push(info)
    reply = client.request(h.bye(key, sent=12 + len(infos)))
    assert reply is not None and reply["ok"], reply
    return reply["summary"]


def test_counted_flops_and_probed_dtype_give_mfu_everywhere(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "m.db"
    client = _start(daemons, sock_dir, db)
    counted = 3_367_254_360_064  # the fixture GPT's FlopCounterMode figure
    infos = [
        _model_info("counted", dtype="bfloat16", dtype_source="autocast"),
        _model_info("counted", flops_counted=float(counted), flops_step=3),
    ]
    summary = _run(client, "counted", my_pid, {}, infos)
    achieved = counted / ITERATION_S / 1e12
    assert summary["achieved_tflops"] == pytest.approx(achieved, abs=0.01)
    assert summary["mfu"] == pytest.approx(achieved / BF16_PEAK, abs=1e-4)
    compute = summary["compute"]
    assert (compute["flops_source"], compute["dtype"], compute["peak_tflops"]) == (
        "counter",
        "bf16",
        BF16_PEAK,
    )
    assert f"MFU {summary['mfu']:.1%}: {achieved:.1f} TFLOP/s achieved of 989.4 TFLOP/s bf16" in (
        format_summary(summary)
    )
    (run,) = h.query(db, "SELECT mfu, achieved_tflops, options FROM runs")
    assert (run["mfu"], run["achieved_tflops"]) == (summary["mfu"], summary["achieved_tflops"])
    opts = orjson.loads(run["options"])
    assert opts["flops_per_step"] == counted and opts["flops_step"] == 3
    assert (opts["dtype"], opts["dtype_source"]) == ("bfloat16", "autocast")
    # low_mfu fires on the counted FLOPs: 187 of 989 TFLOP/s is under 30 %
    rules = [i["rule"] for i in summary["insights"]]
    assert "low_mfu" in rules

    assert main(["runs", str(db), "--format", "json"]) == 0
    (row,) = orjson.loads(capsys.readouterr().out)
    assert (row["mfu"], row["achieved_tflops"]) == (summary["mfu"], summary["achieved_tflops"])


async def test_declared_arch_and_dtype_win_and_the_count_is_shown_beside(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "m.db"
    client = _start(daemons, sock_dir, db)
    arch = TransformerArch(layers=4, d_model=1024, heads=16, seq_len=1024, vocab=8192)
    declared = arch.flops_per_step(8 * 1024)
    options = {
        "arch": arch.to_dict(),
        "tokens_per_step": 8 * 1024,
        "flops_per_step": declared,
        "flops_source": "arch",
        "dtype": "bf16",
        "count_flops": True,
    }
    infos = [
        _model_info("arch", dtype="float32", dtype_source="params"),
        _model_info("arch", flops_counted=3_367_254_360_064.0, flops_step=3),
    ]
    summary = _run(client, "arch", my_pid, options, infos)
    compute = summary["compute"]
    assert (compute["flops_per_step"], compute["flops_source"]) == (declared, "arch")
    assert compute["dtype"] == "bf16"  # the user's, not the probe's
    assert summary["mfu"] == pytest.approx(declared / ITERATION_S / 1e12 / BF16_PEAK, abs=1e-4)
    assert "counted 3.37e+12 (+2.1%)" in format_summary(summary)
    run = h.query(db, "SELECT * FROM runs")[0]
    async with open_reader(db) as reader:
        ctx = await reads.run_context(reader, queries.run_from_row(run))
    assert ctx.arch == arch.to_dict() and ctx.flops_source == "arch"  # what rules read
    (run,) = h.query(db, "SELECT options FROM runs")
    opts = orjson.loads(run["options"])
    assert opts["arch"]["checkpointing"] is False and opts["flops_counted"] > declared


def test_unknown_mfu_says_why_and_leaves_the_columns_null(
    daemons, sock_dir: Path, tmp_path: Path, my_pid: int
) -> None:
    db = tmp_path / "m.db"
    client = _start(daemons, sock_dir, db)
    summary = _run(client, "nothing", my_pid, {}, [])
    assert (summary["mfu"], summary["achieved_tflops"]) == (None, None)
    assert "MFU unknown: no FLOP count: pass arch=" in format_summary(summary)
    summary = _run(client, "fp8-no-dtype", my_pid, {"flops_per_step": 1e12}, [])
    assert summary["mfu"] is None and summary["achieved_tflops"] == pytest.approx(55.56, 0.01)
    assert "training dtype unknown" in format_summary(summary)
    rows = h.query(db, "SELECT mfu, achieved_tflops FROM runs ORDER BY id")
    assert [(r["mfu"], r["achieved_tflops"]) for r in rows] == [(None, None), (None, 55.56)]
