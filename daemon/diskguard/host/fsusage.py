"""Filesystem usage as ``df`` reports it, and which mount a path lives on (edge).

KIP-61's limit is "percent of the disk in use by anything", and operators check it with
``df``; so the numbers here are df's, computed from ``statvfs`` exactly as coreutils does:
``used = (f_blocks - f_bfree) * f_frsize`` (root-reserved blocks are neither used nor
available), ``available = f_bavail * f_frsize`` (what a non-root broker may still write), and
Use% = ``used / (used + available)``, which df rounds up to an integer.

Two log dirs on one device must share one limit, so the *device* the log dir's inode lives on
(``st_dev``) is the key, whatever path leads there: a bind mount, or two paths into one
filesystem, are one filesystem with one limit. The mount point (from
``/proc/self/mountinfo``: the longest mount point containing the resolved path) is only the
label, the first one seen for the device.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import NamedTuple

from diskguard.kafkalog.model import FilesystemUsage

__all__ = [
    "DeviceGroup",
    "Mount",
    "df_percent",
    "filesystem_usage",
    "group_by_device",
    "mount_of",
    "mountinfo_lines",
    "parse_mountinfo",
    "usage_of",
]

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
    """``(mount_point, fstype, source)`` per mountinfo line, in kernel order."""
    return [(point, fstype, source) for _dev, point, fstype, source in mountinfo_lines(text)]


def mountinfo_lines(text: str) -> list[tuple[str, str, str, str]]:
    """``(maj:min, mount_point, fstype, source)`` per mountinfo line, in kernel order.

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
            (
                fields[2],
                _unescape(fields[4]),
                _unescape(fields[sep + 1]),
                _unescape(fields[sep + 2]),
            )
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


class DeviceGroup(NamedTuple):
    """Paths on one device; ``mount``/``device`` label it (those of its first path)."""

    mount: str
    device: str
    paths: tuple[str, ...]
    #: ``st_dev`` of the paths, or None for a path that could not be stat'ed (then it is
    #: alone in its group and the label is its mount point's, as before it vanished).
    dev: int | None


def group_by_device(
    paths: Iterable[str | os.PathLike[str]], mountinfo: str | None = None
) -> list[DeviceGroup]:
    """Group ``paths`` by the device their inode lives on, keeping the order first seen.

    Why the device and not the mount point: a bind mount of the same filesystem has its own
    mount point, and counting it as a second filesystem plans the same excess twice. The
    label of a group is the mount point of its first path (config order), so it stays the
    same from cycle to cycle. ``mountinfo`` is read once (OSError if it cannot be).
    """
    if mountinfo is None:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as handle:
            mountinfo = handle.read()
    groups: dict[int | str, tuple[Mount, list[str], int | None]] = {}
    for raw in paths:
        path = os.fspath(raw)
        try:
            dev: int | None = os.stat(path).st_dev
        except OSError:
            dev = None
        key: int | str = dev if dev is not None else f"unreadable:{path}"
        if key in groups:
            groups[key][1].append(path)
        else:
            groups[key] = (mount_of(path, mountinfo), [path], dev)
    return [
        DeviceGroup(mount.mount_point, mount.device, tuple(dirs), dev)
        for mount, dirs, dev in groups.values()
    ]


def usage_of(path: str | os.PathLike[str], mount: str, device: str) -> FilesystemUsage:
    """df's view of the filesystem holding ``path``, labelled ``mount``/``device``.

    One ``statvfs``, no mountinfo read: for re-measuring a filesystem already identified.
    """
    st = os.statvfs(path)
    return FilesystemUsage(
        mount=mount,
        device=device,
        total_bytes=st.f_blocks * st.f_frsize,
        used_bytes=(st.f_blocks - st.f_bfree) * st.f_frsize,
        available_bytes=st.f_bavail * st.f_frsize,
    )


def usage_of_any(
    paths: Iterable[str | os.PathLike[str]], mount: str, device: str
) -> FilesystemUsage | None:
    """``usage_of`` the first of ``paths`` that can be measured (a log dir may be gone), or
    None when none can."""
    for path in paths:
        try:
            return usage_of(path, mount, device)
        except OSError:
            continue
    return None


def filesystem_usage(path: str | os.PathLike[str]) -> FilesystemUsage:
    """df's view of the filesystem holding ``path`` (OSError if it cannot be stat'ed)."""
    mount = mount_of(path)
    return usage_of(path, mount.mount_point, mount.device)


def df_percent(usage: FilesystemUsage) -> int:
    """Use% exactly as df prints it: rounded up, ``-`` (here 0) for an empty filesystem."""
    denominator = usage.used_bytes + usage.available_bytes
    if denominator == 0:
        return 0
    return -(-usage.used_bytes * 100 // denominator)


def allocated_bytes(st: os.stat_result) -> int:
    """Bytes a file really occupies (``st_blocks``), not its length: a sparse preallocated index
    counts only its written blocks, a ballast only what it truly reserves."""
    return st.st_blocks * 512
