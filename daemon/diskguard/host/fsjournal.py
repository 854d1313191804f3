"""Does one ``fsync`` on a filesystem make every earlier directory change on it durable? (edge)

On a filesystem whose metadata goes through one journal committed in order — ext3/ext4 with
a jbd2 journal, XFS — ``fsync`` of a directory commits the journal up to that directory's
last change, and with it every change made before it anywhere on the filesystem. A batch of
offline deletions touches many partition dirs; fsyncing each of them after the first only
asks the device for another cache flush, and behind a writer each flush waits for its data
(0.1-0.4 s apiece, in a row, while the disk filled again). So there one fsync of
the dir changed last is enough. Anything else — ext2, ext4 without a journal, btrfs (its
fsync logs one inode), tmpfs, NFS, an unreadable ``/proc`` — gets every dir fsync'd, as POSIX
asks. Looked up by device number, from ``/proc/self/mountinfo`` (the filesystem type),
``/sys/dev/block`` (the block device's kernel name) and ``/proc/fs/jbd2`` (its journal).
"""

from __future__ import annotations

import os

from diskguard.host.fsusage import MOUNTINFO, mountinfo_lines

#: Filesystems whose metadata journal is always there and committed in order.
ALWAYS_JOURNALED = frozenset({"xfs"})
#: Filesystems with an (optional) jbd2 journal: in order when it exists.
JBD2 = frozenset({"ext3", "ext4"})
PROC_JBD2 = "/proc/fs/jbd2"
SYS_DEV_BLOCK = "/sys/dev/block"


def fstype_of_device(dev: int, mountinfo: str | None = None) -> str | None:
    """The filesystem type mounted from device ``dev`` (``st_dev``), or None if not found."""
    if mountinfo is None:
        with open(MOUNTINFO, encoding="utf-8", errors="surrogateescape") as handle:
            mountinfo = handle.read()
    want = f"{os.major(dev)}:{os.minor(dev)}"
    for majmin, _mount_point, fstype, _source in mountinfo_lines(mountinfo):
        if majmin == want:
            return fstype
    return None


def has_jbd2_journal(
    dev: int, proc_jbd2: str = PROC_JBD2, sys_dev_block: str = SYS_DEV_BLOCK
) -> bool:
    """Is a jbd2 journal running for block device ``dev`` (``/proc/fs/jbd2/<name>-<ino>``)?"""
    name = os.path.basename(os.path.realpath(f"{sys_dev_block}/{os.major(dev)}:{os.minor(dev)}"))
    if not name or ":" in name:
        return False
    return any(entry.startswith(name + "-") for entry in os.listdir(proc_jbd2))


def commits_in_order(dev: int, mountinfo: str | None = None) -> bool:
    """One fsync on this device's filesystem makes all its earlier metadata changes durable.
    False whenever it cannot be told (the safe answer: fsync every directory)."""
    try:
        fstype = fstype_of_device(dev, mountinfo)
        if fstype in ALWAYS_JOURNALED:
            return True
        return fstype in JBD2 and has_jbd2_journal(dev)
    except (OSError, ValueError):
        return False
