"""Which boot of the node this is.

Samples, runs and steps carry ``CLOCK_MONOTONIC`` times, which restart at
every boot: a run after a reboot would otherwise read the previous boot's
samples taken at the same uptime. Rows that times are matched on carry the
boot's id, and reads match on it.
"""

from __future__ import annotations

from pathlib import Path

#: Linux: a random UUID the kernel draws at each boot (proc(5)).
BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")


def boot_id(path: Path = BOOT_ID_PATH) -> str | None:
    """This boot's id, or None where the platform has none (then rows of
    every boot match, as before boot ids were stored)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return text or None
