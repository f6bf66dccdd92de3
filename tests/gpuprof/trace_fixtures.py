"""The real chrome traces in ``tests/fixtures`` (H200 GPT, A100 NCCL), loaded once."""

from __future__ import annotations

import functools
import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIXTURES / "h200"
A100 = FIXTURES / "kineto-a100"


@functools.cache
def _load(path: Path) -> Any:
    return orjson.loads(gzip.decompress(path.read_bytes()))


def load_trace(folder: Path, name: str) -> dict[str, Any]:
    """The parsed trace ``folder/name`` (cached, read-only: do not mutate it)."""
    path = folder / name
    if not path.exists():
        pytest.fail(f"trace fixture missing at {path}: tests/fixtures/ is part of the repository")
    return _load(path)
