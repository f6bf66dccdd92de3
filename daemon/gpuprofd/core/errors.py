"""The daemon's and gpuprofctl's errors, each carrying its process exit code.

One base class so the entry points map every expected failure to a one-line
message and an exit code in one place (no tracebacks for user errors).
"""

from __future__ import annotations

#: Exit codes shared by gpuprofd and gpuprofctl.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2
"""A database that is missing, corrupt or not ours; an unknown run; bad usage."""
EXIT_NO_DAEMON = 3
"""``gpuprofctl status``: no daemon answered."""


class GpuprofdError(Exception):
    """An expected failure with a one-line message for the user."""

    exit_code = EXIT_FAILURE


class DatabaseError(GpuprofdError):
    """The database file is missing, not SQLite, or not a gpuprof database."""

    exit_code = EXIT_BAD_INPUT


class UnknownRunError(GpuprofdError):
    """A run id that is not in the database."""

    exit_code = EXIT_BAD_INPUT


class NoDaemonError(GpuprofdError):
    """No gpuprofd answered on the socket directory."""

    exit_code = EXIT_NO_DAEMON


class BadInputError(GpuprofdError):
    """An argument that cannot work (e.g. a socket path too long for Unix)."""

    exit_code = EXIT_BAD_INPUT


class UnknownGroupError(GpuprofdError):
    """A group name that no run in the database carries."""

    exit_code = EXIT_BAD_INPUT
