"""Storage URLs: where a gpuprof database lives.

- ``sqlite:///abs/path.db`` (``sqlite:////abs/path.db`` too), ``sqlite://rel/path.db``
  or a plain path: a file;
- ``postgres://user[:password]@host[:port]/db[?search_path=schema]`` (also
  ``postgresql://``): a Postgres database; query parameters other than
  asyncpg's own are Postgres settings (``search_path`` puts gpuprof's tables
  in that schema).

A password is never printed: :attr:`StorageUrl.display` hides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from gpuprofd.core.errors import BadInputError
from gpuprofd.storage.dialect import POSTGRES, SQLITE, Dialect

_POSTGRES_SCHEMES = ("postgres", "postgresql")


@dataclass(frozen=True)
class StorageUrl:
    """A parsed storage URL: a SQLite *path*, or a Postgres *dsn*."""

    dialect: Dialect
    path: Path | None = None
    dsn: str | None = None

    @property
    def is_file(self) -> bool:
        return self.path is not None

    @property
    def display(self) -> str:
        """The URL as said to people: a file's absolute path, or the Postgres
        URL with its password replaced by ``***``."""
        if self.path is not None:
            return str(self.path.absolute())
        assert self.dsn is not None
        return redact(self.dsn)

    def __repr__(self) -> str:  # never the password, even in a traceback or log
        return f"StorageUrl({self.display!r})"


def parse(url: str | Path) -> StorageUrl:
    """Parse *url* (a storage URL or a file path).

    Raises:
        BadInputError: an unknown scheme, or a ``sqlite:`` URL without a path.
    """
    if isinstance(url, Path):
        return StorageUrl(SQLITE, path=url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return StorageUrl(SQLITE, path=Path(url))
    scheme = scheme.lower()
    if scheme == "sqlite":
        if not rest:
            raise BadInputError(f"{url!r} names no file: write sqlite:///absolute/path.db")
        if rest.startswith("/"):  # sqlite:///abs and sqlite:////abs are both absolute
            rest = "/" + rest.lstrip("/")
        return StorageUrl(SQLITE, path=Path(rest))
    if scheme in _POSTGRES_SCHEMES:
        _check_postgres(url)
        return StorageUrl(POSTGRES, dsn=url)
    raise BadInputError(
        f"unknown storage URL scheme {scheme!r} in {redact(url)!r}: "
        "use sqlite:///path.db or postgres://user@host/db"
    )


#: Query parameters whose values are secrets (libpq's and asyncpg's names).
_SECRET_PARAMS = frozenset({"password", "sslpassword"})


def redact(url: str) -> str:
    """*url* with every password in it (``user:PASSWORD@`` and
    ``?password=``) replaced by ``***``; an unreadable URL as a placeholder."""
    try:
        parts = urlsplit(url)
        userinfo, at, hostport = parts.netloc.rpartition("@")
    except ValueError:
        return "<unreadable URL>"
    if at and ":" in userinfo:
        userinfo = userinfo.split(":", 1)[0] + ":***"
    netloc = f"{userinfo}@{hostport}" if at else hostport
    query = "&".join(
        f"{k}=***" if k.lower() in _SECRET_PARAMS else f"{k}={v}" if sep else k
        for k, sep, v in (item.partition("=") for item in parts.query.split("&") if item)
    )
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def has_password(url: str) -> bool:
    """Does *url* carry a password (``user:PASSWORD@`` or ``?password=``)?
    Asked of its parts, not by comparing :func:`redact`'s output: rebuilding a
    URL can change it (``sqlite:///x.db`` comes back as ``sqlite:/x.db``)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return False
    userinfo, at, _ = parts.netloc.rpartition("@")
    secret_param = any(
        item.partition("=")[0].lower() in _SECRET_PARAMS for item in parts.query.split("&")
    )
    return bool(at and ":" in userinfo) or secret_param


def _check_postgres(url: str) -> None:
    """Refuse a Postgres URL that cannot be read, without repeating it (a
    password with ``/``, ``#``, ``?`` or ``@`` splits it in odd places).

    Raises:
        BadInputError: no host, or a port that is not a number.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError on a port that is no number
        ok = bool(parts.hostname) or "host=" in parts.query
    except ValueError:
        ok = False
    if not ok:
        raise BadInputError(
            "the postgres:// storage URL could not be read: write "
            "postgres://user[:password]@host[:port]/database, with /, #, ?, @ and : in "
            "the password percent-encoded (or keep the password in ~/.pgpass)"
        )
