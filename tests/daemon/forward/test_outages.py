"""Outages: the team server killed mid-run and back 10 s later, a node
daemon killed mid-run with a backlog and started again. Nothing is lost,
nothing is applied twice, and training never waits on either."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.forward.conftest import (
    ForwardNode,
    Tap,
    db_rows,
    ended_on_server,
    free_port,
    kill_server,
    node_ledger,
    serve,
    server_steps,
    wait_until,
)
from tests.daemon.server.conftest import TeamServer

pytestmark = pytest.mark.timeout(420)  # real torch and gpuprofd processes on a busy box

#: The outage the issue names, seconds.
OUTAGE_S = 10.0


def _run_uuid(node: ForwardNode) -> str:
    return str(
        wait_until(lambda: (r := node.rows("SELECT run_uuid FROM runs")) and r[0][0], 60, "run")
    )


def _node_steps(node: ForwardNode, run_uuid: str) -> list[int]:
    rows = node.rows(
        "SELECT s.step FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.run_uuid = ? "
        "ORDER BY s.step",
        run_uuid,
    )
    return [int(r[0]) for r in rows]


def _acked_up_to_now(node: ForwardNode) -> int:
    """Wait until every outbox event the node has written so far was acknowledged;
    return the highest of them."""
    (cutoff,) = node.rows("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'")[0]
    wait_until(
        lambda: node.count("SELECT COUNT(*) FROM outbox WHERE seq <= ?", cutoff) == 0,
        120,
        "the node's outbox acknowledged",
    )
    return int(cutoff)


def _trained(out: str) -> int:
    found = re.search(r"TRAINED (\d+)", out)
    assert found, out
    return int(found.group(1))


def test_the_server_killed_mid_run_and_back_10_s_later(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer], nodes: Any
) -> None:
    port = free_port()
    server = serve(tmp_path, pg_url, port)
    team_servers.append(server)
    node = nodes("node-a")
    node.start(server.url)
    with node.training("outage", 100_000, 0.01) as run:
        run_uuid = _run_uuid(node)
        wait_until(lambda: len(server_steps(pg_url, run_uuid)) >= 20, 90, "steps forwarded")
        kill_server(server)
        at_kill = len(_node_steps(node, run_uuid))
        time.sleep(OUTAGE_S)
        # training went on: its steps kept reaching the node while the server was gone
        at_restart = len(_node_steps(node, run_uuid))
        assert run.proc.poll() is None and at_restart > at_kill, (at_kill, at_restart)
        fwd = node.status()["forward"]
        assert fwd["state"] == "retrying" and "no answer from" in fwd["last_error"], fwd
        assert fwd["outbox"]["events"] > 0  # kept for the server's return
        again = serve(tmp_path, pg_url, port)
        team_servers.append(again)
        assert again.url == server.url
        wait_until(
            lambda: len(server_steps(pg_url, run_uuid)) >= at_restart, 120, "the backlog sent"
        )
        out = run.finish()
    wait_until(lambda: ended_on_server(pg_url, run_uuid), 120, "the run's end on the server")
    cutoff = _acked_up_to_now(node)

    steps = _node_steps(node, run_uuid)
    assert steps == list(range(_trained(out)))  # the node missed none ...
    assert server_steps(pg_url, run_uuid) == steps  # ... and the server has each exactly once
    # every event the node wrote was applied once: the server's sequence has
    # no gap and counts no event twice (a batch it applied but never answered
    # when it was killed was sent again and skipped)
    ((last_seq, applied, _batches),) = node_ledger(pg_url)
    assert last_seq >= cutoff and applied == last_seq
    assert "forwarding to" in node.log() and " again (" in node.log()  # said when it came back


def test_a_node_daemon_killed_with_a_backlog_resumes_it_in_order_once(
    tmp_path: Path, pg_url: str, team_servers: list[TeamServer], nodes: Any, taps: list[Tap]
) -> None:
    tap_port, server_port = free_port(), free_port()
    url = f"http://127.0.0.1:{tap_port}"  # nothing answers there yet: a backlog builds
    node = nodes("node-a")
    daemon = node.start(url)
    with node.training("crashed", 100_000, 0.01) as run:
        run_uuid = _run_uuid(node)
        wait_until(lambda: len(_node_steps(node, run_uuid)) >= 40, 90, "steps on the node")
        node.kill(daemon)
        backlog = node.rows("SELECT seq, kind FROM outbox ORDER BY seq")
        out = run.finish()  # training outlives its daemon
    kinds = {k for _, k in backlog}
    assert {"run", "steps", "host_samples", "gpu_rollups"} <= kinds, kinds
    stored = _node_steps(node, run_uuid)

    server = serve(tmp_path, pg_url, server_port)
    team_servers.append(server)
    tap = Tap(server.url, port=tap_port).start()
    taps.append(tap)
    node.start(url)  # the same server URL: now the tap in front of the server
    wait_until(lambda: ended_on_server(pg_url, run_uuid), 120, "the run's end on the server")
    _acked_up_to_now(node)

    ((last_seq, applied, _batches),) = node_ledger(pg_url)
    posts = tap.snapshot()
    assert posts and all(p.status == 200 for p in posts), [(p.status, p.seqs[:3]) for p in posts]
    sent = [seq for p in posts for seq in p.seqs]
    assert sent == sorted(set(sent))  # in sequence order, none sent twice
    assert sent[: len(backlog)] == [seq for seq, _ in backlog]  # the backlog first, all of it
    assert server_steps(pg_url, run_uuid) == stored == list(range(len(stored)))
    assert applied == last_seq and last_seq in sent  # each applied once, none skipped
    # the restarted daemon found the run's process gone: it ended as lost, there too
    assert _trained(out) >= len(stored)
    status = node.rows("SELECT status FROM runs WHERE run_uuid = ?", run_uuid)[0][0]
    assert status == "lost"
    assert db_rows(pg_url, "SELECT status FROM runs") == [("lost",)]
