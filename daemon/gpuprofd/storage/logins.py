"""What a team server's login needs to share between replicas: the viewer
logins per client address (the rate limit) and the secret that signs
session cookies, both in the database (schema 10: ``login_limits``,
``server_secrets``).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence

import orjson

from gpuprofd.storage.store import Store, Txn

_NS_PER_S = 1_000_000_000

_LOCK_CLIENT_SQL = (
    "INSERT INTO login_limits (client, attempts, last_wall_ns) VALUES (?, '[]', ?) "
    "ON CONFLICT (client) DO UPDATE SET last_wall_ns = login_limits.last_wall_ns"
)
_ATTEMPTS_SQL = "SELECT attempts FROM login_limits WHERE client = ?"
_SET_ATTEMPTS_SQL = "UPDATE login_limits SET attempts = ?, last_wall_ns = ? WHERE client = ?"


async def take_login_slot(
    store: Store, client: str, now_ns: int, limit: int, window_s: float
) -> float:
    """Count a login attempt of *client* (an address) if it has made fewer
    than *limit* in the last *window_s* seconds; returns 0, or (over the
    limit, the attempt not counted) the seconds until the oldest of them
    leaves the window (for ``Retry-After``, at least 1).

    One transaction that locks the client's row first, so replicas on one
    Postgres count together and two attempts never both take the last slot."""

    async def attempt(txn: Txn) -> float:
        await txn.execute(_LOCK_CLIENT_SQL, (client, now_ns))
        rows = await txn.fetch(_ATTEMPTS_SQL, (client,))
        since = now_ns - int(window_s * _NS_PER_S)
        recent: list[int] = [t for t in orjson.loads(rows[0][0]) if t > since]
        if len(recent) >= limit:
            return max(1.0, math.ceil((recent[0] - since) / _NS_PER_S))
        recent.append(now_ns)
        await txn.execute(_SET_ATTEMPTS_SQL, (orjson.dumps(recent).decode(), now_ns, client))
        return 0.0

    return await store.transaction(attempt, "login attempt")


async def forget_old_logins(store: Store, before_ns: int) -> None:
    """Delete the rows of clients whose latest attempt is before *before_ns* (wall ns)."""
    await store.transaction(
        lambda txn: txn.execute("DELETE FROM login_limits WHERE last_wall_ns < ?", (before_ns,)),
        "old logins",
    )


async def shared_secret(store: Store, name: str, nbytes: int = 32) -> str:
    """The secret *name* (hex), made once: the first replica to ask writes a
    random one; every later caller, on any replica, reads that one."""

    async def get(txn: Txn) -> str:
        fresh = secrets.token_hex(nbytes)
        await txn.execute(
            "INSERT INTO server_secrets (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
            (name, fresh),
        )
        rows: Sequence[Sequence[str]] = await txn.fetch(
            "SELECT value FROM server_secrets WHERE name = ?", (name,)
        )
        return rows[0][0]

    return await store.transaction(get, "shared secret")
