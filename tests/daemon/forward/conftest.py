"""Real processes for the forwarding tests: node daemons with ``--server``
(each its own socket directory and database), a real ``gpuprofd serve``
(:class:`~tests.daemon.server.conftest.TeamServer`) on a port that survives
its restart, real CPU torch loops, and :class:`Tap`, a recording proxy in
front of the server (what each batch held, in the order sent; a batch it
answers itself, e.g. a 400)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.daemon.server.conftest import KEY_ONE, TeamServer, db_rows, team_servers  # noqa: F401
from tests.integration.conftest import Node, ping, wait_for

#: A real CPU torch loop: MAX_STEPS steps, or fewer once the file STOP exists;
#: its DataLoader's collate sleeps SLEEP_S per batch (a paced loop, and a
#: loader stall the rules name). Prints TRAINED <steps>.
TRAIN = r"""
import os, sys, time
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
import gpuprof

NAME, MAX_STEPS, SLEEP_S = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
STOP = sys.argv[4] if len(sys.argv) > 4 else ""

class Data(Dataset):
    def __len__(self): return 10**7
    def __getitem__(self, i): return torch.full((32,), float(i % 7)), i % 4

def collate(items):
    if SLEEP_S:
        time.sleep(SLEEP_S)
    xs, ys = zip(*items)
    return torch.stack(xs), torch.tensor(ys)

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.CrossEntropyLoss()
done = 0
with gpuprof.profile(NAME):
    it = iter(DataLoader(Data(), batch_size=16, collate_fn=collate))
    for step in range(MAX_STEPS):
        if STOP and os.path.exists(STOP):
            break
        x, y = next(it)
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        done += 1
print("TRAINED", done, flush=True)
"""

#: What a node's environment must not inherit (the test names its server itself).
_FORWARD_ENV = ("GPUPROF_SERVER", "GPUPROF_API_KEY", "GPUPROF_API_KEY_FILE", "GPUPROF_NVML")


def free_port() -> int:
    """A loopback port free now (a server restarted on it keeps its URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Training:
    """A training process of :meth:`ForwardNode.training` and its stop file."""

    proc: Any
    stop: Path

    def finish(self, timeout_s: float = 120) -> str:
        """Ask it to stop, wait for it; its stdout (the summary).

        Raises:
            AssertionError: it failed (its stderr said).
        """
        self.stop.touch()
        out, err = self.proc.communicate(timeout=timeout_s)
        assert self.proc.returncode == 0, err
        return str(out)


class ForwardNode(Node):
    """One node: a gpuprofd with ``--server`` on its own socket dir and
    database (a mock GPU: per-second GPU rollups to forward), its training
    scripts pointed at it."""

    def __init__(self, root: Path, name: str) -> None:
        workdir = root / name
        workdir.mkdir(parents=True, exist_ok=True)
        super().__init__(
            socket_dir=Path(tempfile.mkdtemp(prefix="gp", dir="/tmp")),
            db=workdir / "gpuprof.db",
            workdir=workdir,
        )
        self.name = name
        self.key_file = workdir / "api-key"
        self.key_file.write_text(KEY_ONE + "\n")
        self.log_path = workdir / "gpuprofd.log"

    @property
    def env(self) -> dict[str, str]:
        env = super().env
        for name in _FORWARD_ENV:
            env.pop(name, None)
        return env

    def start(
        self, server: str | None, *args: str, prelude: str | None = None
    ) -> subprocess.Popen[bytes]:
        """Start this node's daemon forwarding to *server* (None: none) and
        wait until it answers; *prelude*: Python run in it first."""
        entry = ["-m", "gpuprofd"]
        if prelude is not None:
            code = f"{prelude}\nimport sys\nfrom gpuprofd.__main__ import main\n"
            entry = ["-c", code + "sys.exit(main(sys.argv[1:]))"]
        forward = (
            [] if server is None else ["--server", server, "--api-key-file", str(self.key_file)]
        )
        command = [
            sys.executable,
            *entry,
            "--socket-dir",
            str(self.socket_dir),
            "--db",
            str(self.db),
            "--idle-exit",
            "0",
            "--http",
            "off",
            "--sample-hz",
            "10",
            *forward,
            *args,
        ]
        with self.log_path.open("ab") as log:
            proc = subprocess.Popen(
                command,
                env={**self.env, "GPUPROF_NVML": "mock"},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.daemons.append(proc)

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"gpuprofd exited {proc.returncode}: {self.log()}")
            reply = ping(self.socket_dir)
            return reply is not None and reply.get("pid") == proc.pid

        wait_for(up, 60, f"{self.name}'s gpuprofd to answer")
        return proc

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(60)

    def train(self, name: str, max_steps: int, sleep_s: float, stop: Path | None = None) -> Any:
        """A training process (:data:`TRAIN`) on this node."""
        args = [name, str(max_steps), str(sleep_s)] + ([str(stop)] if stop else [])
        return self.spawn_script(TRAIN, *args)

    @contextlib.contextmanager
    def training(self, name: str, max_steps: int, sleep_s: float) -> Iterator[Training]:
        """A training process that trains until :meth:`Training.finish`
        (at most *max_steps*); killed if the block leaves without it."""
        stop = self.workdir / f"stop-{name}"
        run = Training(self.train(name, max_steps, sleep_s, stop), stop)
        try:
            yield run
        finally:
            if run.proc.poll() is None:
                run.proc.kill()

    def status(self) -> dict[str, Any]:
        out = self.ctl("status", "--socket-dir", str(self.socket_dir), "--format", "json")
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    def status_text(self) -> str:
        out = self.ctl("status", "--socket-dir", str(self.socket_dir))
        assert out.returncode == 0, out.stderr
        return out.stdout

    def drain(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.ctl("drain", str(self.db), "--api-key-file", str(self.key_file), *args)

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.query(sql, *params)]

    def count(self, sql: str, *params: Any) -> int:
        return int(self.query(sql, *params)[0][0])

    def cleanup(self) -> None:
        self.stop_daemon()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[Callable[[str], ForwardNode]]:
    """``nodes(name)`` makes a node; each is stopped and cleaned up after the test."""
    made: list[ForwardNode] = []

    def make(name: str) -> ForwardNode:
        n = ForwardNode(tmp_path, name)
        made.append(n)
        return n

    yield make
    for n in made:
        n.cleanup()


def serve(tmp: Path, storage: str, port: int | None = None) -> TeamServer:
    """A started ``gpuprofd serve`` on *storage*, on *port* (kept across restarts)."""
    args = ("--http", f"127.0.0.1:{port}") if port is not None else ()
    return TeamServer(tmp, storage, *args).start()


def kill_server(server: TeamServer) -> None:
    assert server.proc is not None
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)


