"""The data sender and control requests against real ZeroMQ sockets."""

from __future__ import annotations

import os
import threading
import time
import warnings

import orjson
import pytest
import zmq

from gpuprof.config import control_endpoint, ingest_endpoint
from gpuprof.protocol import decode
from gpuprof_shim import control
from gpuprof_shim.sender import Sender


def step_msg(i: int) -> dict:
    return {
        "v": 1,
        "type": "step",
        "run_key": "k",
        "i": i,
        "t0": 1,
        "t1": 2,
        "wait": 0,
        "explicit": False,
        "micro": 1,
        "phases": {},
    }


_test_sockets: list[zmq.Socket] = []


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    while _test_sockets:
        _test_sockets.pop().close(0)
    ctx.term()


def bind(ctx: zmq.Context, kind: int, endpoint: str, **opts: int) -> zmq.Socket:
    """A socket bound in the test; closed by the ``zctx`` fixture."""
    sock = ctx.socket(kind)
    _test_sockets.append(sock)
    for opt, val in opts.items():
        sock.setsockopt(getattr(zmq, opt), val)
    sock.bind(endpoint)
    return sock


def recv_all(sock: zmq.Socket, n: int, timeout_ms: int = 3000) -> list[dict]:
    out = []
    while len(out) < n and sock.poll(timeout_ms):
        out.append(decode(sock.recv(), channel="data"))
    return out


def test_sends_reach_a_pull_socket_and_are_counted(socket_dir, zctx):
    pull = bind(zctx, zmq.PULL, ingest_endpoint(socket_dir))
    sender = Sender(ingest_endpoint(socket_dir))
    assert sender.connect()
    time.sleep(0.05)  # let the ipc connection complete (IMMEDIATE drops before it)
    assert all(sender.send(step_msg(i)) for i in range(5))
    assert [m["i"] for m in recv_all(pull, 5)] == [0, 1, 2, 3, 4]
    assert (sender.sent, sender.dropped) == (5, 0)
    sender.close()
    assert not sender.send(step_msg(9))  # closed: counted, never reopened
    assert (sender.sent, sender.dropped, sender.context) == (5, 1, None)


def test_no_peer_drops_without_blocking(socket_dir):
    sender = Sender(ingest_endpoint(socket_dir))
    t = time.monotonic()
    results = [sender.send(step_msg(i)) for i in range(2000)]
    elapsed = time.monotonic() - t
    sender.close()
    assert not any(results)
    assert (sender.sent, sender.dropped) == (0, 2000)
    assert elapsed < 2.0  # NOBLOCK + IMMEDIATE: no waiting for a peer


def test_queue_is_bounded_when_the_peer_stops_reading(socket_dir, zctx):
    bind(zctx, zmq.PULL, ingest_endpoint(socket_dir), RCVHWM=10)  # bound, never read
    sender = Sender(ingest_endpoint(socket_dir), sndhwm=10)
    sender.connect()
    time.sleep(0.05)
    for i in range(5000):
        sender.send(step_msg(i))
    assert sender.dropped > 0
    assert sender.sent + sender.dropped == 5000
    assert sender.sent < 5000
    sender.close()


def test_unencodable_message_counts_a_drop(socket_dir):
    sender = Sender(ingest_endpoint(socket_dir))
    assert not sender.send({"v": 1, "type": "step", "bad": object()})
    assert sender.dropped == 1
    sender.close()


def test_simulated_fork_rebuilds_state_and_never_touches_the_parents_socket(
    socket_dir, zctx, monkeypatch
):
    pull = bind(zctx, zmq.PULL, ingest_endpoint(socket_dir))
    sender = Sender(ingest_endpoint(socket_dir))  # default getpid: os.getpid
    sender.connect()
    time.sleep(0.05)
    assert sender.send(step_msg(0))
    parent_ctx = sender.context
    parent_sock = sender._state.sock
    parent_pid = os.getpid()

    monkeypatch.setattr(os, "getpid", lambda: parent_pid + 100_000)
    assert not sender.send(step_msg(1))
    assert (sender.sent, sender.dropped) == (0, 1)  # the child's own counters
    assert sender.context is None  # no context is created in a fork child
    assert sender._state.sock is None and sender._state.pid == parent_pid + 100_000
    sender.close()  # a child's close must not close the parent's socket
    assert not parent_sock.closed and not parent_ctx.closed
    assert [m["i"] for m in recv_all(pull, 2, timeout_ms=300)] == [0]

    parent_sock.close(0)
    parent_ctx.term()


