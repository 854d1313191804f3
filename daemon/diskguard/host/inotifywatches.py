"""Which inodes this process's inotify instances watch, as the kernel says (edge).

A recursive watch is one watch per directory, and past ``fs.inotify.max_user_watches``
adding one fails; the daemon's reader (``daemon/watch.py``) then goes on without that dir,
so a daemon over the limit would watch some partition dirs and not the rest. The kernel
lists every watch of an instance in ``/proc/self/fdinfo/<fd>`` (one ``inotify wd:N ino:HEX
sdev:HEX ...`` line each): asking it cannot disagree with what is really watched.
"""

from __future__ import annotations

import os
import re

__all__ = ["max_user_watches", "watched_inodes"]

_FD_DIR = "/proc/self/fd"
_MAX_USER_WATCHES = "/proc/sys/fs/inotify/max_user_watches"
_WATCH_LINE = re.compile(rb"^inotify wd:[0-9a-f]+ ino:([0-9a-f]+) ", re.M)


def watched_inodes() -> set[int]:
    """Inode numbers watched by any inotify instance of this process.

    Inode numbers only, not devices: fdinfo's ``sdev`` is the superblock's device, which on
    btrfs differs from ``st_dev`` of a subvolume's files; two log dirs on different
    filesystems sharing an inode number is the only confusion left, and it can only hide a
    missing watch, never invent one. Raises OSError if ``/proc`` cannot be read.
    """
    inodes: set[int] = set()
    for name in os.listdir(_FD_DIR):
        try:
            if os.readlink(f"{_FD_DIR}/{name}") != "anon_inode:inotify":
                continue
            with open(f"/proc/self/fdinfo/{name}", "rb") as info:
                text = info.read()
        except OSError:
            continue  # closed meanwhile (listdir's own fd, another thread's)
        inodes.update(int(ino, 16) for ino in _WATCH_LINE.findall(text))
    return inodes


def max_user_watches() -> int | None:
    """``fs.inotify.max_user_watches`` (None when it cannot be read)."""
    try:
        with open(_MAX_USER_WATCHES, encoding="ascii") as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None
