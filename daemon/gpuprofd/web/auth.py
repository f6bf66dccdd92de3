"""Who may use the HTTP side: API keys for machines, a login for viewers.

- **API keys** (ingest, ``/metrics``): ``Authorization: Bearer KEY`` or
  ``X-API-Key: KEY``. Several are valid at once (rotation). Only their
  SHA-256 digests are held, compared with :func:`hmac.compare_digest`
  against every accepted digest. A key file (:class:`ApiKeys`) is read again
  when it changes, so a key removed from it is refused from then on.
- **Viewers** log in with a password (``POST /api/v1/login``, JSON or form
  field ``password``), checked against an argon2 hash (argon2-cffi), and get
  a session cookie signed and dated by itsdangerous (``HttpOnly``,
  ``SameSite=Lax``, ``Secure`` over https or when a trusted proxy says
  ``X-Forwarded-Proto: https``), valid for :attr:`AuthConfig.session_s`.
  The cookie carries a random session id, recorded in the database
  (:mod:`gpuprofd.storage.logins`) and looked up on every request:
  ``POST /api/v1/logout`` deletes it, which ends the session on every
  replica, a copied cookie included (a live socket of it is closed within
  :data:`SESSION_RECHECK_S`). The signing secret lives in the database too,
  made once, so every replica accepts every replica's cookies.
- **CSRF**: every state-changing request (login and logout included;
  ingest, which carries an API key and no cookie, excepted) carries the
  ``gpuprof_csrf`` cookie's value back in an ``X-CSRF-Token`` header (or a
  ``csrf`` form field): double submit, the token itself signed.
- **Logins** are limited per client address (:data:`LOGIN_LIMIT` a
  :data:`LOGIN_WINDOW_S`), counted in the database so the limit holds
  across replicas; the next one gets 429 with ``Retry-After``.

Everything else without a session: ``/api/...`` answers 401, a page
redirects to ``/login``. An app installed with ``key_reads`` (the team
server) also answers an API key's reads: ``GET /api/...`` and the live
socket (``gpuprofctl top --server``), never a page or a change; a live
socket of a key is closed within :data:`SESSION_RECHECK_S` once the key is
removed from the key files.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import html
import ipaddress
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import argon2
import itsdangerous
import orjson
from aiohttp import hdrs, web

from gpuprof import config
from gpuprofd.core.errors import BadInputError, DatabaseError
from gpuprofd.storage import logins
from gpuprofd.storage.writes import Store
from gpuprofd.web.origin import same_origin
from gpuprofd.web.state import LIVE_SOCKET

log = logging.getLogger(__name__)

SESSION_COOKIE = "gpuprof_session"
CSRF_COOKIE = "gpuprof_csrf"
CSRF_HEADER = "X-CSRF-Token"
#: Logins per client address per window (the product's auth spec: 10 a minute).
LOGIN_LIMIT = 10
LOGIN_WINDOW_S = 60.0
#: How long a session lasts, seconds: a working day, so a viewer logs in once a day.
DEFAULT_SESSION_S = 12 * 3600
#: The session cookie's format: ``{"v": 2, "sid": session id, "csrf": token}``
#: (1, before sessions were recorded, is refused: such a viewer logs in again).
SESSION_VERSION = 2
#: How often an open live socket's session is looked up again, seconds: a
#: logout (on any replica) closes the sockets of its session within this.
SESSION_RECHECK_S = 5.0
#: The WebSocket close code of a socket whose session ended (policy violation).
WS_SESSION_ENDED = 1008
#: Where a login may send the viewer back to: one of the page's own views
#: (``#/run/12``, ``#/runs?name=x``), never another site (it follows ``/``).
_NEXT_RE = re.compile(r"^#/[A-Za-z0-9/_,.~%=&?:+-]{0,500}$")
#: How often a key file is looked at for changes, seconds.
KEY_FILE_CHECK_S = 1.0
#: The name of the cookie-signing secret in ``server_secrets``.
SECRET_NAME = "session_signing_key"
HASH_PREFIX = "sha256:"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOGIN_PATH, API_LOGIN, API_LOGOUT, API_SESSION = (
    "/login",
    "/api/v1/login",
    "/api/v1/logout",
    "/api/v1/session",
)


#: The login page's script and style (files, not inline: the Content-Security-Policy
#: allows no inline script or style), served before a login.
LOGIN_ASSETS = ("/static/login.js", "/static/login.css")


def key_digest(key: str) -> bytes:
    """The SHA-256 digest of an API key (what a key file's ``sha256:`` lines hold, in hex)."""
    return hashlib.sha256(key.encode()).digest()


def parse_key_lines(text: str, where: str) -> list[bytes]:
    """The digests of a key file's lines: a key, or ``sha256:`` and its
    64-hex digest; blank lines and ``#`` comments skipped.

    Raises:
        BadInputError: a ``sha256:`` line that is not 64 hex digits (line named).
    """
    out = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.lower().startswith(HASH_PREFIX):
            hexed = line[len(HASH_PREFIX) :].strip()
            try:
                digest = bytes.fromhex(hexed)
            except ValueError:
                digest = b""
            if len(digest) != 32:
                raise BadInputError(f"{where} line {n}: sha256: needs 64 hex digits")
            out.append(digest)
        else:
            out.append(key_digest(line))
    return out


class ApiKeys:
    """The accepted API keys: from key files (read again when they change)
    and given keys (``GPUPROF_API_KEY``)."""

    def __init__(
        self, files: Sequence[Path] = (), keys: Iterable[str] = (), required: bool = True
    ) -> None:
        self.files = [Path(f) for f in files]
        self._given = [key_digest(k) for k in keys]
        self._stamp: list[tuple[int, int] | None] = []
        self._from_files: list[bytes] = []
        self._checked = 0.0
        self.load()
        if required and not self.digests():
            raise BadInputError(
                "no API keys: put one or more in the --api-key-file (one a line, or "
                "sha256:<hex digest>), or set GPUPROF_API_KEY"
            )

    def load(self) -> None:
        """Read the key files.

        Raises:
            BadInputError: a file missing or unreadable, or a bad line (named).
        """
        digests: list[bytes] = []
        stamps: list[tuple[int, int] | None] = []
        for path in self.files:
            try:
                st = path.stat()
                text = path.read_text()
            except OSError as exc:
                raise BadInputError(
                    f"cannot read the API key file {path} ({exc.strerror or exc})"
                ) from None
            digests += parse_key_lines(text, str(path))
            stamps.append((st.st_mtime_ns, st.st_size))
        self._from_files, self._stamp = digests, stamps
        self._checked = time.monotonic()

    def _refresh(self) -> None:
        """Read the files again if one changed (at most every :data:`KEY_FILE_CHECK_S`).
        A file that became unreadable or bad refuses every key of the files
        (fail closed) until it is fixed."""
        if not self.files or time.monotonic() - self._checked < KEY_FILE_CHECK_S:
            return
        self._checked = time.monotonic()
        stamps = []
        for path in self.files:
            try:
                st = path.stat()
                stamps.append((st.st_mtime_ns, st.st_size))
            except OSError:
                stamps.append(None)
        if stamps == self._stamp:
            return
        try:
            self.load()
            log.info("API keys read again from %s", ", ".join(map(str, self.files)))
        except BadInputError as exc:
            log.error("%s: refusing the file's keys until it is fixed", exc)
            self._from_files, self._stamp = [], stamps

    def digests(self) -> list[bytes]:
        return self._from_files + self._given

    def accepts(self, key: str | None) -> bool:
        """Is *key* one of the accepted keys? Compared in constant time with each."""
        if not key:
            return False
        self._refresh()
        presented = key_digest(key)
        ok = False
        for digest in self.digests():  # no early exit: the time says nothing of which matched
            ok |= hmac.compare_digest(presented, digest)
        return ok


def presented_key(request: web.Request) -> str | None:
    """The API key a request carries (``Authorization: Bearer`` or ``X-API-Key``)."""
    authz = request.headers.get(hdrs.AUTHORIZATION, "")
    scheme, _, value = authz.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("X-API-Key", "").strip() or None


_HASHER = argon2.PasswordHasher()


def viewer_hash(path: Path) -> str:
    """The viewers' password hash from *path*: an argon2 hash as it is, or a
    plain password (the file's first line) hashed now.

    Raises:
        BadInputError: the file missing, unreadable or empty, or a broken argon2 hash.
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise BadInputError(
            f"cannot read the viewer password file {path} ({exc.strerror or exc})"
        ) from None
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not line:
        raise BadInputError(f"the viewer password file {path} is empty: put a password in it")
    if line.startswith("$argon2"):
        try:
            argon2.extract_parameters(line)
        except argon2.exceptions.InvalidHashError:
            raise BadInputError(f"{path} holds a broken argon2 hash") from None
        return line
    return _HASHER.hash(line)


@dataclass(frozen=True)
class AuthConfig:
    """How the HTTP side authenticates (see the module doc).

    Args:
        keys: the accepted API keys.
        viewer_hash: the viewers' argon2 password hash.
        trusted_proxies: peers whose ``X-Forwarded-For`` / ``X-Forwarded-Proto``
            are believed (addresses or networks); none by default.
        session_s: how long a session cookie is valid, seconds.
        login_limit, login_window_s: logins per client address per window.
    """

    keys: ApiKeys
    viewer_hash: str
    trusted_proxies: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
    session_s: int = DEFAULT_SESSION_S
    login_limit: int = LOGIN_LIMIT
    login_window_s: float = LOGIN_WINDOW_S


def parse_proxies(values: Iterable[str]) -> tuple[Any, ...]:
    """``--trust-proxy`` values (an address or a network) as networks.

    Raises:
        BadInputError: one that is neither.
    """
    out = []
    for v in values:
        try:
            out.append(ipaddress.ip_network(v.strip(), strict=False))
        except ValueError:
            raise BadInputError(f"--trust-proxy {v!r}: give an address or a network") from None
    return tuple(out)


@dataclass(frozen=True)
class _Looked:
    """A request's session as looked up once (None: none valid)."""

    session: dict[str, Any] | None


_SESSION = web.RequestKey("session", _Looked)


_RUN_UUID_PATH_RE = re.compile(
    r"^/runs/([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$"
)


def _back_to(path: str) -> str:
    """Where a page asked for before the login goes after it, as the login
    page's hash (its form sends it back as ``next``): a run's link by UUID
    (``/runs/<uuid>``, the summary's "Team server:" line) comes back to
    that run; other pages carry their own hash already."""
    m = _RUN_UUID_PATH_RE.match(path)
    return f"#/run-uuid/{m.group(1)}" if m else ""


def safe_next(value: Any) -> str:
    """*value* if it names one of the page's views (``#/run/12``), else ``""``."""
    return value if isinstance(value, str) and _NEXT_RE.match(value) else ""


def _error(status: int, message: str, **headers: str) -> web.Response:
    body = orjson.dumps({"error": message})
    return web.Response(body=body, status=status, content_type="application/json", headers=headers)


@dataclass
class Auth:
    """The auth of one app: :meth:`install` it on the app.

    *secret*: the cookie-signing secret (:func:`gpuprofd.storage.logins.shared_secret`);
    *store*: where logins are counted."""

    config: AuthConfig
    store: Store
    secret: str
    _sessions: itsdangerous.URLSafeTimedSerializer = field(init=False)
    _csrf: itsdangerous.Signer = field(init=False)
    public_paths: frozenset[str] = field(
        default=frozenset({LOGIN_PATH, API_LOGIN, API_SESSION, *LOGIN_ASSETS}), init=False
    )

    def __post_init__(self) -> None:
        self._sessions = itsdangerous.URLSafeTimedSerializer(self.secret, salt="gpuprof-session")
        self._csrf = itsdangerous.Signer(self.secret, salt="gpuprof-csrf")

    @classmethod
    async def create(cls, config: AuthConfig, store: Store) -> Auth:
        """The auth over *store*, with the signing secret its database holds (made once)."""
        return cls(config, store, await logins.shared_secret(store, SECRET_NAME))

    def install(
        self, app: web.Application, api_key_paths: Sequence[str] = (), *, key_reads: bool = False
    ) -> None:
        """Put the checks in front of every route of *app* and add the login routes.
        *api_key_paths* need an API key instead of a session (and no CSRF token);
        with *key_reads*, an API key may also read: ``GET /api/...``, the live socket."""
        self._api_key_paths = frozenset(api_key_paths)
        self._key_reads = key_reads
        app.middlewares.insert(0, self._middleware)
        app.on_response_prepare.append(_security_headers)
        app.router.add_get(LOGIN_PATH, self._login_page)
        app.router.add_post(API_LOGIN, self._login)
        app.router.add_post(API_LOGOUT, self._logout)
        app.router.add_get(API_SESSION, self._session_info)

    # --- the request's facts ---------------------------------------------------

    def _trusted_peer(self, request: web.Request) -> bool:
        if not self.config.trusted_proxies or not request.remote:
            return False
        try:
            peer = ipaddress.ip_address(request.remote)
        except ValueError:
            return False
        return any(peer in net for net in self.config.trusted_proxies)

    def client(self, request: web.Request) -> str:
        """The client's address: the peer's, or the last hop of
        ``X-Forwarded-For`` when the peer is a trusted proxy."""
        if self._trusted_peer(request):
            hops = [h.strip() for h in request.headers.get("X-Forwarded-For", "").split(",")]
            if hops and hops[-1]:
                return hops[-1][:64]
        return request.remote or "unknown"

    def is_https(self, request: web.Request) -> bool:
        if request.scheme == "https":
            return True
        proto = request.headers.get("X-Forwarded-Proto", "").split(",")[-1].strip().lower()
        return proto == "https" and self._trusted_peer(request)

    def signed_session(self, request: web.Request) -> dict[str, Any] | None:
        """The request's session cookie if it is ours, unexpired and of this
        format (whether it was logged out is :meth:`session`'s question)."""
        cookie = request.cookies.get(SESSION_COOKIE)
        if not cookie:
            return None
        try:
            data = self._sessions.loads(cookie, max_age=self.config.session_s)
        except itsdangerous.BadData:
            return None
        if not isinstance(data, dict) or data.get("v") != SESSION_VERSION:
            return None
        return data if isinstance(data.get("sid"), str) and data["sid"] else None

    async def session(self, request: web.Request) -> dict[str, Any] | None:
        """The request's session: a signed, unexpired cookie whose session is
        still recorded (not logged out on any replica); None otherwise.
        Looked up once per request.

        Raises:
            DatabaseError: the database is unreachable.
        """
        looked = request.get(_SESSION)
        if looked is None:
            data = self.signed_session(request)
            if data is not None and not await logins.session_alive(
                self.store, data["sid"], time.time_ns()
            ):
                data = None
            looked = request[_SESSION] = _Looked(data)
        return looked.session

    def _valid_csrf(self, token: str | None) -> bool:
        return token is not None and self._csrf.validate(token.encode())

    async def _csrf_ok(self, request: web.Request, session: dict[str, Any] | None) -> bool:
        """Double submit: the header (or form field) equals the cookie, the
        cookie is ours, and a session's requests use the session's token."""
        cookie = request.cookies.get(CSRF_COOKIE, "")
        sent = request.headers.get(CSRF_HEADER)
        if sent is None and request.content_type in (
            "application/x-www-form-urlencoded",
            "multipart/form-data",
        ):
            form = await request.post()
            value = form.get("csrf")
            sent = value if isinstance(value, str) else None
        if not sent or not cookie or not hmac.compare_digest(sent.encode(), cookie.encode()):
            return False
        if not self._valid_csrf(cookie):
            return False
        return session is None or hmac.compare_digest(
            str(session.get("csrf", "")).encode(), cookie.encode()
        )

    def _set_cookie(
        self,
        request: web.Request,
        resp: web.StreamResponse,
        name: str,
        value: str,
        *,
        http_only: bool,
    ) -> None:
        resp.set_cookie(
            name,
            value,
            max_age=self.config.session_s,
            path="/",
            httponly=http_only,
            samesite="Lax",
            secure=self.is_https(request),
        )

    def _new_csrf(self) -> str:
        return self._csrf.sign(secrets.token_urlsafe(24).encode()).decode()

    def _csrf_for(self, request: web.Request) -> str:
        token = request.cookies.get(CSRF_COOKIE)
        return token if token and self._valid_csrf(token) else self._new_csrf()

    # --- the gate --------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path
        if path in self._api_key_paths:
            if not self.config.keys.accepts(presented_key(request)):
                return _error(
                    401,
                    "no valid API key: send Authorization: Bearer KEY or X-API-Key: KEY "
                    "(a key from the server's --api-key-file)",
                    **{"WWW-Authenticate": 'Bearer realm="gpuprof"'},
                )
            return await handler(request)
        try:
            session = await self.session(request)
        except DatabaseError as exc:
            log.warning("session lookup failed: %s", exc)
            return _error(503, "the database is unreachable: try again shortly")
        if path not in self.public_paths and session is None:
            key = presented_key(request)
            if path == "/metrics" and self.config.keys.accepts(key):
                return await handler(request)
            if self._key_reads and self._key_read(request) and self.config.keys.accepts(key):
                if request.headers.get(hdrs.UPGRADE, "").lower() == "websocket":
                    if not same_origin(request):
                        return _error(403, "a live socket from another site's page is refused")
                    return await self._live(request, handler, self._key_alive(key))
                return await handler(request)
            if path.startswith("/api/") or request.method not in _SAFE_METHODS:
                return _error(401, "log in first: POST /api/v1/login with the viewer password")
            raise web.HTTPSeeOther(LOGIN_PATH + _back_to(path))
        if request.method not in _SAFE_METHODS and not await self._csrf_ok(request, session):
            return _error(
                403,
                f"missing or wrong CSRF token: send the {CSRF_COOKIE} cookie's value "
                f"in an {CSRF_HEADER} header",
            )
        if request.headers.get(hdrs.UPGRADE, "").lower() == "websocket":
            if not same_origin(request):
                return _error(403, "a live socket from another site's page is refused")
            if session is not None:
                return await self._live(request, handler, self._session_alive(session["sid"]))
        resp = await handler(request)
        if CSRF_COOKIE not in request.cookies and not resp.prepared:
            if CSRF_COOKIE not in resp.cookies:
                self._set_cookie(request, resp, CSRF_COOKIE, self._new_csrf(), http_only=False)
        return resp

    @staticmethod
    def _key_read(request: web.Request) -> bool:
        """A read an API key may make (with ``key_reads``): ``GET /api/...``."""
        return request.method in ("GET", "HEAD") and request.path.startswith("/api/")

    def _session_alive(self, sid: str) -> Callable[[], Awaitable[bool]]:
        async def alive() -> bool:
            return await logins.session_alive(self.store, sid, time.time_ns())

        return alive

    def _key_alive(self, key: str | None) -> Callable[[], Awaitable[bool]]:
        async def alive() -> bool:
            return self.config.keys.accepts(key)

        return alive

    async def _live(
        self, request: web.Request, handler: Any, alive: Callable[[], Awaitable[bool]]
    ) -> web.StreamResponse:
        """A live socket served while *alive()* says its session (or key)
        holds; closed (:data:`WS_SESSION_ENDED`) once it was logged out,
        expired, or the key was removed."""
        watcher = asyncio.create_task(self._end_when(request, alive), name="live-session")
        try:
            return await handler(request)  # returns when the socket closes
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)

    async def _end_when(self, request: web.Request, alive: Callable[[], Awaitable[bool]]) -> None:
        while True:
            await asyncio.sleep(SESSION_RECHECK_S)
            try:
                still = await alive()
            except DatabaseError:
                continue  # unknown: asked again at the next round
            if not still:
                break
        ws = request.get(LIVE_SOCKET)
        if ws is not None and not ws.closed:
            log.info("live socket closed: its session ended")
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.close(code=WS_SESSION_ENDED, message=b"logged out")

    # --- the routes ------------------------------------------------------------

    async def _session_info(self, request: web.Request) -> web.Response:
        """``GET /api/v1/session``: ``{"logged_in": bool}`` (and sets the CSRF cookie)."""
        logged_in = await self.session(request) is not None
        resp = web.json_response({"logged_in": logged_in}, dumps=_dumps)
        token = self._csrf_for(request)
        if request.cookies.get(CSRF_COOKIE) != token:
            self._set_cookie(request, resp, CSRF_COOKIE, token, http_only=False)
        return resp

    async def _login_page(self, request: web.Request) -> web.Response:
        token = self._csrf_for(request)
        resp = web.Response(
            text=_LOGIN_HTML.format(
                csrf=html.escape(token, quote=True),
                failed=_FAILED_HTML if "failed" in request.query else "",
            ),
            content_type="text/html",
            headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY"},
        )
        if request.cookies.get(CSRF_COOKIE) != token:
            self._set_cookie(request, resp, CSRF_COOKIE, token, http_only=False)
        return resp

    async def _fields(self, request: web.Request) -> tuple[str | None, str]:
        """The login's password (None: not given) and the view to go back to
        (:func:`safe_next`; the login form's ``next`` field)."""
        if request.content_type == "application/json":
            try:
                body = orjson.loads(await request.read())
            except orjson.JSONDecodeError:
                return None, ""
            value = body.get("password") if isinstance(body, dict) else None
            back = ""
        else:
            form = await request.post()
            value, back = form.get("password"), safe_next(form.get("next"))
        return (value if isinstance(value, str) and value else None), back

    async def _login(self, request: web.Request) -> web.StreamResponse:
        cfg = self.config
        client = self.client(request)
        wait = await logins.take_login_slot(
            self.store, client, time.time_ns(), cfg.login_limit, cfg.login_window_s
        )
        if wait:
            log.warning("login: %s is over %d logins a minute", client, cfg.login_limit)
            return _error(
                429,
                f"too many logins from {client}: at most {cfg.login_limit} a minute; "
                f"try again in {wait:.0f} s",
                **{"Retry-After": f"{wait:.0f}"},
            )
        password, back = await self._fields(request)
        if password is None:
            return _error(400, "give the viewer password in a JSON or form field 'password'")
        form = request.content_type != "application/json"
        if not await asyncio.to_thread(_verify, cfg.viewer_hash, password):
            if form:  # the login page's form: back to it, saying so (and where it was going)
                where = LOGIN_PATH + "?failed=1" + back
                return web.Response(status=303, headers={hdrs.LOCATION: where})
            return _error(401, "wrong password")
        token = self._new_csrf()
        sid = secrets.token_urlsafe(32)
        await logins.open_session(self.store, sid, time.time_ns(), cfg.session_s, client)
        before = self.signed_session(request)
        if before is not None:  # a new login replaces this browser's session: the old one ends
            await logins.end_session(self.store, before["sid"])
        session = self._sessions.dumps({"v": SESSION_VERSION, "sid": sid, "csrf": token})
        resp = (
            web.Response(status=303, headers={hdrs.LOCATION: "/" + back})
            if form
            else web.json_response({"ok": True, "csrf": token}, dumps=_dumps)
        )
        self._set_cookie(request, resp, SESSION_COOKIE, session, http_only=True)
        self._set_cookie(request, resp, CSRF_COOKIE, token, http_only=False)
        return resp

    async def _logout(self, request: web.Request) -> web.Response:
        """``POST /api/v1/logout``: the session ends everywhere (its record
        deleted), and this browser's cookie with it."""
        session = await self.session(request)
        if session is not None:
            await logins.end_session(self.store, session["sid"])
        resp = web.json_response({"ok": True}, dumps=_dumps)
        resp.del_cookie(SESSION_COOKIE, path="/")
        return resp


async def _security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer: never sniffed as another type (JSON stays JSON text),
    never framed by another site."""
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("X-Frame-Options", "DENY")


def _verify(hashed: str, password: str) -> bool:
    try:
        return _HASHER.verify(hashed, password)
    except argon2.exceptions.VerificationError:
        return False
    except argon2.exceptions.InvalidHashError:
        return False


def _dumps(data: Any) -> str:
    return orjson.dumps(data).decode()


def env_keys(env: Mapping[str, str] | None = None) -> list[str]:
    """``GPUPROF_API_KEY`` as a list (empty when unset)."""
    key = config.api_key(env)
    return [key] if key else []


_FAILED_HTML = '<p role="alert">Wrong password: try again.</p>'
_LOGIN_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuprof: log in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/static/login.css">
</head><body><form method="post" action="/api/v1/login">
<h1>gpuprof</h1>{failed}<label for="password">Viewer password</label>
<input id="password" name="password" type="password" autocomplete="current-password" required
autofocus><input type="hidden" name="csrf" value="{csrf}">
<input type="hidden" name="next" id="next" value=""><button type="submit">Log in</button>
</form><script src="/static/login.js"></script></body></html>
"""