def test_real_fork_child_drops_and_parent_keeps_sending(socket_dir, zctx):
    pull = bind(zctx, zmq.PULL, ingest_endpoint(socket_dir))
    sender = Sender(ingest_endpoint(socket_dir))
    sender.connect()
    time.sleep(0.05)
    r, w = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: only the at-fork hook has run
        try:
            ok = sender.send(step_msg(99))
            os.write(w, orjson.dumps([ok, sender.sent, sender.dropped, sender.context is None]))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        child = orjson.loads(f.read())
    os.waitpid(pid, 0)
    assert child == [False, 0, 1, True]
    assert sender.send(step_msg(1))
    assert [m["i"] for m in recv_all(pull, 1)] == [1]
    assert (sender.sent, sender.dropped) == (1, 0)
    sender.close()


def serve_router(sock: zmq.Socket, replies: list[bytes]) -> threading.Thread:
    def run() -> None:
        for reply in replies:
            if not sock.poll(3000):
                return
            frames = sock.recv_multipart()
            decode(frames[-1], channel="control")
            sock.send_multipart([*frames[:-1], reply])

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


PING = {"v": 1, "type": "ping"}


def test_control_request_gets_the_reply(socket_dir, zctx):
    router = bind(zctx, zmq.ROUTER, control_endpoint(socket_dir))
    t = serve_router(router, [orjson.dumps({"ok": True, "x": 1}), b"not json", b"[1, 2]"])
    ep = control_endpoint(socket_dir)
    assert control.request(None, ep, PING, 2000) == {"ok": True, "x": 1}
    assert control.request(zctx, ep, PING, 2000) is None  # not JSON
    assert control.request(zctx, ep, PING, 2000) is None  # not an object
    t.join(5)


def test_control_request_to_nobody_times_out_quickly(socket_dir):
    t = time.monotonic()
    assert control.request(None, control_endpoint(socket_dir), PING, 500) is None
    assert time.monotonic() - t < 2.0


def test_control_request_unanswered_times_out_at_receive(socket_dir, zctx):
    bind(zctx, zmq.ROUTER, control_endpoint(socket_dir))  # bound, never answers
    t = time.monotonic()
    assert control.request(zctx, control_endpoint(socket_dir), PING, 300) is None
    assert 0.25 < time.monotonic() - t < 2.0


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (
            {"ok": True, "run_id": 3, "db": "/x.db", "daemon_pid": 9, "notes": ["n", 5]},
            {"ok": True, "run_id": 3, "db": "/x.db", "daemon_pid": 9, "notes": ["n"]},
        ),
        ({"ok": False, "error": "full"}, {"ok": False, "error": "full"}),
        ({"ok": True, "run_id": "3", "db": "/x.db"}, None),
        ({"ok": True, "db": "/x.db"}, None),
        ({"ok": 1}, None),
        ({}, None),
        (None, None),
    ],
)
def test_parse_hello_reply(reply, expected):
    assert control.parse_hello_reply(reply) == expected


def test_parse_bye_reply():
    summary = {"run_name": "r", "steps": 1}
    assert control.parse_bye_reply({"ok": True, "summary": summary}) == summary
    assert control.parse_bye_reply({"ok": False, "error": "x"}) is None
    assert control.parse_bye_reply({"ok": True, "summary": {"steps": 1}}) is None
    assert control.parse_bye_reply(None) is None


def test_wait_connected_holds_until_a_late_peer_binds(socket_dir, zctx):
    sender = Sender(ingest_endpoint(socket_dir))
    sender.connect()  # before anyone binds: ZeroMQ retries the connect itself
    assert not sender.wait_connected(100)
    assert not sender.send(step_msg(0))  # IMMEDIATE: no peer, no queueing
    pull = bind(zctx, zmq.PULL, ingest_endpoint(socket_dir))
    assert sender.wait_connected(3000)
    assert sender.send(step_msg(1))
    assert [m["i"] for m in recv_all(pull, 1)] == [1]
    assert (sender.sent, sender.dropped) == (1, 1)
    sender.close()
    assert not sender.wait_connected(10)
