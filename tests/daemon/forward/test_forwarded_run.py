"""A run forwarded while it trains: what the team server holds of it is what
the node holds (every step, GPU rollup, host sample, CPU sample, stack
sample and insight; its summary), read from both databases; on Postgres and on SQLite."""

from __future__ import annotations

import collections
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.forward.conftest import (
    ForwardNode,
    db_rows,
    ended_on_server,
    serve,
    server_steps,
    wait_until,
)
from tests.daemon.server.conftest import TeamServer, login

pytestmark = pytest.mark.timeout(300)  # real torch and gpuprofd processes on a busy box

_STEP_COLS = (
    "step, t0_ns, t1_ns, wait_ns, explicit, micro, phases, skipped, eval_ns, optimizers, "
    "mem_allocated_bytes, mem_reserved_bytes, mem_peak_bytes, traced"
)
_INSIGHT_COLS = "rule, severity, title, detail, fix, evidence"
_ROLLUP_COLS = (
    "sec_ns, uuid, n, util_min, util_mean, util_max, idle_n, mem_used_min, mem_used_mean, "
    "mem_used_max, mem_total_bytes, power_min_mw, power_mean_mw, power_max_mw, temp_min_c, "
    "temp_mean_c, temp_max_c, sm_min_mhz, sm_mean_mhz, sm_max_mhz, sm_active_max_mhz, "
    "sm_limit_mhz, mem_util_mean, reasons_n, reasons_any, capped_n, capped_sm_mean_mhz, "
    "thermal_n, thermal_sm_mean_mhz, slow_n, pcie_rx_max_bps, pcie_tx_max_bps, "
    "gpm_sm_util_mean, gpm_sm_occupancy_mean, gpm_tensor_util_mean, gpm_dram_bw_util_mean, "
    "boot_id"
)
_HOST_COLS = (
    "mono_ns, cpu_pct, cpu_count, disk_read_bps, disk_read_iops, page_cache_bytes, "
    "mem_total_bytes, swap_in_bps, boot_id"
)


def _norm(row: tuple[Any, ...], json_at: tuple[int, ...] = ()) -> tuple[Any, ...]:
    """*row* with its JSON text columns parsed (the two sides may order keys
    differently) and booleans as ints."""
    out = []
    for i, v in enumerate(row):
        if i in json_at and isinstance(v, str):
            v = json.loads(v)
            v = json.dumps(v, sort_keys=True)
        elif isinstance(v, bool):
            v = int(v)
        out.append(v)
    return tuple(out)


def _run_rows(side: str, storage: str | None, node: ForwardNode, run_uuid: str, sql: str) -> list:
    """Rows of *sql* (``{run}`` stands for the run's id there) on the node or the server."""
    if side == "node":
        (run_id,) = node.rows("SELECT id FROM runs WHERE run_uuid = ?", run_uuid)[0]
        return node.rows(sql.format(run=int(run_id)))
    assert storage is not None
    (run_id,) = db_rows(storage, "SELECT id FROM runs WHERE run_uuid = ?", (run_uuid,))[0]
    return db_rows(storage, sql.format(run=int(run_id)))


