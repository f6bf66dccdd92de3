"""The HTTP side ``gpuprofctl top`` and ``watch`` read: a gpuprofd's
dashboard or a team server, its JSON API (``/api/v1/...``) and its live
socket (``/api/v1/live``), with an API key or a viewer's login.

A key goes in every request (``Authorization: Bearer``; a team server
accepts its keys for reads). A login is the page's: ``GET /api/v1/session``
sets the CSRF cookie, ``POST /api/v1/login`` sends the password with it
back and gets the session cookie, which every later request and the live
socket carry. Every failure is one line for the user (a
:class:`~gpuprofd.core.errors.GpuprofdError`), never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gpuprofd.core.errors import BadInputError, GpuprofdError, NoDaemonError, UnknownRunError

#: The live socket's close code for a login that ended (``gpuprofd.web.auth``).
SESSION_ENDED = 1008
#: Reconnect backoff, seconds: from the first, doubling to the last, jittered
#: by ±25 % (as the dashboard's page does).
BACKOFF_MIN_S, BACKOFF_MAX_S = 0.5, 10.0
#: The largest live message read, bytes (a ``node`` message is a few KiB a run).
MAX_MESSAGE_BYTES = 8 * 2**20


class LoginNeeded(BadInputError):
    """The server answered 401: it wants an API key or a viewer's login."""


@dataclass(frozen=True)
class Credentials:
    """What proves who reads: an API key, or the viewers' password."""

    api_key: str | None = None
    password: str | None = None


class FeedClient:
    """One HTTP session on *base_url* (``http(s)://host:port``): use it as
    ``async with``; :meth:`get` for the API, :meth:`follow` for the feed."""

    def __init__(self, base_url: str, creds: Credentials, timeout_s: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.creds = creds
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> FeedClient:
        headers = {"Accept": "application/json"}
        if self.creds.api_key:
            headers["Authorization"] = f"Bearer {self.creds.api_key}"
        self._session = aiohttp.ClientSession(
            headers=headers,
            cookie_jar=aiohttp.CookieJar(unsafe=True),  # cookies of an IP address (127.0.0.1) too
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s),
        )
        try:
            if self.creds.password:
                await self.login(self.creds.password)
        except BaseException:
            await self._session.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "use FeedClient in `async with`"
        return self._session

    def _unreachable(self, exc: BaseException) -> NoDaemonError:
        return NoDaemonError(f"no answer from {self.base_url} ({exc or type(exc).__name__})")

    async def login(self, password: str) -> None:
        """Log in as a viewer (the page's way: CSRF cookie, then the password).

        Raises:
            LoginNeeded: the password is wrong.
            BadInputError: the server refused otherwise (too many logins: its message).
            NoDaemonError: the server did not answer.
        """
        try:
            async with self.session.get(f"{self.base_url}/api/v1/session") as resp:
                await resp.read()
            token = ""
            for c in self.session.cookie_jar:
                if c.key == "gpuprof_csrf":
                    token = c.value
            async with self.session.post(
                f"{self.base_url}/api/v1/login",
                json={"password": password},
                headers={"X-CSRF-Token": token},
            ) as resp:
                body = await _json(resp)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise self._unreachable(exc) from None
        if resp.status == 401:
            raise LoginNeeded(f"{self.base_url} refused the viewer password (wrong password)")
        if resp.status != 200:
            raise BadInputError(f"{self.base_url} refused the login: {_said(body, resp.status)}")

    async def get(self, path: str, **params: Any) -> dict[str, Any]:
        """``GET /api/v1{path}`` as JSON.

        Raises:
            LoginNeeded: 401 (no key or login, or one the server refuses).
            UnknownRunError: 404 (no such run: the server's message).
            BadInputError: another refusal (its message).
            NoDaemonError: no answer.
        """
        query = {k: str(v) for k, v in params.items() if v is not None}
        url = f"{self.base_url}/api/v1{path}"
        try:
            async with self.session.get(url, params=query) as resp:
                body = await _json(resp)
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise self._unreachable(exc) from None
        if resp.status == 401:
            raise LoginNeeded(login_hint(self.base_url))
        if resp.status == 404:
            raise UnknownRunError(_said(body, resp.status))
        if resp.status != 200 or not isinstance(body, dict):
            raise BadInputError(f"{url}: {_said(body, resp.status)}")
        return body

    async def follow(
        self,
        subscribe: Callable[[], dict[str, Any]],
        on_message: Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]],
        on_state: Callable[[str], None],
        switch: asyncio.Queue[dict[str, Any]] | None = None,
    ) -> None:
        """Follow the live feed until cancelled: connect, send ``subscribe()``
        (again on every reconnect, with the cursors it holds then), hand each
        message to *on_message* (which may answer a new subscribe: after a
        ``reset``), and send whatever *switch* gets (another run, the node
        view). A dropped socket is reconnected with backoff; *on_state* hears
        ``open`` and ``reconnecting (why)``.

        Raises:
            LoginNeeded: the socket was refused (401) or its login ended.
        """
        backoff = BACKOFF_MIN_S
        while True:
            why = "closed"
            try:
                async with self.session.ws_connect(
                    f"{self.base_url}/api/v1/live", heartbeat=30.0, max_msg_size=MAX_MESSAGE_BYTES
                ) as ws:
                    on_state("open")
                    backoff = BACKOFF_MIN_S
                    await ws.send_str(orjson.dumps(subscribe()).decode())
                    await _pump(ws, on_message, switch)
                    if ws.close_code == SESSION_ENDED:
                        raise LoginNeeded(
                            f"{self.base_url} ended this login (logged out or expired)"
                        )
                    why = f"closed with {ws.close_code}"
            except aiohttp.WSServerHandshakeError as exc:
                if exc.status == 401:
                    raise LoginNeeded(login_hint(self.base_url)) from None
                why = f"refused: {exc.status} {exc.message}"
            except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                why = str(exc) or type(exc).__name__
            on_state(f"reconnecting ({why})")
            await asyncio.sleep(backoff * random.uniform(0.75, 1.25))
            backoff = min(backoff * 2, BACKOFF_MAX_S)


