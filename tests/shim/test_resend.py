"""The shim's resend buffer: bounded, its overflow counted, messages kept in
the shim's order until gpuprofd acknowledges them, a backlog sent in order
once a daemon is there (real ZeroMQ sockets)."""

from __future__ import annotations

from pathlib import Path

import orjson
import zmq

from gpuprof.config import ingest_endpoint
from gpuprof_shim.link import DaemonLink
from gpuprof_shim.resend import ResendBuffer
from gpuprof_shim.sender import Sender


def test_the_buffer_is_bounded_and_counts_what_it_gives_up() -> None:
    buf = ResendBuffer(max_bytes=1000)
    entries = [buf.add(bytes(300), 2) for _ in range(10)]
    assert [e.seq for e in entries] == list(range(1, 11))
    assert len(buf) == 3 and buf.bytes == 900  # the newest three fit
    assert buf.overflowed == 14 and buf.overflowed_unsent == 14  # 7 messages × 2 events
    assert buf.lost == 7  # the daemon is told not to wait for 1..7
    assert [e.seq for e in buf.pending()] == [8, 9, 10]


def test_ack_frees_up_to_the_acknowledged_seq_and_a_resend_starts_at_the_oldest() -> None:
    buf = ResendBuffer()
    entries = [buf.add(b"m%d" % i, 1) for i in range(5)]
    for e in entries:
        buf.mark_sent(e)
    assert buf.unsent == 0 and list(buf.pending()) == []
    assert buf.ack(3) == 3
    assert len(buf) == 2 and buf.acked == 3 and buf.overflowed == 0
    buf.resend_all()  # a new daemon: 4 and 5 were sent to the dead one
    assert buf.backlog and [e.seq for e in buf.pending()] == [4, 5]
    assert buf.ack(5) == 2 and len(buf) == 0 and buf.bytes == 0


def _events(n: int, start: int = 0) -> list[dict]:
    return [{"type": "mark", "name": f"e{i}", "t": i} for i in range(start, start + n)]


def test_without_a_daemon_messages_wait_in_order_and_go_once_it_is_there(
    socket_dir: Path,
) -> None:
    endpoint = ingest_endpoint(socket_dir)
    sender = Sender(endpoint)
    sender.keep_unacked(ResendBuffer(max_bytes=4 << 10))
    assert sender.connect()
    for k in range(40):  # no daemon: nothing can go, nothing blocks
        assert sender.send_batch("r", _events(2, 2 * k)) == 2
    buf = sender.buffer
    assert buf is not None and buf.backlog and buf.unsent == len(buf)
    assert buf.overflowed > 0 and sender.dropped == buf.overflowed  # said in the summary
    kept = [e.seq for e in buf.pending()]
    assert kept == list(range(41 - len(kept), 41))

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind(endpoint)
    try:
        assert sender.poll_out(5000)
        assert sender.drain()  # the resend thread's job: all of it, in order
        got = [orjson.loads(pull.recv()) for _ in kept]
        assert [m["seq"] for m in got] == kept
        assert {m["lost"] for m in got} == {kept[0] - 1}
        assert sender.sent == 2 * len(kept)
        sender.ack(kept[-1])
        assert len(buf) == 0
        # the backlog is over: the next message goes straight out
        sender.send_batch("r", _events(1, 100))
        assert not buf.backlog and orjson.loads(pull.recv())["seq"] == 41
    finally:
        sender.close()
        pull.close()
        ctx.term()


def test_an_overflow_is_said_in_the_summary(socket_dir: Path) -> None:
    link = DaemonLink(socket_dir, str(socket_dir / "g.db"), autostart=False)
    link.sender = Sender(ingest_endpoint(socket_dir))
    assert link.overflow_note() is None  # fire-and-forget: nothing kept, nothing given up
    link.sender.keep_unacked(ResendBuffer(max_bytes=1 << 20))
    assert link.overflow_note() is None
    assert link.sender.buffer is not None
    for _ in range(5):
        link.sender.buffer.add(bytes(300 << 10), 64)  # five bursts of 64 steps, 300 KiB each
    assert link.overflow_note() == (
        "128 events given up: gpuprofd did not acknowledge them while 1 MiB waited "
        "in the training process (the resend buffer's bound)"
    )
    link.close()
