"""``gpuprofctl drain``: a daemon stopped with a backlog (the server was
down); drain refuses beside a daemon serving the database, stops (exit 1)
while the server is still down, then sends everything once it is up; a
second drain sends nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.forward.conftest import (
    TRAIN,
    db_rows,
    ended_on_server,
    free_port,
    node_ledger,
    serve,
    server_steps,
)
from tests.daemon.server.conftest import TeamServer

pytestmark = pytest.mark.timeout(300)  # real torch and gpuprofd processes on a busy box


def test_drain_sends_a_stopped_daemons_backlog_once(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer], nodes: Any
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"  # down until the drain
    node = nodes("node-a")
    daemon = node.start(url)
    trained = node.run_script(TRAIN, "drained", "40", "0.01")
    assert trained.returncode == 0, trained.stderr
    assert node.stop(daemon) == 0  # its last send found no server: the backlog stays
    backlog = node.count("SELECT COUNT(*) FROM outbox")
    kinds = {r[0] for r in node.rows("SELECT DISTINCT kind FROM outbox")}
    assert {"run", "steps", "insights", "end"} <= kinds, kinds
    (run_uuid,) = node.rows("SELECT run_uuid FROM runs")[0]

    # a daemon serves the database: it would forward by itself, drain refuses
    other = node.start(None)
    refused = node.drain()
    assert refused.returncode != 0 and "is served by a running gpuprofd" in refused.stderr
    assert node.stop(other) == 0
    assert node.count("SELECT COUNT(*) FROM outbox") == backlog

    # the server still down: drain gives up, saying so, and keeps everything
    down = node.drain("--give-up-after", "1")
    assert down.returncode == 1, down.stdout + down.stderr
    assert f"{backlog} events left in the outbox: run gpuprofctl drain again" in down.stdout
    assert node.count("SELECT COUNT(*) FROM outbox") == backlog

    server = serve(tmp_path, pg_url, port)
    team_servers.append(server)
    first = node.drain()  # the server it last forwarded to, remembered in the database
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"sending {backlog} events to {url}" in first.stderr  # the progress bar
    assert f"-> {url}: {backlog} events sent" in first.stdout
    assert "everything was acknowledged" in first.stdout
    assert node.count("SELECT COUNT(*) FROM outbox") == 0
    assert ended_on_server(pg_url, run_uuid)
    steps = [int(r[0]) for r in node.rows("SELECT step FROM steps ORDER BY step")]
    assert steps == list(range(40)) and server_steps(pg_url, run_uuid) == steps
    insights = node.rows("SELECT rule, title FROM insights ORDER BY rule, title")
    assert insights and db_rows(
        pg_url, "SELECT rule, title FROM insights ORDER BY rule, title"
    ) == [tuple(r) for r in insights]
    ledger = node_ledger(pg_url)
    ((last_seq, applied, _batches),) = ledger
    assert applied == last_seq == backlog  # every event of the backlog, once

    second = node.drain("--format", "json")
    assert second.returncode == 0, second.stdout + second.stderr
    out = json.loads(second.stdout)
    assert (out["sent"], out["left"], out["refused"], out["ok"]) == (0, 0, 0, True)
    assert node_ledger(pg_url) == ledger  # not even an empty batch was posted
