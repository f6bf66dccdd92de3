"""The forwarder (:mod:`gpuprofd.forward.forwarder`) in one process: a
node's store writing its outbox, and a real aiohttp server applying each
batch to a server store as ``gpuprofd serve`` does (validate, apply in one
transaction; 400/409 naming the field), unless the test's fault answers it.
What it sends, in which order, what it dead-letters, and how often it posts."""

from __future__ import annotations

import contextlib
import gzip
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gpuprofd.core.counters import DropCounter
from gpuprofd.forward.client import Paused, Retry
from gpuprofd.forward.config import ApiKey, ForwardConfig
from gpuprofd.forward.forwarder import Forwarder
from gpuprofd.storage import schema
from gpuprofd.storage.writes import (
    BatchError,
    IngestConflict,
    Store,
    apply_batch,
    outbox,
    runsdb,
    validate,
)
from tests.daemon.helpers import PHASES, query

#: (the decoded batch, its index among the posts) -> (status, JSON body), or
#: None: the server applies it.
Fault = Callable[[dict[str, Any], int], tuple[int, dict[str, Any]] | None]


class Ingest:
    """A team server's ingest over a SQLite store of its own."""

    def __init__(self, store: Store, fault: Fault | None = None) -> None:
        self.store = store
        self.fault = fault
        self.posts: list[tuple[list[int], int]] = []
        """Each post: its events' sequence numbers and the status answered."""
        self.times: list[float] = []
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/api/v1/ingest", self._ingest)
        self.server = TestServer(app, host="127.0.0.1")

    async def _ingest(self, request: web.Request) -> web.Response:
        self.times.append(time.monotonic())
        decoded = orjson.loads(gzip.decompress(await request.read()))
        seqs = [e["seq"] for e in decoded["events"]]
        answer = self.fault(decoded, len(self.posts)) if self.fault is not None else None
        if answer is None:
            answer = await self._apply(decoded)
        status, body = answer
        self.posts.append((seqs, status))
        headers = {"Retry-After": str(body.pop("retry_after"))} if "retry_after" in body else {}
        return web.json_response(body, status=status, headers=headers)

    async def _apply(self, decoded: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        try:
            applied = await apply_batch(self.store, validate(decoded))
        except BatchError as exc:
            return 400, {"error": str(exc), "field": exc.field}
        except IngestConflict as exc:
            return 409, {"error": str(exc), "field": exc.field}
        return 200, {
            "node": applied.node,
            "acked_seq": applied.acked_seq,
            "applied": applied.applied,
            "skipped": applied.skipped,
        }

    @property
    def base(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


async def _store(db: Path, forwarding: bool) -> Store:
    schema.prepare(db)
    store = Store(db, DropCounter())
    await store.open()
    store.forwarding = forwarding
    store.start()
    return store


@contextlib.asynccontextmanager
async def _setup(
    tmp_path: Path, fault: Fault | None = None
) -> AsyncIterator[tuple[Store, Ingest, Forwarder]]:
    node = await _store(tmp_path / "node.db", forwarding=True)
    server_store = await _store(tmp_path / "server.db", forwarding=False)
    ingest = Ingest(server_store, fault)
    await ingest.server.start_server(auto_decompress=False)  # the body as sent
    cfg = ForwardConfig(ingest.base, ApiKey(text="k"))
    try:
        yield node, ingest, Forwarder(node, cfg, host="node-host")
    finally:
        await ingest.server.close()
        await node.close()
        await server_store.close()


async def _run(store: Store, name: str = "r") -> tuple[int, str]:
    run_uuid = str(uuid.uuid4())
    row = {
        "run_key": run_uuid,
        "run_name": name,
        "status": "running",
        "host": "node-host",
        "pid": 7,
        "start_wall_ns": 1,
        "start_mono_ns": 2,
        "options": {},
        "run_uuid": run_uuid,
    }
    return await runsdb.insert_run(store, row), run_uuid


async def _steps(store: Store, run_id: int, first: int, n: int) -> None:
    for i in range(first, first + n):
        t0 = 1_000_000_000 + i * 10_000_000
        msg = {"i": i, "t0": t0, "t1": t0 + 9_000_000, "wait": 0, "explicit": False}
        await store.submit(runsdb.step_op(run_id, {**msg, "micro": 1, "phases": dict(PHASES)}))
    await store.flush()


def _server_steps(ingest: Ingest, run_uuid: str) -> list[int]:
    db = ingest.store.where
    sql = (
        "SELECT s.step FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.run_uuid = ? ORDER BY 1"
    )
    return [int(r[0]) for r in query(Path(db), sql, (run_uuid,))]


def _node(store: Store, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in query(Path(store.where), sql, params)]


async def test_the_outbox_goes_in_order_and_is_forgotten_once_acknowledged(tmp_path: Path) -> None:
    async with _setup(tmp_path) as (node, ingest, fwd):
        run_id, run_uuid = await _run(node)
        await _steps(node, run_id, 0, 30)
        assert await fwd.drain() == 31
        assert _server_steps(ingest, run_uuid) == list(range(30))
        assert _node(node, "SELECT COUNT(*) FROM outbox") == [(0,)]
        assert [seqs for seqs, _ in ingest.posts] == [list(range(1, 32))]
        assert fwd.status.state == "ok" and fwd.status.acked_seq == 31
        await _steps(node, run_id, 30, 5)
        assert await fwd.drain() == 5
        assert [seqs for seqs, _ in ingest.posts][1] == list(range(32, 37))
        assert await fwd.drain() == 0 and len(ingest.posts) == 2  # nothing left: no post


async def test_a_batch_refused_whole_keeps_the_runs_announcement_once(tmp_path: Path) -> None:
    def fault(_batch: dict[str, Any], index: int) -> tuple[int, dict[str, Any]] | None:
        return (400, {"error": "refused for the test"}) if index in (0, 2) else None

    async with _setup(tmp_path, fault) as (node, ingest, fwd):
        run_id, run_uuid = await _run(node)  # seq 1: the run's announcement
        await _steps(node, run_id, 0, 5)  # seqs 2-6
        assert await fwd.drain() == 6
        # the steps are dead, the run event went again with the next batch and was taken
        assert _node(node, "SELECT seq FROM outbox_dead ORDER BY seq") == [
            (s,) for s in range(2, 7)
        ]
        assert ingest.posts == [(list(range(1, 7)), 400), ([1], 200)]
        await _steps(node, run_id, 5, 3)  # seqs 7-9: refused whole, no run event to keep
        assert await fwd.drain() == 3
        await _steps(node, run_id, 8, 2)  # seqs 10-11: taken
        assert await fwd.drain() == 2
        assert ingest.posts[2:] == [([7, 8, 9], 400), ([10, 11], 200)]
        assert _server_steps(ingest, run_uuid) == [8, 9]


async def test_a_kept_announcement_refused_again_goes_too(tmp_path: Path) -> None:
    async with _setup(tmp_path, lambda _b, _i: (400, {"error": "never"})) as (node, ingest, fwd):
        run_id, _ = await _run(node)
        await _steps(node, run_id, 0, 2)
        assert await fwd.drain() == 3
        assert ingest.posts == [([1, 2, 3], 400), ([1], 400)]  # kept once, not in a loop
        assert _node(node, "SELECT seq FROM outbox_dead ORDER BY seq") == [(1,), (2,), (3,)]


async def test_a_run_the_server_refuses_is_dead_lettered_at_once_not_event_by_event(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async with _setup(tmp_path) as (node, ingest, fwd):
        run_id, run_uuid = await _run(node)
        # another node sent a run of that UUID first: the server refuses this node's
        other = {"seq": 1, "kind": "run", "run": run_uuid, "fields": _fields("other")}
        await apply_batch(ingest.store, validate({"v": 1, "node": "other", "events": [other]}))
        await _steps(node, run_id, 0, 10)
        await node.submit(runsdb.host_sample_op(5, 1.0, 1, None))
        await node.flush()
        with caplog.at_level(logging.ERROR, "gpuprofd.forward.forwarder"):
            assert await fwd.drain() == 12
            assert [status for _, status in ingest.posts] == [409, 200]  # not one post per event
            dead = _node(node, "SELECT seq, status FROM outbox_dead ORDER BY seq")
            assert dead == [(s, 409) for s in range(1, 12)]
            # its later events go straight to the dead letters, the other runs' are sent
            await _steps(node, run_id, 10, 5)
            second, second_uuid = await _run(node, "second")
            await _steps(node, second, 0, 3)
            assert await fwd.drain() == 9
        assert len(ingest.posts) == 3 and ingest.posts[2][1] == 200
        assert _server_steps(ingest, second_uuid) == [0, 1, 2]
        assert _node(node, "SELECT COUNT(*) FROM outbox_dead") == [(16,)]
        refusals = [r for r in caplog.records if "refuses run" in r.getMessage()]
        assert len(refusals) == 1 and "its 11 waiting events" in refusals[0].getMessage()
        assert "run " + run_uuid + " was sent by another node" in refusals[0].getMessage()


def _fields(host: str) -> dict[str, Any]:
    return {
        "run_name": "x",
        "status": "running",
        "start_wall_ns": 1,
        "start_mono_ns": 2,
        "host": host,
    }


async def test_413_halves_the_batch_until_it_is_taken(tmp_path: Path) -> None:
    def fault(batch: dict[str, Any], _index: int) -> tuple[int, dict[str, Any]] | None:
        return (413, {"error": "too large"}) if len(batch["events"]) > 8 else None

    async with _setup(tmp_path, fault) as (node, ingest, fwd):
        run_id, run_uuid = await _run(node)
        await _steps(node, run_id, 0, 29)  # 30 events
        assert await fwd.drain() == 30
        assert _server_steps(ingest, run_uuid) == list(range(29))
        assert _node(node, "SELECT COUNT(*) FROM outbox_dead") == [(0,)]
        taken = [seqs for seqs, status in ingest.posts if status == 200]
        assert [s for seqs in taken for s in seqs] == list(range(1, 31))  # in order, once
        assert all(len(seqs) <= 8 for seqs in taken)
        refused = [seqs for seqs, status in ingest.posts if status == 413]
        assert len(refused) == 2  # 30 -> 15 -> 7, and the size then stays: no 413 after
        assert ingest.posts.index((refused[-1], 413)) < ingest.posts.index((taken[0], 200))


async def test_a_single_event_too_large_is_dead_lettered(tmp_path: Path) -> None:
    async with _setup(tmp_path, lambda _b, _i: (413, {"error": "too large"})) as (
        node,
        ingest,
        fwd,
    ):
        await _run(node)
        assert await fwd.drain() == 1
        assert ingest.posts == [([1], 413)]
        assert _node(node, "SELECT seq, status FROM outbox_dead") == [(1, 413)]


async def test_retry_after_is_waited_and_503_retried(tmp_path: Path) -> None:
    def fault(_batch: dict[str, Any], index: int) -> tuple[int, dict[str, Any]] | None:
        if index == 0:
            return 429, {"error": "busy", "retry_after": 1}
        if index == 1:
            return 503, {"error": "database unreachable"}
        return None

    async with _setup(tmp_path, fault) as (node, ingest, fwd):
        run_id, run_uuid = await _run(node)
        await _steps(node, run_id, 0, 3)
        assert await fwd.drain() == 4
        assert [status for _, status in ingest.posts] == [429, 503, 200]
        assert all(seqs == [1, 2, 3, 4] for seqs, _ in ingest.posts)  # the same batch again
        assert ingest.times[1] - ingest.times[0] >= 1.0  # the server's Retry-After
        assert fwd.status.retries == 2 and fwd.status.state == "ok"
        assert _server_steps(ingest, run_uuid) == [0, 1, 2]


async def test_drain_stops_after_its_limit_and_keeps_the_outbox(tmp_path: Path) -> None:
    async with _setup(tmp_path, lambda _b, _i: (503, {"error": "down"})) as (node, ingest, fwd):
        await _run(node)
        with pytest.raises(Retry, match="answered 503: down"):
            await fwd.drain(give_up_after_s=0.5)
        assert _node(node, "SELECT COUNT(*) FROM outbox") == [(1,)]
        assert fwd.status.state == "retrying" and ingest.posts


async def test_events_of_a_run_deleted_on_the_node_are_given_up_not_sent(tmp_path: Path) -> None:
    async with _setup(tmp_path) as (node, ingest, fwd):
        run_id, _ = await _run(node)
        await _steps(node, run_id, 0, 4)
        await node.write("DELETE FROM runs WHERE id = ?", (run_id,))  # retention, say
        assert await fwd.drain() == 5
        assert ingest.posts == []
        assert _node(node, "SELECT kind, events FROM forward_given_up ORDER BY kind") == [
            ("run", 1),
            ("steps", 4),
        ]
        assert fwd.drops.snapshot() == {"forward_run_gone": 5}


async def test_a_missing_key_is_said_at_once_by_drain(tmp_path: Path) -> None:
    async with _setup(tmp_path) as (node, ingest, fwd):
        await _run(node)
        fwd.cfg.key = ApiKey(path=tmp_path / "no-such-key")
        with pytest.raises(Paused, match="cannot read the API key file"):
            await fwd.drain()
        assert ingest.posts == [] and _node(node, "SELECT COUNT(*) FROM outbox") == [(1,)]


async def test_a_backlog_goes_in_batches_of_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outbox, "MAX_EVENTS", 3)
    async with _setup(tmp_path) as (node, ingest, fwd):
        run_id, run_uuid = await _run(node)
        await _steps(node, run_id, 0, 8)
        async with aiohttp.ClientSession() as session:
            settled = [await fwd.send_once(session) for _ in range(4)]
        assert settled == [3, 3, 3, 0]
        assert [seqs for seqs, _ in ingest.posts] == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
        assert _server_steps(ingest, run_uuid) == list(range(8))
