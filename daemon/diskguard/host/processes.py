"""Whether a process id names a running process (edge).

Why one place: a state file or a temp file's name says which process wrote it, and whoever
reads it asks whether that process still runs, to trust what it wrote or to remove what it
left. A number read from a file may be any number: one no process can have is an answer
("not running"), never an ``OverflowError`` out of ``os.kill``.
"""

from __future__ import annotations

import os

__all__ = ["PID_MAX_LIMIT", "running"]

#: Linux's largest possible ``/proc/sys/kernel/pid_max`` (``PID_MAX_LIMIT``, 2^22): no
#: process id is ever above it.
PID_MAX_LIMIT = 1 << 22


def running(pid: int) -> bool:
    """Has a process (in this pid namespace) the id ``pid``? Another user's counts."""
    if not 0 < pid <= PID_MAX_LIMIT:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: there all the same
    return True
