"""ControlServer.reply_for: every failure becomes ok:false, counted."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from gpuprofd.core.counters import DropCounter
from gpuprofd.ingest.control import ControlServer
from gpuprofd.ingest.handlers import ControlHandlers
from gpuprofd.ingest.registry import RunRegistry


async def _boom(msg: dict[str, Any]) -> dict[str, Any]:
    raise RuntimeError("kaput")


async def _pong(msg: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True}


async def test_handler_exception_replies_ok_false_and_keeps_serving() -> None:
    drops = DropCounter()
    server = ControlServer(None, {"ping": _boom, "hello": _pong}, drops)  # type: ignore[arg-type]
    reply = await server.reply_for(orjson.dumps({"v": 1, "type": "ping"}))
    assert reply == {"ok": False, "error": "internal error: RuntimeError: kaput"}
    assert drops.snapshot() == {"control:handler_error": 1}
    bad = await server.reply_for(orjson.dumps({"v": 1, "type": "hello", "run_key": "x"}))
    assert bad["ok"] is False and "bad_field:run_name" in bad["error"]
    assert drops.snapshot() == {"control:handler_error": 1, "control:bad_field:run_name": 1}


def test_unknown_keys_are_remembered_with_their_reason() -> None:
    reg = RunRegistry()
    reg.mark_unknown("a", "run_ended")
    assert reg.unknown_reason("a") == "run_ended" and reg.unknown_reason("b") is None
    for i in range(RunRegistry.NEGATIVE_CACHE_SIZE + 5):
        reg.mark_unknown(f"k{i}")
    assert len(reg._unknown) == RunRegistry.NEGATIVE_CACHE_SIZE
    assert reg.unknown_reason("a") is None  # oldest evicted first


def test_drop_counter_hands_out_each_count_once_for_persisting() -> None:
    now = [0.0]
    drops = DropCounter(clock=lambda: now[0])
    drops.add("x")
    drops.add("x")
    assert drops.take_unpersisted() == {"x": 2}
    assert drops.take_unpersisted() == {}
    drops.add("x", n=3)
    assert drops.take_unpersisted() == {"x": 3}
    assert drops.snapshot() == {"x": 5}


def test_a_run_asking_for_another_server_hears_which_gpuprofd_forwards_where() -> None:
    handlers = ControlHandlers(
        db="runs.db",
        socket_dir=Path("sock"),
        runs=None,  # type: ignore[arg-type] - the note reads none of these
        ingest=None,  # type: ignore[arg-type]
        db_switch=None,  # type: ignore[arg-type]
        drops=DropCounter(),
        notes=(),
        flush_rollups=lambda: None,
        gpu_status=dict,
        request_stop=lambda: None,
        forward_server="https://a:8000",
    )
    assert handlers._forward_note(None) is None
    assert handlers._forward_note("https://a:8000/") is None
    assert handlers._forward_note("https://b:8000") == (
        "not forwarded to https://b:8000: the running gpuprofd of this database "
        f"(pid {os.getpid()}) forwards to https://a:8000; start it with --server "
        "https://b:8000, or gpuprofctl stop and the next run starts one that does"
    )
