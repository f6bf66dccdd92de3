"""Test helpers: protocol messages, a blocking client, daemon subprocesses."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import zmq

from gpuprof import config
from gpuprofd.sampling import rollup
from gpuprofd.storage import commpack

STEP_NS = 10_000_000
WAIT_NS = 8_000_000
PHASES = {"forward": 3_000_000, "backward": 4_000_000, "optimizer": 2_000_000}


@contextlib.asynccontextmanager
async def open_store(url: str, drops: Any = None) -> AsyncIterator[Any]:
    """A :class:`gpuprofd.storage.writes.store.Store` on *url* (a storage URL or a
    path; a SQLite file is created with the schema), counting into *drops*
    (a :class:`~gpuprofd.core.counters.DropCounter`, or a new one), its writer
    started; closed afterwards."""
    from gpuprofd.core.counters import DropCounter
    from gpuprofd.storage import schema
    from gpuprofd.storage.url import parse
    from gpuprofd.storage.writes import Store

    parsed = parse(url)
    if parsed.path is not None:
        schema.prepare(parsed.path)
    store = Store(parsed, drops or DropCounter())
    await store.open()
    store.start()
    try:
        yield store
    finally:
        await store.close()


def hello(run_key: str, pid: int, run_name: str = "test-run", **extra: Any) -> dict[str, Any]:
    return {
        "v": 1,
        "type": "hello",
        "run_key": run_key,
        "run_name": run_name,
        "pid": pid,
        "host": "testhost",
        "rank": 0,
        "local_rank": 0,
        "world_size": 1,
        "wall_ns": time.time_ns(),
        "mono_ns": time.monotonic_ns(),
        "auto": True,
        "options": {},
        **extra,
    }


def step(run_key: str, i: int, base_ns: int, micro: int = 1) -> dict[str, Any]:
    t0 = base_ns + i * (STEP_NS + WAIT_NS)
    return {
        "v": 1,
        "type": "step",
        "run_key": run_key,
        "i": i,
        "t0": t0,
        "t1": t0 + STEP_NS,
        "wait": WAIT_NS,
        "explicit": False,
        "micro": micro,
        "phases": dict(PHASES),
    }


def bye(run_key: str, sent: int, dropped: int = 0, status: str = "finished") -> dict[str, Any]:
    return {
        "v": 1,
        "type": "bye",
        "run_key": run_key,
        "status": status,
        "sent": sent,
        "dropped": dropped,
        "mono_ns": time.monotonic_ns(),
        "wall_ns": time.time_ns(),
    }


class Client:
    """Blocking shim stand-in: a PUSH for data, a fresh REQ per request."""

    def __init__(self, sock_dir: Path) -> None:
        self.sock_dir = sock_dir
        self.ctx = zmq.Context()
        self.pusher = self.ctx.socket(zmq.PUSH)
        self.pusher.setsockopt(zmq.LINGER, 2000)
        self.pusher.connect(config.ingest_endpoint(sock_dir))

    def push(self, msg: dict[str, Any] | bytes) -> None:
        self.pusher.send(msg if isinstance(msg, bytes) else orjson.dumps(msg))

    def request(self, msg: dict[str, Any], timeout_s: float = 10.0) -> dict[str, Any] | None:
        sock = self.ctx.socket(zmq.REQ)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(config.control_endpoint(self.sock_dir))
            sock.send(msg if isinstance(msg, bytes) else orjson.dumps(msg))
            if not sock.poll(int(timeout_s * 1000)):
                return None
            return orjson.loads(sock.recv())
        finally:
            sock.close(0)

    def ping(self, timeout_s: float = 1.0) -> dict[str, Any] | None:
        return self.request({"v": 1, "type": "ping"}, timeout_s)

    def wait_for(self, pred: Any, timeout_s: float = 15.0) -> dict[str, Any]:
        """Poll ping until *pred(reply)* holds; return that reply."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            last = self.ping(0.5)
            if last is not None and pred(last):
                return last
            time.sleep(0.05)
        raise AssertionError(f"condition not met within {timeout_s}s; last ping: {last}")

    def close(self) -> None:
        self.pusher.close(0)
        self.ctx.term()


