"""Group commit of ingest batches (:class:`gpuprofd.server.grouping.IngestGroups`):
batches that wait while a transaction runs go together into the next, each
still answered with its own result."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest

from gpuprofd.server.grouping import IngestGroups, batch_rows
from gpuprofd.server.ingest_api import DECODE_IN_THREAD_BYTES
from gpuprofd.storage.writes import Applied, BatchError, validate
from tests.daemon.batches import batch, new_uuid, run_event, steps_event
from tests.daemon.server.conftest import TeamServer, db_rows
from tests.daemon.storage.test_backends import open_store


async def test_batches_waiting_together_go_in_one_transaction(storage_url: str) -> None:
    runs = [new_uuid() for _ in range(4)]
    async with open_store(storage_url) as store:
        groups = IngestGroups(store, max_inflight=1)
        first = asyncio.ensure_future(groups.apply(validate(batch("n0", [run_event(1, runs[0])]))))
        await asyncio.sleep(0)  # its transaction has started: the others wait behind it
        rest = [
            groups.apply(validate(batch(f"n{i}", [run_event(1, r), steps_event(2, r, 0)])))
            for i, r in enumerate(runs[1:], 1)
        ]
        bad = groups.apply(validate(batch("n9", [steps_event(1, new_uuid())])))
        got = await asyncio.gather(first, *rest, bad, return_exceptions=True)
        steps = (await store.fetchone("SELECT COUNT(*) FROM steps"))[0]
    assert groups.groups == 2 and groups.batches == 5  # the first alone, then the four
    assert all(isinstance(a, Applied) for a in got[:4])
    assert [a.acked_seq for a in got[1:4]] == [2, 2, 2]  # type: ignore[union-attr]
    assert isinstance(got[4], BatchError)  # its own error, the others stored
    assert steps == 15


async def test_a_group_stops_at_its_row_bound(storage_url: str) -> None:
    runs = [new_uuid() for _ in range(3)]
    batches = [
        validate(batch(f"n{i}", [run_event(1, r), steps_event(2, r, 0, n=10)]))
        for i, r in enumerate(runs)
    ]
    assert batch_rows(batches[0]) == 12  # 10 rows and 2 events
    async with open_store(storage_url) as store:
        groups = IngestGroups(store, max_inflight=1, max_rows=24)
        got = await asyncio.gather(*(groups.apply(b) for b in batches))
    # two fit in 24, the third waits for the next
    assert groups.groups == 2
    assert [a.applied for a in got] == [2, 2, 2]


@pytest.mark.parametrize("storage_url", ["sqlite"], indirect=True)
async def test_sqlite_applies_one_group_at_a_time(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        assert IngestGroups(store).max_inflight == 1


def test_nodes_posting_at_once_are_answered_each_and_stored_once(
    tmp_path: Path, storage_url: str, team_servers: list[TeamServer]
) -> None:
    """A real server on each backend, eight nodes posting together (grouped
    as they arrive): the malformed batch and the conflicting one are refused
    whole with their 4xx, the others stored; all sent again, nothing twice."""
    server = TeamServer(tmp_path, storage_url).start()
    team_servers.append(server)
    runs = {f"n{i}": new_uuid() for i in range(6)}
    for node, run in runs.items():
        assert server.ingest(batch(node, [run_event(1, run)])).status_code == 200
    bodies = [
        batch(n, [steps_event(2, r, 0, n=20), steps_event(3, r, 20, n=20)]) for n, r in runs.items()
    ]
    malformed = batch("n6", [run_event(1, new_uuid()), steps_event(2, new_uuid())])
    malformed["events"][1]["rows"][3]["t1_ns"] = 0  # before its t0_ns
    conflict = batch("n7", [run_event(1, new_uuid()), steps_event(2, runs["n0"])])
    bodies += [malformed, conflict]

    def post_all() -> list[Any]:
        with ThreadPoolExecutor(len(bodies)) as pool:
            return list(pool.map(server.ingest, bodies))

    first = post_all()
    again = post_all()
    steps = db_rows(server.storage_url, "SELECT COUNT(*) FROM steps")[0][0]
    nodes = db_rows(
        server.storage_url, "SELECT node_id, last_seq FROM ingest_nodes ORDER BY node_id"
    )
    assert [r.status_code for r in first] == [200] * 6 + [400, 409]
    assert first[6].json()["field"] == "events[1].rows[3].t1_ns"
    assert "nothing of the batch was stored" in first[6].json()["error"]
    assert first[7].json()["field"] == "events[1].run"
    assert [r.json()["applied"] for r in first[:6]] == [2] * 6
    assert [r.json()["skipped"] for r in again[:6]] == [2] * 6
    assert [r.status_code for r in again[6:]] == [400, 409]
    assert steps == 6 * 40
    assert [tuple(r) for r in nodes] == [(n, 3) for n in runs]  # n6, n7: nothing


def test_a_big_batch_is_checked_off_the_loop_and_refused_whole(
    tmp_path: Path, storage_url: str, team_servers: list[TeamServer]
) -> None:
    """A catching-up node's batch (over DECODE_IN_THREAD_BYTES once inflated)."""
    server = TeamServer(tmp_path, storage_url).start()
    team_servers.append(server)
    run = new_uuid()
    big = batch("n1", [run_event(1, run), steps_event(2, run, 0, n=8000)])
    assert len(orjson.dumps(big)) > DECODE_IN_THREAD_BYTES
    bad = batch("n1", [run_event(1, run), steps_event(2, run, 0, n=8000)])
    bad["events"][1]["rows"][7999]["micro"] = -1
    refused = server.ingest(bad)
    stored = server.ingest(big)
    steps = db_rows(server.storage_url, "SELECT COUNT(*) FROM steps")[0][0]
    assert refused.status_code == 400 and refused.json()["field"] == "events[1].rows[7999].micro"
    assert stored.status_code == 200 and stored.json()["acked_seq"] == 2
    assert steps == 8000
