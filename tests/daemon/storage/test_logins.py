"""The team server's viewer sessions on each backend: recorded at login,
valid until logged out or expired, kept as digests only, the expired ones
deleted; and a schema-11 database upgraded to hold them."""

from __future__ import annotations

from typing import Any

from gpuprofd.storage import logins, schema
from tests.daemon.storage.test_backends import open_store

NS = 1_000_000_000
T0 = 1_700_000_000 * NS


async def test_a_session_lives_until_logged_out_or_expired(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        await logins.open_session(store, "sid-a", T0, 60.0, "203.0.113.5")
        await logins.open_session(store, "sid-b", T0, 60.0)
        alive = [
            await logins.session_alive(store, "sid-a", T0 + 59 * NS),
            await logins.session_alive(store, "sid-a", T0 + 60 * NS),  # its expiry: over
            await logins.session_alive(store, "sid-never-made", T0),
        ]
        ended = await logins.end_session(store, "sid-a")
        again = await logins.end_session(store, "sid-a")
        after = [
            await logins.session_alive(store, "sid-a", T0 + NS),
            await logins.session_alive(store, "sid-b", T0 + NS),  # the other one lives on
        ]
        rows = await store.fetchall("SELECT sid_digest, client FROM viewer_sessions")
    assert alive == [True, False, False]
    assert (ended, again) == (True, False)
    assert after == [False, True]
    assert [tuple(r) for r in rows] == [(logins.sid_digest("sid-b"), None)]
    assert "sid-b" not in rows[0][0] and len(rows[0][0]) == 64  # the id itself is not kept


async def test_expired_sessions_are_forgotten(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        await logins.open_session(store, "short", T0, 10.0)
        await logins.open_session(store, "long", T0, 3600.0)
        none_yet = await logins.forget_ended_sessions(store, T0 + 9 * NS)
        one = await logins.forget_ended_sessions(store, T0 + 10 * NS)
        left = await store.fetchall("SELECT sid_digest FROM viewer_sessions")
    assert (none_yet, one) == (0, 1)
    assert [r[0] for r in left] == [logins.sid_digest("long")]


async def _to_schema_11(store: Any) -> None:
    await store.write("DROP TABLE viewer_sessions")
    await store.write("UPDATE meta SET value = '11' WHERE key = 'schema_version'")


async def test_a_schema_11_database_gets_the_sessions_table(storage_url: str) -> None:
    async with open_store(storage_url) as store:
        await _to_schema_11(store)
    async with open_store(storage_url) as store:
        version = (await store.fetchone("SELECT value FROM meta WHERE key = 'schema_version'"))[0]
        await logins.open_session(store, "sid", T0, 60.0)
        alive = await logins.session_alive(store, "sid", T0)
    assert version == str(schema.SCHEMA_VERSION) and alive