class Daemons:
    """Starts ``python -m gpuprofd`` children; kills any left at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: list[subprocess.Popen[bytes]] = []
        self.clients: list[Client] = []

    def start(
        self,
        sock_dir: Path,
        db: Path,
        *args: str,
        env: dict[str, str] | None = None,
        prelude: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """``python -m gpuprofd``; with *prelude*, that Python code runs in the
        daemon's process first (``python -c``), e.g. to swap in a failing rule."""
        log = open(self.log_dir / f"daemon{len(self.procs)}.log", "wb")  # noqa: SIM115
        full_env = {**os.environ, **(env or {})}
        entry = ["-m", "gpuprofd"]
        if prelude is not None:
            code = f"{prelude}\nimport sys\nfrom gpuprofd.__main__ import main\n"
            entry = ["-c", code + "sys.exit(main(sys.argv[1:]))"]
        proc = subprocess.Popen(
            [
                sys.executable,
                *entry,
                "--socket-dir",
                str(sock_dir),
                "--db",
                str(db),
                "--log-level",
                "debug",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
        )
        log.close()
        self.procs.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.log_dir / f"daemon{self.procs.index(proc)}.log").read_text()

    def start_ready(
        self, sock_dir: Path, db: Path, *args: str, **kw: Any
    ) -> tuple[subprocess.Popen[bytes], Client]:
        """Start a daemon and wait (by ping) until it answers as that process."""
        proc = self.start(sock_dir, db, *args, **kw)
        client = self.client(sock_dir)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise AssertionError(f"daemon exited {proc.returncode}: {self.log(proc)}")
            reply = client.ping(0.3)
            if reply is not None and reply.get("pid") == proc.pid:
                return proc, client
            time.sleep(0.05)
        raise AssertionError(f"daemon not ready: {self.log(proc)}")

    def client(self, sock_dir: Path) -> Client:
        """A client closed at teardown."""
        client = Client(sock_dir)
        self.clients.append(client)
        return client

    def stop(self, proc: subprocess.Popen[bytes], timeout_s: float = 20) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=timeout_s)

    def kill_all(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
        for c in self.clients:
            c.close()


@contextlib.contextmanager
def daemons_on_own_socket(log_dir: Path) -> Iterator[tuple[Daemons, Path]]:
    """:class:`Daemons` logging to *log_dir* and a short socket directory of
    their own, with neither ``GPUPROF_NVML`` nor ``GPUPROF_GPU_RATE`` from the
    environment; the daemons killed and the directory removed at the end."""
    sock_dir = Path(tempfile.mkdtemp(prefix="gp", dir="/tmp"))
    daemons = Daemons(log_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("GPUPROF_NVML", raising=False)
        mp.delenv("GPUPROF_GPU_RATE", raising=False)
        try:
            yield daemons, sock_dir
        finally:
            daemons.kill_all()
            shutil.rmtree(sock_dir, ignore_errors=True)


def query(db: Path, sql: str, params: tuple[Any, ...] = ()) -> list[sqlite3.Row]:
    """Read the daemon's database from the outside (read-only)."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    conn.row_factory = sqlite3.Row
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def buckets(db: Path, run_id: int | None = None) -> list[tuple[Any, ...]]:
    """The database's bucket rows (of run *run_id*; None: every run), by run and step."""
    where = "" if run_id is None else f" WHERE run_id = {int(run_id)}"
    rows = query(db, f"SELECT run_id, step, packed FROM comm_steps{where} ORDER BY run_id, step")
    return [(r[0], *b) for r in rows for b in commpack.bucket_rows([(r[1], r[2])])]


def insert_buckets(conn: sqlite3.Connection, rows: Any) -> None:
    """Bucket rows ``(run_id, step, bucket, start_ns, end_ns, bytes)`` stored as
    gpuprofd stores them (one packed ``comm_steps`` row a run's step)."""
    by_run: dict[int, list[tuple[Any, ...]]] = {}
    for r in rows:
        by_run.setdefault(r[0], []).append(tuple(r[1:]))
    for run_id, mine in by_run.items():
        conn.executemany(commpack.INSERT_SQL, commpack.step_rows(run_id, mine))


def insert_rollups(conn: sqlite3.Connection, rows: Any) -> None:
    """GPU rollup rows (``rollup.ROLLUP_COLUMNS`` order) stored as gpuprofd
    stores them (their ``gpus`` rows, then ``gpu_seconds``)."""
    rows = list(rows)
    conn.executemany(rollup.GPU_SQL, rollup.gpu_rows(rows))
    conn.executemany(rollup.INSERT_SQL, [rollup.insert_params(r) for r in rows])


def poll_db(db: Path, sql: str, params: tuple[Any, ...], want: Any, timeout_s: float = 15) -> None:
    """Poll until the first column of the first row of *sql* equals *want*."""
    deadline = time.monotonic() + timeout_s
    got = None
    while time.monotonic() < deadline:
        rows = query(db, sql, params)
        got = rows[0][0] if rows else None
        if got == want:
            return
        time.sleep(0.05)
    raise AssertionError(f"{sql} -> {got!r}, wanted {want!r}")
