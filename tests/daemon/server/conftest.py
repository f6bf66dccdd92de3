"""Real ``gpuprofd serve`` processes for the team server's tests, and
what they need: a key file, a password file, clients, the database read directly."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import argon2
import httpx
import orjson
import pytest

from gpuprofd.storage.url import parse

KEY_ONE = "key-one-0123456789abcdef"
KEY_TWO = "key-two-fedcba9876543210"  # listed by its digest only
PASSWORD = "correct horse battery staple"
_URL_RE = re.compile(r"team server on (http://\S+),")


#: The viewer password's argon2 hash with the cheapest parameters: a login
#: costs ~2 s of CPU on a loaded 2-core box with argon2-cffi's defaults (64 MiB, t=3).
#: The hash carries its parameters, so the server verifies it as cheaply.
CHEAP_HASH = argon2.PasswordHasher(time_cost=1, memory_cost=1024, parallelism=1).hash(PASSWORD)


def key_file_text(*plain: str, hashed: tuple[str, ...] = ()) -> str:
    lines = ["# test keys", *plain]
    lines += [f"sha256:{hashlib.sha256(k.encode()).hexdigest()}" for k in hashed]
    return "\n".join(lines) + "\n"


class TeamServer:
    """One ``gpuprofd serve`` child on a free loopback port."""

    def __init__(
        self,
        tmp: Path,
        storage_url: str,
        *args: str,
        env: dict[str, str] | None = None,
        url_file: Path | None = None,
    ):
        self.tmp = tmp
        self.storage_url = storage_url
        self.url_file = url_file
        self.keys = tmp / "api-keys"
        if not self.keys.exists():
            self.keys.write_text(key_file_text(KEY_ONE, hashed=(KEY_TWO,)))
        self.password = tmp / "viewer"
        if not self.password.exists():
            self.password.write_text(CHEAP_HASH + "\n")
        self.log_path = tmp / f"serve-{time.monotonic_ns()}.log"
        self.args = args
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def command(self, *extra: str) -> list[str]:
        where = ["--storage-url", self.storage_url]
        if self.url_file is not None:  # the URL in a file, off the command line
            self.url_file.write_text(f"# the team's database\n{self.storage_url}\n")
            where = ["--storage-url-file", str(self.url_file)]
        return [
            sys.executable,
            "-m",
            "gpuprofd",
            "serve",
            *where,
            "--http",
            "127.0.0.1:0",
            "--api-key-file",
            str(self.keys),
            "--viewer-password-file",
            str(self.password),
            "--log-level",
            "debug",
            *self.args,
            *extra,
        ]

    def start(self) -> TeamServer:
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child holds it
        env = {**os.environ, **(self.env or {})}
        self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, env=env)
        log.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = _URL_RE.search(self.log())
            if found:
                self.url = found.group(1)
                return self
            if self.proc.poll() is not None:
                raise AssertionError(f"gpuprofd serve exited {self.proc.returncode}: {self.log()}")
            time.sleep(0.05)
        raise AssertionError(f"gpuprofd serve not ready: {self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> int | None:
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kw)

    def ingest(
        self,
        batch: dict[str, Any] | bytes,
        key: str | None = KEY_ONE,
        *,
        compress: bool = True,
        headers: dict[str, str] | None = None,
    ) -> httpx.Response:
        body = batch if isinstance(batch, bytes) else orjson.dumps(batch)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if compress:
            body = gzip.compress(body)
            hdrs["Content-Encoding"] = "gzip"
        if key is not None:
            hdrs["Authorization"] = f"Bearer {key}"
        with self.client() as c:
            return c.post("/api/v1/ingest", content=body, headers=hdrs)


def login(client: httpx.Client, password: str = PASSWORD) -> httpx.Response:
    """Log *client* in the way the page does: the CSRF cookie first, then the password."""
    client.get("/api/v1/session")
    token = client.cookies.get("gpuprof_csrf")
    return client.post(
        "/api/v1/login", json={"password": password}, headers={"X-CSRF-Token": token or ""}
    )


def csrf(client: httpx.Client) -> dict[str, str]:
    return {"X-CSRF-Token": client.cookies.get("gpuprof_csrf") or ""}


def db_rows(storage_url: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of *sql* read straight from the server's database (``?`` placeholders)."""
    url = parse(storage_url)
    if url.path is not None:
        if not url.path.exists():
            return []
        conn = sqlite3.connect(url.path)
        try:
            return [tuple(r) for r in conn.execute(sql, params)]
        finally:
            conn.close()

    async def read() -> list[tuple[Any, ...]]:
        import asyncpg

        from gpuprofd.storage.dialect import POSTGRES

        assert url.dsn is not None
        conn = await asyncpg.connect(url.dsn.split("?")[0], timeout=5)
        try:
            schema = url.dsn.split("search_path=")[1]
            await conn.execute(f'SET search_path TO "{schema}"')
            return [tuple(r) for r in await conn.fetch(POSTGRES.sql(sql), *params)]
        finally:
            await conn.close()

    return asyncio.run(read())


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]


@pytest.fixture(scope="module")  # not the session: Playwright's sync API holds an event
def browser() -> Iterator[Any]:  # loop open, and later asyncio tests could not run their own
    """Headless Chromium (Debian's), or the test skipped saying why."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("the playwright package is not installed")
    if not CHROMIUM.exists():
        pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium; scripts/test.sh does)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def log_in_page(page: Any, password: str = PASSWORD) -> None:
    """Type *password* into the login form *page* shows, and send it."""
    page.fill("#password", password)
    page.click("button[type=submit]")


@pytest.fixture
def team_servers(tmp_path: Path) -> Iterator[list[TeamServer]]:
    """Servers a test starts (``TeamServer(...).start()``, appended here) are stopped after it."""
    started: list[TeamServer] = []
    yield started
    for s in started:
        s.stop()
