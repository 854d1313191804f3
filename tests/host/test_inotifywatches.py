"""The watches the kernel lists for this process: every one, whatever its number."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from diskguard.host import inotifywatches

_IN_ATTRIB = 0x4


def test_every_watch_of_every_instance_is_listed(tmp_path: Path) -> None:
    """300 watches: their descriptors pass 0x9f, where fdinfo's ``wd:`` turns hex (a
    decimal-only reading found 129 of 300)."""
    libc = ctypes.CDLL(None, use_errno=True)
    dirs = [tmp_path / f"d{i}" for i in range(300)]
    for d in dirs:
        d.mkdir()
    fds = [libc.inotify_init1(os.O_CLOEXEC) for _ in range(2)]
    try:
        assert min(fds) >= 0, ctypes.get_errno()
        for i, d in enumerate(dirs):
            assert libc.inotify_add_watch(fds[i % 2], os.fsencode(d), _IN_ATTRIB) >= 0
        assert {d.stat().st_ino for d in dirs} <= inotifywatches.watched_inodes()
        assert tmp_path.stat().st_ino not in inotifywatches.watched_inodes()
    finally:
        for fd in fds:
            os.close(fd)
    assert inotifywatches.max_user_watches() == int(
        Path("/proc/sys/fs/inotify/max_user_watches").read_text()
    )
