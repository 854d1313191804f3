"""Filesystem usage as ``df`` reports it, and which mount a path lives on (edge).

KIP-61's limit is "percent of the disk in use by anything", and operators check it with
``df``; so the numbers here are df's, computed from ``statvfs`` exactly as coreutils does:
``used = (f_blocks - f_bfree) * f_frsize`` (root-reserved blocks are neither used nor
available), ``available = f_bavail * f_frsize`` (what a non-root broker may still write), and
Use% = ``used / (used + available)``, which df rounds up to an integer.

Two log dirs on one device must share one limit, so the mount (from
``/proc/self/mountinfo``: the longest mount point containing the resolved path) is the key.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from diskguard.model import FilesystemUsage

__all__ = ["Mount", "df_percent", "filesystem_usage", "mount_of", "parse_mountinfo"]

MOUNTINFO = "/proc/self/mountinfo"


class Mount(NamedTuple):
    mount_point: str
    device: str


def _unescape(field: str) -> str:
    r"""Undo the kernel's octal escapes in mountinfo (``\040`` space, ``\011`` tab, ...)."""
    if "\\" not in field:
        return field
    out = []
    i = 0
    while i < len(field):
        chunk = field[i : i + 4]
        if len(chunk) == 4 and chunk[0] == "\\" and all(c in "01234567" for c in chunk[1:]):
            out.append(chr(int(chunk[1:], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[tuple[str, str, str]]:
    """``(mount_point, fstype, source)`` per mountinfo line, in kernel order.

    Line shape: ``id parent maj:min root mount_point options [optional...] - fstype source
    super_options``; the optional fields end at the lone ``-``.
    """
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 10 or "-" not in fields[6:]:
            continue
        sep = fields.index("-", 6)
        if len(fields) < sep + 3:
            continue
        mounts.append(
            (_unescape(fields[4]), _unescape(fields[sep + 1]), _unescape(fields[sep + 2]))
        )
    return mounts


def _contains(mount_point: str, path: str) -> bool:
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point + "/")


def mount_of(path: str | os.PathLike[str], mountinfo: str | None = None) -> Mount:
    """The mount point and source device (``/dev/loop3``, ``tmpfs``) holding ``path``.

    Symlinks are resolved first, so a log dir linked onto another disk counts for that disk.
    With stacked mounts on one point the last (topmost, visible) one wins. ``mountinfo`` is
    the file's text, for tests. Raises OSError if mountinfo cannot be read and ValueError if
    no mount contains the path (only in a broken chroot).
    """
    real = os.path.realpath(path)
    if mountinfo is None:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as handle:
            mountinfo = handle.read()
    best: Mount | None = None
    for mount_point, _fstype, source in parse_mountinfo(mountinfo):
        if _contains(mount_point, real) and (
            best is None or len(mount_point) >= len(best.mount_point)
        ):
            best = Mount(mount_point, source)
    if best is None:
        raise ValueError(f"{os.fspath(path)}: no mount in {MOUNTINFO} contains {real}")
    return best


def filesystem_usage(path: str | os.PathLike[str]) -> FilesystemUsage:
    """df's view of the filesystem holding ``path`` (OSError if it cannot be stat'ed)."""
    st = os.statvfs(path)
    mount = mount_of(path)
    return FilesystemUsage(
        mount=mount.mount_point,
        device=mount.device,
        total_bytes=st.f_blocks * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        available_bytes=st.f_bavail * st.f_frsize,
    )


def df_percent(usage: FilesystemUsage) -> int:
    """Use% exactly as df prints it: rounded up, ``-`` (here 0) for an empty filesystem."""
    denominator = usage.used_bytes + usage.available_bytes
    if denominator == 0:
        return 0
    return -(-usage.used_bytes * 100 // denominator)
