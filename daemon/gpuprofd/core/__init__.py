"""What every part of the daemon uses, below all of them: errors and their
exit codes, drop counters, the boot id and the single-instance lock. It
imports nothing of the daemon's."""
