"""Drop counters: every discarded message or sample is counted by reason.

Counting never raises and never blocks. Each drop is logged at debug; a
warning per reason is rate-limited so a flood of garbage cannot flood the log.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

log = logging.getLogger(__name__)

#: At most one warning per reason per this many seconds.
WARN_INTERVAL_S = 10.0


class DropCounter:
    """Counts drops by reason; remembers what has been persisted already."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.counts: Counter[str] = Counter()
        self._persisted: Counter[str] = Counter()
        self._last_warn: dict[str, float] = {}

    def add(self, reason: str, detail: str = "", n: int = 1) -> None:
        """Count *n* drops under *reason*; log at debug, warn at most every
        :data:`WARN_INTERVAL_S` seconds per reason."""
        self.counts[reason] += n
        log.debug("dropped %d (%s) %s", n, reason, detail)
        now = self._clock()
        last = self._last_warn.get(reason)
        if last is None or now - last >= WARN_INTERVAL_S:
            self._last_warn[reason] = now
            log.warning("dropping messages: %s (%d so far) %s", reason, self.counts[reason], detail)

    def snapshot(self) -> dict[str, int]:
        """This process's counts since start, by reason."""
        return dict(self.counts)

    def take_unpersisted(self) -> dict[str, int]:
        """The counts added since the last call (to add to the ``drops`` table)."""
        delta = {k: v - self._persisted[k] for k, v in self.counts.items()}
        delta = {k: n for k, n in delta.items() if n > 0}
        self._persisted.update(delta)
        return delta
