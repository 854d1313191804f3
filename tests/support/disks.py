"""How full a mounted filesystem is, as ``df`` says, and making it fuller for a test.

``df_percent`` is df's "Use%" (used over used plus what an unprivileged user may still
write), the number diskguard's limits are compared with; ``over_ceiling`` fills a disk and
returns a limit just below its new usage, so a test has something to delete.
"""

from __future__ import annotations

import os
from pathlib import Path

from support.fsfixtures import fill


def df_percent(path: str | os.PathLike[str]) -> float:
    """Usage percent as ``df`` computes it (reserved blocks count as neither)."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    avail = st.f_bavail * st.f_frsize
    return 100.0 * used / (used + avail)


def disk_free(path: str | os.PathLike[str]) -> int:
    """Bytes an unprivileged user may still write."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def disk_capacity(path: str | os.PathLike[str]) -> int:
    """df's size as its percentages see it: used plus available (reserved blocks left out)."""
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize


def ceiling_under(path: str | os.PathLike[str], excess_bytes: int) -> float:
    """The usage limit (percent) that ``path`` is over by exactly ``excess_bytes``."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return 100.0 * (used - excess_bytes) / ((st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize)


def fill_to(mount: Path, name: str, percent: float) -> None:
    """Add a filler file ``mount/name`` bringing df usage to about ``percent``."""
    st = os.statvfs(mount)
    total = (st.f_blocks - st.f_bfree + st.f_bavail) * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    need = int(total * percent / 100) - used
    assert need > 0, (percent, df_percent(mount))
    fill(mount / name, need)


def over_ceiling(mount: Path, cushion: float = 3.0, share: float = 0.6, digits: int = 2) -> float:
    """Fill ``share`` of ``mount``'s free space; return a ceiling ``cushion`` points below
    the new usage, rounded to ``digits``."""
    fill(mount / "filler", int(disk_free(mount) * share))
    return round(df_percent(mount) - cushion, digits)


def files_under(root: Path) -> dict[str, int]:
    """relative path -> inode of everything below ``root``, symlinks not followed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = os.lstat(path).st_ino
    return out
