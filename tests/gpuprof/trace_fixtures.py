"""The real chrome traces in ``../shared/fixtures`` (H200 GPT, A100 NCCL), loaded once."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest

SHARED = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
H200 = SHARED / "h200"
A100 = SHARED / "kineto-a100"


@functools.cache
def _load(path: Path) -> Any:
    return orjson.loads(gzip.decompress(path.read_bytes()))


def load_trace(folder: Path, name: str) -> dict[str, Any]:
    """The parsed trace ``folder/name`` (shared, read-only: do not mutate it)."""
    path = folder / name
    if not path.exists():
        pytest.fail(f"trace fixture missing at {path}: shared/ must sit beside the repo")
    return _load(path)