async def _pump(
    ws: aiohttp.ClientWebSocketResponse,
    on_message: Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]],
    switch: asyncio.Queue[dict[str, Any]] | None,
) -> None:
    """Read *ws* until it closes, handing messages on; send what *switch* gets."""

    async def sends() -> None:
        while switch is not None:
            await ws.send_str(orjson.dumps(await switch.get()).decode())

    sender = asyncio.create_task(sends())
    try:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            try:
                data = orjson.loads(msg.data)
            except orjson.JSONDecodeError:
                continue  # not ours to crash on
            if isinstance(data, dict):
                again = await on_message(data)
                if again is not None:
                    await ws.send_str(orjson.dumps(again).decode())
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender


async def _json(resp: aiohttp.ClientResponse) -> Any:
    try:
        return await resp.json(content_type=None)
    except (ValueError, aiohttp.ContentTypeError):
        return None


def _said(body: Any, status: int) -> str:
    """The server's own ``error`` message, else its status."""
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        return body["error"]
    return f"HTTP {status}"


def login_hint(base_url: str) -> str:
    """What to do when *base_url* wants a login."""
    return (
        f"{base_url} wants a login: give a viewer password with --viewer-password-file F, "
        "or (a team server) an API key with --api-key-file F, GPUPROF_API_KEY_FILE or "
        "GPUPROF_API_KEY"
    )


@contextlib.asynccontextmanager
async def open_client(
    base_url: str, creds: Credentials, ask_password: Callable[[], str | None] | None = None
) -> AsyncIterator[FeedClient]:
    """A :class:`FeedClient` on *base_url*, its access checked by one read
    (``/api/v1/nodes``); when that wants a login and *ask_password* gives one
    (a terminal's prompt), logged in with it.

    Raises:
        LoginNeeded, NoDaemonError, BadInputError: as :meth:`FeedClient.get`.
    """
    async with FeedClient(base_url, creds) as client:
        try:
            await client.get("/nodes")
        except LoginNeeded:
            password = ask_password() if ask_password and not creds.password else None
            if not password:
                raise
            await client.login(password)
            await client.get("/nodes")
        yield client


__all__ = ["Credentials", "FeedClient", "GpuprofdError", "LoginNeeded", "open_client"]