def test_a_run_forwarded_while_it_trains_is_the_same_on_the_server(
    tmp_path: Path, storage_url: str, team_servers: list[TeamServer], nodes: Any
) -> None:
    server = serve(tmp_path, storage_url)
    team_servers.append(server)
    node = nodes("node-a")
    node.start(server.url)
    with node.training("forwarded", 100_000, 0.01) as run:
        run_uuid = wait_until(
            lambda: (r := node.rows("SELECT run_uuid FROM runs")) and r[0][0], 60, "the run"
        )
        # forwarded while it trains: steps reach the server before the run ends
        wait_until(lambda: len(server_steps(storage_url, run_uuid)) >= 30, 90, "steps forwarded")
        # ... and its process tree's CPU samples, a few GPU rollups (something to compare)
        wait_until(lambda: node.count("SELECT COUNT(*) FROM run_cpu_samples") >= 2, 60, "CPU")
        wait_until(lambda: node.count("SELECT COUNT(*) FROM gpu_rollups") >= 2, 60, "rollups")
        assert run.proc.poll() is None, "the run ended before its steps were forwarded"
        out = run.finish()
    assert f"  Team server: {server.url}/runs/{run_uuid}" in out, out
    trained = int(re.search(r"TRAINED (\d+)", out).group(1))  # type: ignore[union-attr]
    wait_until(lambda: ended_on_server(storage_url, run_uuid), 60, "the run's end on the server")

    # everything the node stored up to now has been acknowledged
    (last_sec,) = node.rows("SELECT MAX(sec_ns) FROM gpu_rollups")[0]
    node_hosts = node.rows(f"SELECT {_HOST_COLS} FROM host_samples")
    (cutoff,) = node.rows("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'")[0]
    wait_until(
        lambda: node.count("SELECT COUNT(*) FROM outbox WHERE seq <= ?", cutoff) == 0,
        60,
        "the node's outbox acknowledged",
    )
    assert node.count("SELECT COUNT(*) FROM outbox_dead") == 0
    # read after the acknowledgement: the run's end flushes the second it is in,
    # whose later samples merge into that row (the server merges the same)
    node_rollups = node.rows(f"SELECT {_ROLLUP_COLS} FROM gpu_rollups WHERE sec_ns <= ?", last_sec)
    (cutoff,) = node.rows("SELECT seq FROM sqlite_sequence WHERE name = 'outbox'")[0]
    wait_until(
        lambda: node.count("SELECT COUNT(*) FROM outbox WHERE seq <= ?", cutoff) == 0,
        60,
        "the node's merged rollups acknowledged",
    )

    def both(sql: str, json_at: tuple[int, ...] = ()) -> tuple[list, list]:
        mine = [_norm(r, json_at) for r in _run_rows("node", None, node, run_uuid, sql)]
        theirs = [_norm(r, json_at) for r in _run_rows("server", storage_url, node, run_uuid, sql)]
        return mine, theirs

    steps, server_side = both(
        f"SELECT {_STEP_COLS} FROM steps WHERE run_id = {{run}} ORDER BY step", (6, 9)
    )
    assert len(steps) >= 30 and [s[0] for s in steps] == list(range(trained))
    assert server_side == steps

    insights, server_side = both(
        f"SELECT {_INSIGHT_COLS} FROM insights WHERE run_id = {{run}} ORDER BY rule, title", (5,)
    )
    assert "dataloader_stall" in {i[0] for i in insights}, insights  # something to compare
    assert server_side == insights

    cpu, server_side = both(
        "SELECT mono_ns, cores FROM run_cpu_samples WHERE run_id = {run} ORDER BY mono_ns"
    )
    assert cpu and server_side == cpu

    # the sampled stacks: the same counts per frame and step (added up once)
    stacks, server_side = both(
        "SELECT source, step, path, line, func, callee, samples FROM stack_samples "
        "WHERE run_id = {run} ORDER BY source, step, path, line, func, callee"
    )
    assert stacks and server_side == stacks

    run_cols = (
        "run_name, status, rank, world_size, start_wall_ns, end_wall_ns, median_step_ms, "
        "mfu, summary, group_id, boot_id, cuda_uuid"
    )
    mine, server_side = both(f"SELECT {run_cols} FROM runs WHERE id = {{run}}", (8,))
    assert mine[0][:2] == ("forwarded", "finished") and server_side == mine
    assert json.loads(mine[0][8])["team_url"] == f"{server.url}/runs/{run_uuid}"

    # the node's own rows (GPU rollups, host samples): each on the server exactly once
    server_rollups = collections.Counter(
        db_rows(storage_url, f"SELECT {_ROLLUP_COLS} FROM gpu_rollups")
    )
    assert node_rollups and all(server_rollups[r] == 1 for r in node_rollups)
    assert set(server_rollups) <= set(node.rows(f"SELECT {_ROLLUP_COLS} FROM gpu_rollups"))
    server_hosts = collections.Counter(
        db_rows(storage_url, f"SELECT {_HOST_COLS} FROM host_samples")
    )
    assert node_hosts and all(server_hosts[r] == 1 for r in node_hosts)
    assert set(server_hosts) <= set(node.rows(f"SELECT {_HOST_COLS} FROM host_samples"))

    # the summary's link leads to the run's page there
    (server_id,) = db_rows(storage_url, "SELECT id FROM runs WHERE run_uuid = ?", (run_uuid,))[0]
    with server.client(follow_redirects=False) as viewer:
        assert login(viewer).status_code == 200
        answer = viewer.get(f"/runs/{run_uuid}")
    assert answer.status_code == 302 and answer.headers["location"] == f"/#/run/{server_id}"
