"""Fixtures for the shim tests: a short socket dir, a fake gpuprofd made of
real ZeroMQ sockets bound in the test (ROUTER control + PULL ingest, served
by a thread), and a tiny CPU training loop."""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import zmq

from gpuprof.config import control_endpoint, ingest_endpoint
from gpuprof.protocol import ProtocolError, decode, decode_frame
from gpuprof_shim.auto.machine import StepMachine


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A fresh directory short enough for ipc paths (<= 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class FakeDaemon:
    """Answers hello/bye like gpuprofd and records every message it got.

    Every frame goes through ``gpuprof.protocol.decode`` with its channel
    (data frames through ``decode_frame``, as gpuprofd: a batch becomes its
    events in :attr:`data`, and counts one in :attr:`frames`); anything that
    fails lands in :attr:`errors`. ``bye`` is answered only once
    ``sent`` data messages have arrived (as the real daemon does), or after
    ``bye_wait_s``. *summary_extra* is merged into the summary it answers
    ``bye`` with (findings, figures a test needs). *ack_reply* answers
    ``ack`` requests (with ``"acked"`` in the hello reply, the shim's resend
    thread sends one every 0.25 s); None: they go unanswered.
    """

    def __init__(
        self,
        socket_dir: Path,
        *,
        hello_reply: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
        answer_bye: bool = True,
        bye_wait_s: float = 5.0,
        summary_extra: dict[str, Any] | None = None,
        ack_reply: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.ack_reply = ack_reply
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(control_endpoint(socket_dir))
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.setsockopt(zmq.LINGER, 0)
        self.pull.bind(ingest_endpoint(socket_dir))
        self.hello_reply = hello_reply
        self.answer_bye = answer_bye
        self.bye_wait_s = bye_wait_s
        self.summary_extra = summary_extra or {}
        self.control: list[dict[str, Any]] = []
        self.data: list[dict[str, Any]] = []
        #: Data frames (ZeroMQ messages) received.
        self.frames = 0
        #: The highest ``seq`` of the batches received (what an ``ack`` may acknowledge).
        self.last_seq = 0
        self.errors: list[str] = []
        self.db = str(socket_dir / "fake.db")
        self._pending_bye: tuple[list[bytes], dict[str, Any], float] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fake-gpuprofd", daemon=True)
        self._thread.start()

    @property
    def steps(self) -> list[dict[str, Any]]:
        return [m for m in self.data if m["type"] == "step"]

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.control if m["type"] == kind]

    def stacks_sent(self, run_key: str | None = None) -> int:
        """``stacks`` events the training process sent (of *run_key*'s run;
        not its DataLoader workers', which are not in its ``sent``): how many
        depends on when the sampler caught the loop between steps, so exact
        counts of the events sent add them."""
        return sum(
            1
            for m in self.data
            if m["type"] == "stacks"
            and m["source"] == "main"
            and (run_key is None or m["run_key"] == run_key)
        )

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.pull, zmq.POLLIN)
        while not self._stop.is_set():
            events = dict(poller.poll(20))
            if self.pull in events:
                self._take_data(self.pull.recv())
            if self.router in events:
                frames = self.router.recv_multipart()
                self._take_control(frames[:-1], frames[-1])
            self._maybe_answer_bye()

    def _take_data(self, raw: bytes) -> None:
        self.frames += 1
        try:
            events, bad, envelope = decode_frame(raw)
        except ProtocolError as exc:
            self.errors.append(f"data: {exc}")
            return
        if envelope is not None and envelope.get("seq"):
            self.last_seq = max(self.last_seq, envelope["seq"])
        self.errors += [f"data: {exc}" for exc in bad]
        self.data += events

    def _take_control(self, envelope: list[bytes], raw: bytes) -> None:
        try:
            msg = decode(raw, channel="control")
        except ProtocolError as exc:
            self.errors.append(f"control: {exc}")
            self._reply(envelope, {"ok": False, "error": str(exc)})
            return
        self.control.append(msg)
        if msg["type"] == "hello":
            reply = (
                self.hello_reply(msg)
                if self.hello_reply
                else {"ok": True, "run_id": 7, "db": self.db, "daemon_pid": 1, "notes": []}
            )
            if reply is not None:
                self._reply(envelope, reply)
        elif msg["type"] == "ack" and self.ack_reply is not None:
            self._reply(envelope, self.ack_reply(msg))
        elif msg["type"] == "bye" and self.answer_bye:
            self._pending_bye = (envelope, msg, time.monotonic() + self.bye_wait_s)

    def _maybe_answer_bye(self) -> None:
        if self._pending_bye is None:
            return
        envelope, msg, deadline = self._pending_bye
        if len(self.data) < msg["sent"] and time.monotonic() < deadline:
            return
        self._pending_bye = None
        hello = self.of_type("hello")[-1]
        summary = {
            "run_id": 7,
            "run_name": hello["run_name"],
            "status": msg["status"],
            "steps": len(self.steps),
            "avg_step_ms": 12.5,
            "median_step_ms": 12.0,
            "db": self.db,
            "insights": [],
            "notes": ["from the fake daemon"],
            **self.summary_extra,
        }
        self._reply(envelope, {"ok": True, "summary": summary})

    def _reply(self, envelope: list[bytes], obj: dict[str, Any]) -> None:
        self.router.send_multipart([*envelope, orjson.dumps(obj)])

    def close(self) -> None:
        if self.ctx.closed:
            return  # closed already (a test that replaced it)
        self._stop.set()
        self._thread.join(5)
        self.router.close(0)
        self.pull.close(0)
        self.ctx.term()


@pytest.fixture
def fake_daemon(socket_dir: Path) -> Iterator[FakeDaemon]:
    daemon = FakeDaemon(socket_dir)
    yield daemon
    daemon.close()
    assert daemon.errors == [], "the shim sent messages the protocol rejects"


@pytest.fixture
def make_daemon(socket_dir: Path) -> Iterator[Callable[..., FakeDaemon]]:
    """Build a :class:`FakeDaemon` with custom behaviour (closed at teardown)."""
    made: list[FakeDaemon] = []

    def make(**kwargs: Any) -> FakeDaemon:
        made.append(FakeDaemon(socket_dir, **kwargs))
        return made[-1]

    yield make
    for d in made:
        d.close()
    assert [e for d in made for e in d.errors] == []


@pytest.fixture
def forwards(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ``StepMachine.on_forward`` call's timestamp."""
    seen: list[int] = []
    original = StepMachine.on_forward

    def spy(self: StepMachine, t: int, thread: int = 0) -> None:
        seen.append(t)
        original(self, t, thread)

    monkeypatch.setattr(StepMachine, "on_forward", spy)
    return seen
