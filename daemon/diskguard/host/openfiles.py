"""Deleted-but-still-open files: space ``df`` counts and no directory walk can find (edge).

A file unlinked while a process holds it open keeps its blocks until the last descriptor
closes; ``statvfs`` sees them, ``du`` and diskguard's own scan do not. It is the classic
cause of "disk full but du says otherwise" (a broker holding segments another tool removed,
a rotated log a process never reopened), and deleting Kafka segments cannot fix it, so the
operator must be told which process holds how much.

The kernel shows each descriptor as ``/proc/PID/fd/N``, a magic link whose target reads
``/path (deleted)`` and which ``stat`` follows to the open inode itself, link count 0 and
all; ``st_dev`` says which filesystem it is on. Processes we may not inspect (another user's,
without CAP_SYS_PTRACE / CAP_DAC_READ_SEARCH) are skipped and counted, never an error.

Not covered: deleted files held only by a memory mapping (``/proc/PID/map_files`` needs
CAP_SYS_ADMIN); Kafka closes and unmaps a segment's indexes when it deletes it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = [
    "OpenDeletedFile",
    "OpenFilesScan",
    "bytes_by_device",
    "deleted_open_files",
    "held_by_mount",
    "scan_deleted_open_files",
]

_DELETED = " (deleted)"


@dataclass(frozen=True)
class OpenDeletedFile:
    """One descriptor holding an unlinked file open."""

    pid: int
    comm: str
    fd: int
    #: The path the file had, without the kernel's `` (deleted)`` suffix.
    path: str
    #: Allocated bytes (``st_blocks * 512``): what freeing it would give back.
    bytes: int
    #: Apparent size (``st_size``); larger than ``bytes`` for sparse files.
    size: int
    device: int
    inode: int


@dataclass(frozen=True)
class OpenFilesScan:
    files: tuple[OpenDeletedFile, ...]
    #: Processes whose descriptors we were not allowed to read.
    denied_pids: int

    @property
    def total_bytes(self) -> int:
        """Bytes held, each inode once even when several descriptors hold it."""
        return sum(bytes_by_device(self.files).values())


def _device_ids(mounts: Iterable[str | int]) -> set[int]:
    devices: set[int] = set()
    for mount in mounts:
        if isinstance(mount, int):
            devices.add(mount)
        else:
            devices.add(os.stat(mount).st_dev)
    return devices


def _pids(proc: str) -> list[int]:
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def _comm(proc: str, pid: int) -> str:
    try:
        with open(f"{proc}/{pid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().rstrip("\n")
    except OSError:
        return "?"


def scan_deleted_open_files(
    mounts: Iterable[str | int],
    pids: Iterable[int] | None = None,
    proc: str = "/proc",
) -> OpenFilesScan:
    """Every open, unlinked regular file on the given filesystems.

    ``mounts`` are mount points (any path on the filesystem works) or ``st_dev`` ids;
    ``pids`` narrows the scan (e.g. to the broker) instead of walking every process.
    Raises OSError only if a mount point itself cannot be stat'ed.
    """
    devices = _device_ids(mounts)
    found: list[OpenDeletedFile] = []
    denied = 0
    for pid in sorted(_pids(proc) if pids is None else set(pids)):
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except PermissionError:
            denied += 1
            continue
        except OSError:  # exited meanwhile, or a kernel thread
            continue
        comm: str | None = None
        for name in fds:
            link = f"{fd_dir}/{name}"
            try:
                target = os.readlink(link)
                if not target.endswith(_DELETED):
                    continue
                st = os.stat(link)
            except OSError:  # descriptor closed meanwhile
                continue
            # nlink 0 tells a truly unlinked file from one whose name ends in " (deleted)".
            if st.st_dev not in devices or st.st_nlink != 0 or not stat.S_ISREG(st.st_mode):
                continue
            if comm is None:
                comm = _comm(proc, pid)
            found.append(
                OpenDeletedFile(
                    pid=pid,
                    comm=comm,
                    fd=int(name),
                    path=target.removesuffix(_DELETED),
                    bytes=st.st_blocks * 512,
                    size=st.st_size,
                    device=st.st_dev,
                    inode=st.st_ino,
                )
            )
    return OpenFilesScan(tuple(found), denied)


def deleted_open_files(
    mounts: Iterable[str | int], pids: Iterable[int] | None = None
) -> list[OpenDeletedFile]:
    """The files of :func:`scan_deleted_open_files`, largest first."""
    files = scan_deleted_open_files(mounts, pids).files
    return sorted(files, key=lambda f: (-f.bytes, f.pid, f.fd))


def bytes_by_device(files: Iterable[OpenDeletedFile]) -> dict[int, int]:
    """Allocated bytes held per ``st_dev``, counting each inode once."""
    seen: set[tuple[int, int]] = set()
    out: dict[int, int] = {}
    for f in files:
        if (f.device, f.inode) in seen:
            continue
        seen.add((f.device, f.inode))
        out[f.device] = out.get(f.device, 0) + f.bytes
    return out


def held_by_mount(mounts: Iterable[str]) -> dict[str, int]:
    """Bytes deleted-but-open files hold on each mount point (each inode once).

    A mount point that cannot be stat'ed after the walk is left out; raises OSError like
    :func:`scan_deleted_open_files` when one cannot be stat'ed before it.
    """
    mounts = list(mounts)
    held = bytes_by_device(scan_deleted_open_files(mounts).files)
    out: dict[str, int] = {}
    for mount in mounts:
        try:
            out[mount] = held.get(os.stat(mount).st_dev, 0)
        except OSError:
            continue
    return out
