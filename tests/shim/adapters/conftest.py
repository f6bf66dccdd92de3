"""The adapter tests import Lightning, transformers, accelerate and DeepSpeed:
~450,000 long-lived objects, which make each full garbage collection take
~250 ms on the CI VM. Later tests time things at the millisecond (a teacher
forward chained to the student's within 1 ms), so after this package the
objects alive then are moved out of the collector's reach (``gc.freeze``),
as they would be in a long-running training process's steady state."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="package", autouse=True)
def _freeze_framework_objects() -> Iterator[None]:
    yield
    gc.collect()
    gc.freeze()
