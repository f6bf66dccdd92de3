"""What a team server's login needs to share between replicas: the viewer
logins per client address (the rate limit), the secret that signs
session cookies (schema 10: ``login_limits``, ``server_secrets``), and the
sessions themselves (schema 13: ``viewer_sessions``), so that a logout on
one replica ends the session on all of them.

A session id is a random token the (signed) session cookie carries; the
database holds only its SHA-256 digest, with the session's expiry.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Sequence

import orjson

from gpuprofd.storage.writes import Store, Txn

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


def sid_digest(sid: str) -> str:
    """The SHA-256 (hex) of session id *sid*: what ``viewer_sessions`` keys it by."""
    return hashlib.sha256(sid.encode()).hexdigest()


async def open_session(
    store: Store, sid: str, now_ns: int, lasts_s: float, client: str | None = None
) -> None:
    """Record a new session *sid*, valid for *lasts_s* seconds from *now_ns* (wall ns)."""
    row = (sid_digest(sid), now_ns, now_ns + int(lasts_s * _NS_PER_S), client)
    await store.transaction(
        lambda txn: txn.execute(
            "INSERT INTO viewer_sessions (sid_digest, created_wall_ns, expires_wall_ns, client) "
            "VALUES (?, ?, ?, ?)",
            row,
        ),
        "new session",
    )


async def session_alive(store: Store, sid: str, now_ns: int) -> bool:
    """Is session *sid* recorded, not ended and not expired at *now_ns* (wall ns)?

    Raises:
        DatabaseError: the database is unreachable.
    """
    row = await store.fetchone(
        "SELECT 1 FROM viewer_sessions WHERE sid_digest = ? AND expires_wall_ns > ?",
        (sid_digest(sid), now_ns),
    )
    return row is not None


async def end_session(store: Store, sid: str) -> bool:
    """End session *sid* (a logout) on every replica; True if it was recorded."""
    digest = sid_digest(sid)
    deleted = await store.transaction(
        lambda txn: txn.execute("DELETE FROM viewer_sessions WHERE sid_digest = ?", (digest,)),
        "end session",
    )
    return bool(deleted)


async def forget_ended_sessions(store: Store, now_ns: int) -> int:
    """Delete the sessions expired at *now_ns* (wall ns); returns how many."""
    deleted = await store.transaction(
        lambda txn: txn.execute(
            "DELETE FROM viewer_sessions WHERE expires_wall_ns <= ?", (now_ns,)
        ),
        "expired sessions",
    )
    return int(deleted or 0)
