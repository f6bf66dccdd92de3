"""The outbox bound reached during a long outage (``--forward-max-mb 1``):
raw samples go first, then GPU rollups and insights, then the oldest
steps; the run and its end never. What was given up is counted (status,
``forward_given_up``, the run's summary), and everything else arrives."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.forward.conftest import (
    Tap,
    db_rows,
    ended_on_server,
    free_port,
    serve,
    server_steps,
    wait_until,
)
from tests.daemon.server.conftest import TeamServer

pytestmark = pytest.mark.timeout(420)  # real torch and gpuprofd processes on a busy box

#: What the bound gives up first (lower first), by kind.
_PRIORITY = {"host_samples": 0, "run_cpu": 0, "gpu_rollups": 1, "insights": 2, "steps": 3}
#: Each kind's table, on both sides.
_TABLES = {
    "steps": "steps",
    "host_samples": "host_samples",
    "gpu_rollups": "gpu_rollups",
    "run_cpu": "run_cpu_samples",
}


def test_a_full_outbox_gives_up_in_order_and_says_so(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer], nodes: Any, taps: list[Tap]
) -> None:
    tap_port = free_port()
    url = f"http://127.0.0.1:{tap_port}"  # nothing answers there: a long outage
    node = nodes("node-a")
    daemon = node.start(url, "--forward-max-mb", "1")
    # at most 250 steps/s (~540 KiB of outbox per 5 s pass of the bound, well
    # under the bound itself): a pass never has to give up every step
    with node.training("bounded", 1_000_000, 0.004) as run:
        wait_until(
            lambda: node.count("SELECT COUNT(*) FROM forward_given_up WHERE kind = 'steps'"),
            240,
            "the bound to reach the steps",
        )
        out = run.finish()
    # the run's summary says what of it the server will not get
    assert re.search(r"\d+ events of this run were not forwarded to the team server", out), out
    (run_uuid, run_id) = node.rows("SELECT run_uuid, id FROM runs")[0]
    wait_until(
        lambda: node.count("SELECT COUNT(*) FROM outbox WHERE kind = 'end'"), 60, "the run's end"
    )
    fwd = node.status()["forward"]
    text = node.status_text()
    said = re.search(r"\n    given up: (\d+) events \([\d.]+ [KM]iB\) over the outbox bound", text)
    assert said and "(--forward-max-mb), not forwarded" in text, text
    assert node.stop(daemon) == 0
    given_up = {
        k: n for k, n in node.rows("SELECT kind, SUM(events) FROM forward_given_up GROUP BY kind")
    }
    total = sum(given_up.values())
    assert 0 < fwd["outbox"]["given_up_events"] <= total and 0 < int(said.group(1)) <= total
    assert "run" not in given_up and "end" not in given_up  # never
    assert {"host_samples", "steps"} <= set(given_up), given_up

    server = serve(tmp_path, pg_url)
    team_servers.append(server)
    tap = Tap(server.url, port=tap_port).start()
    taps.append(tap)
    again = node.start(url, "--forward-max-mb", "1")
    wait_until(lambda: ended_on_server(pg_url, run_uuid), 120, "the run's end on the server")
    node.stop(again)
    drained = node.drain()  # what the last daemon's last send left
    assert drained.returncode == 0, drained.stdout + drained.stderr
    assert node.count("SELECT COUNT(*) FROM outbox") == 0

    # counted, never silently lost: for each kind, the server's rows and the
    # rows given up make up the node's
    for kind, table in _TABLES.items():
        mine = node.count(f"SELECT COUNT(*) FROM {table}")
        (theirs,) = db_rows(pg_url, f"SELECT COUNT(*) FROM {table}")[0]
        assert theirs + given_up.get(kind, 0) == mine, (kind, theirs, given_up.get(kind), mine)
    # the oldest steps went: the server holds the last ones, each once
    steps = server_steps(pg_url, run_uuid)
    last = node.count("SELECT MAX(step) FROM steps WHERE run_id = ?", run_id)
    assert steps == list(range(given_up["steps"], last + 1))
    # raw samples, rollups and insights went before any step: none older than
    # the oldest step that reached the server was sent, but the batch that was
    # on its way when the outage began (kept whole: its first second of events)
    posts = tap.snapshot()
    sent = [(seq, kind) for p in posts for seq, kind in zip(p.seqs, p.kinds, strict=True)]
    first_step = min(seq for seq, kind in sent if kind == "steps")
    older = [(seq, kind) for seq, kind in sent if seq < first_step]
    kept = [(seq, kind) for seq, kind in older if _PRIORITY.get(kind, 4) <= _PRIORITY["steps"]]
    assert len(kept) <= 10 and all(seq <= 20 for seq, _ in kept), older
    run = db_rows(pg_url, "SELECT status, summary FROM runs")
    assert run and run[0][0] == "finished" and run[0][1] is not None
