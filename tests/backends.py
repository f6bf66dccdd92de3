"""Storage backends for tests: a fresh SQLite file or a fresh Postgres schema.

Postgres is the real server on this machine (``GPUPROF_TEST_POSTGRES``,
default ``postgres://root@127.0.0.1:5432/test``). Each test gets its own
schema (through ``search_path`` in the URL), dropped afterwards. A machine
without a reachable server skips the Postgres cases with the reason.
"""

from __future__ import annotations

import asyncio
import functools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuprof.extras import install_hint

PG_URL = os.environ.get("GPUPROF_TEST_POSTGRES", "postgres://root@127.0.0.1:5432/test")
BACKENDS = ("sqlite", "postgres")


async def _admin(sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(PG_URL, timeout=5)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


@functools.cache
def postgres_missing() -> str | None:
    """Why the Postgres cases cannot run here, or None."""
    try:
        import asyncpg  # noqa: F401
    except ImportError:
        return f"asyncpg is not installed ({install_hint('postgres')})"
    try:
        asyncio.run(_admin("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any failure means no server to test against
        return f"no Postgres at {PG_URL} ({type(exc).__name__}: {exc})"
    return None


def pg_schema_url(schema: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{sep}search_path={schema}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """The URL of a fresh, empty Postgres schema (dropped after the test)."""
    reason = postgres_missing()  # also said in the run's header (tests/conftest.py)
    if reason:
        pytest.skip(reason)
    schema = f"gpuprof_test_{uuid.uuid4().hex[:12]}"
    yield pg_schema_url(schema)
    asyncio.run(_admin(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


@pytest.fixture(params=BACKENDS)
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A storage URL of each backend: ``sqlite:///…`` then ``postgres://…``."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'gpuprof.db'}"
    else:
        yield request.getfixturevalue("pg_url")
