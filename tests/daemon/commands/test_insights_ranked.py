"""``gpuprofctl insights`` (text and JSON) lists a stored run's findings by
what fixing each is worth, with the worth and its method; the stored
findings read back with their gains."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import orjson
import pytest

from gpuprofd.ctl import main
from tests.daemon import helpers as h


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory):
    """A database whose run 1 a real gpuprofd stored: 40 steps, every 10th
    300 ms, each waiting 20 ms on a timed loader (as :func:`_mixed`)."""
    tmp = tmp_path_factory.mktemp("gains")
    sock = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    daemons = h.Daemons(tmp)
    try:
        db = tmp / "g.db"
        proc, client = daemons.start_ready(sock, db)
        client.request(h.hello("r", os.getpid(), run_name="mixed"))
        t = time.monotonic_ns()
        for i in range(40):
            step_ns = (300 if i % 10 == 9 else 10) * 1_000_000
            t0 = t + 20_000_000
            ev = h.step("r", i, 0)
            ev.update(t0=t0, t1=t0 + step_ns, wait=20_000_000, explicit=True, phases={})
            client.push(ev)
            t = t0 + step_ns
        assert client.request(h.bye("r", sent=40))["ok"]
        assert daemons.stop(proc) == 0
        yield db
    finally:
        daemons.kill_all()
        for p in sock.iterdir():
            p.unlink()
        sock.rmdir()


def test_insights_cli_ranks_a_stored_run_by_gain(stored, capsys):
    assert main(["insights", str(stored), "1", "--format", "json"]) == 0
    data = orjson.loads(capsys.readouterr().out)
    assert [(i["rule"], i["severity"]) for i in data["insights"]][:2] == [
        ("high_step_variance", "MED"),
        ("dataloader_stall", "HIGH"),
    ]
    top = data["insights"][0]
    assert top["gain_ms_per_iteration"] == pytest.approx(31.351, abs=0.01)
    assert top["gain_parts_ms"] == {"slow_steps": pytest.approx(31.351, abs=0.01)}
    assert data["gains"]["fix_all_ms_per_iteration"] == pytest.approx(51.351, abs=0.01)
    assert main(["insights", str(stored), "1"]) == 0
    text = capsys.readouterr().out.splitlines()
    at = text.index("  Insights (3, by what fixing each is worth):")
    assert text[at - 1].startswith("  Fixing the slow steps: up to 2.0× faster")
    assert text[at + 1].startswith("  [MED]  Step compute time is erratic")
    assert text[at + 2].startswith("          Worth: up to 2.0× faster: 31.4 of 61.4 ms")
    assert text[at + 3].startswith("          How: the slow steps' time above the steady median")
    # the stored findings (the API's and the live page's) read back ranked, with gains
    (row,) = h.query(stored, "SELECT evidence FROM insights WHERE rule = 'dataloader_stall'")
    assert orjson.loads(row[0])["gain"]["gain_ms_per_iteration"] == pytest.approx(20.0)
