"""When, and whether, a filesystem gives an unlinked file's blocks back (edge).

``statvfs`` right after an unlink is not always the truth about what it freed:

- on a copy-on-write filesystem a file's blocks can belong to other files too: a snapshot of
  its subvolume (btrfs), a reflinked copy (``cp --reflink``, btrfs and XFS ``reflink=1``),
  deduplication. Unlinking such a file frees none of those blocks, and ``st_blocks`` does not
  show it (a guard trusting ``st_blocks`` deleted six segments a run on a snapshotted btrfs
  and freed nothing). ``FIEMAP`` (``ioctl FS_IOC_FIEMAP``) flags each shared extent
  ``FIEMAP_EXTENT_SHARED``: ``shared_bytes``. Only filesystems that can share extents are
  asked (``can_share_extents``, by ``statfs`` ``f_type``);
- btrfs shows freed extents at its next transaction commit (every 30 s by default), XFS
  after its background inode inactivation, ZFS at its next transaction group: ``syncfs``
  makes each of them do it now (measured: btrfs and XFS show the space within a few ms);
- ext2/3/4 and tmpfs give blocks back in the unlink itself (``frees_at_once``): there a
  shortfall can only be a file someone still holds open, or other writers' growth.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from typing import Any

__all__ = ["can_share_extents", "frees_at_once", "shared_bytes", "syncfs"]

#: ``statfs.f_type`` of filesystems on which files can share extents (reflinks, snapshots).
_SHARING_FS = frozenset(
    {
        0x9123683E,  # btrfs
        0x58465342,  # XFS (reflink=1; shared extents are flagged either way)
        0xCA451A4E,  # bcachefs
        0x7461636F,  # OCFS2
    }
)

#: ``f_type`` of filesystems whose unlink gives the blocks back before it returns (nothing
#: shared, nothing deferred): ext2/3/4 (one magic), tmpfs, ramfs.
_FREES_AT_ONCE = frozenset({0xEF53, 0x01021994, 0x858458F6})

_FS_IOC_FIEMAP = 0xC020660B  # _IOWR('f', 11, struct fiemap)
_FIEMAP = struct.Struct("=QQIIII")  # fm_start, fm_length, fm_flags, mapped, count, reserved
_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3 reserved
_EXTENT_SHARED = 0x2000
_EXTENT_LAST = 0x1
_BATCH = 128  # extents per ioctl; a segment is a few extents unless fragmented
_MAX_LENGTH = 0xFFFFFFFFFFFFFFFF


_libc: Any = None
_statfs_type_class: Any = None


def _load() -> tuple[Any, Any]:
    """libc and the ``struct statfs`` type, made at first use: ``plan``, ``enforce`` and the
    daemon import this module, most of them on filesystems that never need it (ctypes costs
    its import time)."""
    global _libc, _statfs_type_class
    if _libc is None:
        import ctypes

        class _Statfs(ctypes.Structure):
            """``struct statfs`` on 64-bit Linux (f_type first; the rest is not read)."""

            _fields_ = [
                ("f_type", ctypes.c_long),
                ("f_bsize", ctypes.c_long),
                ("f_blocks", ctypes.c_ulong),
                ("f_bfree", ctypes.c_ulong),
                ("f_bavail", ctypes.c_ulong),
                ("f_files", ctypes.c_ulong),
                ("f_ffree", ctypes.c_ulong),
                ("f_fsid", ctypes.c_int * 2),
                ("f_namelen", ctypes.c_long),
                ("f_frsize", ctypes.c_long),
                ("f_flags", ctypes.c_long),
                ("f_spare", ctypes.c_long * 4),
            ]

        _statfs_type_class = _Statfs
        _libc = ctypes.CDLL(None, use_errno=True)
    return _libc, _statfs_type_class


def _errno() -> int:
    import ctypes

    return ctypes.get_errno()


def _statfs_type(path: str | os.PathLike[str]) -> int:
    libc, statfs_class = _load()
    import ctypes

    buf = statfs_class()  # one per call: the daemon's threads may ask at once
    if libc.statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
        err = _errno()
        raise OSError(err, os.strerror(err), os.fspath(path))
    return int(buf.f_type) & 0xFFFFFFFF


def can_share_extents(path: str | os.PathLike[str]) -> bool:
    """Can files on ``path``'s filesystem share extents (so ``shared_bytes`` is worth asking)?
    False when it cannot be told: then nothing is asked, as on ext4 or tmpfs."""
    try:
        return _statfs_type(path) in _SHARING_FS
    except OSError:
        return False


def frees_at_once(path: str | os.PathLike[str]) -> bool:
    """Does an unlink on ``path``'s filesystem give its blocks back at once, always (ext4,
    tmpfs)? False when it cannot be told."""
    try:
        return _statfs_type(path) in _FREES_AT_ONCE
    except OSError:
        return False


def syncfs(path: str | os.PathLike[str]) -> None:
    """``syncfs(2)`` on ``path``'s filesystem: commit it now, so that what was unlinked shows
    free (btrfs at its commit, XFS after inode inactivation). Raises OSError."""
    libc, _statfs_class = _load()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if libc.syncfs(fd) != 0:
            err = _errno()
            raise OSError(err, os.strerror(err), os.fspath(path))
    finally:
        os.close(fd)


def shared_bytes(fd: int) -> int:
    """Bytes of the open file ``fd`` in extents flagged shared (a snapshot, a reflink, dedup):
    what unlinking it would not give back. 0 where FIEMAP is not supported (``EOPNOTSUPP``,
    ``ENOTTY``: nothing can be known, as before). Extents still in delayed allocation are
    not shared yet. Raises OSError for any other failure."""
    total = 0
    start = 0
    buf = bytearray(_FIEMAP.size + _BATCH * _EXTENT.size)
    while True:
        _FIEMAP.pack_into(buf, 0, start, _MAX_LENGTH - start, 0, 0, _BATCH, 0)
        buf[_FIEMAP.size :] = bytes(_BATCH * _EXTENT.size)
        try:
            fcntl.ioctl(fd, _FS_IOC_FIEMAP, buf, True)
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL):
                return 0
            raise
        mapped = _FIEMAP.unpack_from(buf, 0)[3]
        if mapped == 0:
            return total
        last_end = start
        for i in range(mapped):
            logical, _phys, length, _r1, _r2, flags, *_ = _EXTENT.unpack_from(
                buf, _FIEMAP.size + i * _EXTENT.size
            )
            if flags & _EXTENT_SHARED:
                total += length
            last_end = logical + length
            if flags & _EXTENT_LAST:
                return total
        if mapped < _BATCH or last_end <= start:
            return total
        start = last_end
