"""``prof.wrap_dataloader(dl)``: time each ``next()`` as explicit loader wait.

The wrapper is transparent otherwise (``len()`` and attribute access go to
the wrapped loader). A ``next()`` that ends the iteration (StopIteration)
or raises is not a batch and is not counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class TimedLoader:
    """An iterable over *loader* whose iterators time ``next()``.

    Args:
        loader: any iterable (a DataLoader, a list, a generator...).
        on_iter: called when an iteration starts (marks waits as explicit).
        on_wait: called with each successful ``next()``'s duration, ns.
        clock: monotonic nanoseconds.
        on_iterator: called with each iterator of *loader* (to report a
            DataLoader's worker processes); must not raise.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        on_iter: Callable[[], None],
        on_wait: Callable[[int], None],
        clock: Callable[[], int] = time.monotonic_ns,
        on_iterator: Callable[[Any], None] | None = None,
    ) -> None:
        self._loader = loader
        self._on_iter = on_iter
        self._on_wait = on_wait
        self._clock = clock
        self._on_iterator = on_iterator

    def __iter__(self) -> Iterator[Any]:
        self._on_iter()
        it = iter(self._loader)
        if self._on_iterator is not None:
            self._on_iterator(it)
        return TimedIterator(it, self._on_wait, self._clock)

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in (
            "_loader",
            "_on_iter",
            "_on_wait",
            "_clock",
            "_on_iterator",
        ):
            raise AttributeError(name)
        return getattr(self._loader, name)

    def __repr__(self) -> str:
        return f"TimedLoader({self._loader!r})"


class TimedIterator:
    """Iterator that reports each successful ``next()``'s duration (ns)."""

    def __init__(
        self, it: Iterator[Any], on_wait: Callable[[int], None], clock: Callable[[], int]
    ) -> None:
        self._it = it
        self._on_wait = on_wait
        self._clock = clock

    def __iter__(self) -> TimedIterator:
        return self

    def __next__(self) -> Any:
        clock = self._clock
        t = clock()
        item = next(self._it)  # StopIteration / errors propagate uncounted
        self._on_wait(clock() - t)
        return item