def wait_until(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """*pred()* once it is truthy (deadlines, never timings: the box is busy)."""
    return wait_for(pred, timeout_s, what)


def server_run(storage: str, run_uuid: str) -> dict[str, Any] | None:
    """The server's row of run *run_uuid* (id, status, summary), or None."""
    rows = db_rows(
        storage, "SELECT id, status, summary, node_id FROM runs WHERE run_uuid = ?", (run_uuid,)
    )
    if not rows:
        return None
    run_id, status, summary, node_id = rows[0]
    return {"id": run_id, "status": status, "summary": summary, "node_id": node_id}


def server_steps(storage: str, run_uuid: str) -> list[int]:
    """The step indices the server holds for *run_uuid*, sorted (duplicates kept)."""
    return [
        int(r[0])
        for r in db_rows(
            storage,
            "SELECT s.step FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.run_uuid = ? "
            "ORDER BY s.step",
            (run_uuid,),
        )
    ]


def node_ledger(storage: str) -> list[tuple[int, int, int]]:
    """The server's ``ingest_nodes``: (last seq applied, events applied,
    batches received) of each node, by node id."""
    rows = db_rows(storage, "SELECT last_seq, events, batches FROM ingest_nodes ORDER BY node_id")
    return [(int(a), int(b), int(c)) for a, b, c in rows]


def ended_on_server(storage: str, run_uuid: str) -> bool:
    run = server_run(storage, run_uuid)
    return run is not None and run["status"] != "running" and run["summary"] is not None


# --- a recording proxy --------------------------------------------------------


@dataclass
class Posted:
    """One batch that reached the tap: its events' (seq, kind) and the answer given."""

    seqs: list[int]
    kinds: list[str]
    status: int
    events: list[dict[str, Any]]


#: Decides a batch's answer itself: (the batch, its index among the posts) ->
#: a (status, JSON body) to answer with, or None to pass it to the server.
Fault = Callable[[dict[str, Any], int], tuple[int, dict[str, Any]] | None]


@dataclass
class Tap:
    """An HTTP proxy in front of a team server's ingest, in a thread of its
    own: it records every batch posted (:attr:`posts`) and passes it on,
    unless :attr:`fault` answers it."""

    upstream: str
    fault: Fault | None = None
    port: int = 0
    """Where it listens (0: a free port)."""
    posts: list[Posted] = field(default_factory=list)
    url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Tap:
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                loop.run_until_complete(self._serve(ready))
            finally:
                loop.close()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        assert ready.wait(20), "the tap did not start"
        return self

    async def _serve(self, ready: threading.Event) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/api/v1/ingest", self._ingest)
        runner = web.AppRunner(app, access_log=None, auto_decompress=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        await site.start()
        port = next(a[1] for a in runner.addresses if isinstance(a, tuple))
        self.url = f"http://127.0.0.1:{port}"
        self._stop = asyncio.Event()
        self._session = aiohttp.ClientSession()
        ready.set()
        await self._stop.wait()
        await self._session.close()
        await runner.cleanup()

    async def _ingest(self, request: web.Request) -> web.Response:
        raw = await request.read()
        body = gzip.decompress(raw) if request.headers.get("Content-Encoding") == "gzip" else raw
        batch = orjson.loads(body)
        events = batch.get("events", [])
        with self._lock:
            index = len(self.posts)
        answer = self.fault(batch, index) if self.fault is not None else None
        if answer is not None:
            status, reply = answer
            out = web.json_response(reply, status=status)
        else:
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() in ("authorization", "content-type", "content-encoding")
            }
            try:
                async with self._session.post(
                    self.upstream + "/api/v1/ingest", data=raw, headers=headers
                ) as resp:
                    status = resp.status
                    text = await resp.read()
                    ctype = resp.headers.get("Content-Type", "application/json")
            except aiohttp.ClientError:
                status, text, ctype = 502, b'{"error": "upstream down"}', "application/json"
            out = web.Response(body=text, status=status, content_type=ctype.split(";")[0])
        with self._lock:
            self.posts.append(
                Posted(
                    [int(e["seq"]) for e in events],
                    [str(e["kind"]) for e in events],
                    status,
                    events,
                )
            )
        return out

    def snapshot(self) -> list[Posted]:
        with self._lock:
            return list(self.posts)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)


@pytest.fixture
def taps() -> Iterator[list[Tap]]:
    made: list[Tap] = []
    yield made
    for t in made:
        t.close()
