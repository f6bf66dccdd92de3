"""Is a training process still alive? (psutil, injectable for tests)."""

from __future__ import annotations

import os

import psutil

#: Slack (s) between a process's start and its run's hello wall clock.
_CREATE_SLACK_S = 2.0


def pid_alive(pid: int | None, started_wall_ns: int | None = None) -> bool:
    """True if *pid* runs and is not a zombie.

    If *started_wall_ns* (the run's hello wall clock) is given, a process
    created after it is a different process that reused the pid: dead.
    """
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        created_s = proc.create_time()
        if started_wall_ns is not None and created_s > started_wall_ns / 1e9 + _CREATE_SLACK_S:
            return False
    except psutil.NoSuchProcess:  # includes ZombieProcess
        return False
    except psutil.AccessDenied:  # another user's live process
        return True
    return True


def pid_namespace() -> str | None:
    """This process's PID namespace (``pid:[4026531836]``), None if unknown."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
