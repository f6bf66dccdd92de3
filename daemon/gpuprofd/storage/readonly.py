"""Opening an SQLite file read-only, for gpuprofctl's reads and ``nsys-import``'s
report: ``file:…?mode=ro``, so reading never creates or changes a file (a
missing path fails instead of becoming an empty database)."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from urllib.parse import quote


def connect_ro(path: Path) -> sqlite3.Connection:
    """Connect to *path* read-only (the path is quoted: ``?`` and ``#`` are URI syntax).

    Raises:
        sqlite3.Error: it cannot be opened (missing, a directory, no permission).
    """
    return sqlite3.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True)
