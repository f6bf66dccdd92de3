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

from gpuprofd.errors import BadInputError
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
        return StorageUrl(POSTGRES, dsn=url)
    raise BadInputError(
        f"unknown storage URL scheme {scheme!r} in {redact(url)!r}: "
        "use sqlite:///path.db or postgres://user@host/db"
    )


def redact(url: str) -> str:
    """*url* with the password of its user info replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    netloc = f"{parts.username or ''}:***@{host}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
