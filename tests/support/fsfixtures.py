"""Real filesystems for tests: loop-mounted ext4 images and sized tmpfs mounts (needs root).

diskguard's numbers must match ``df`` on real filesystems (reserved blocks, ext4's own
reservations, allocation granularity), which no mock reproduces; so tests mount small real
ones. Every helper cleans up even when the test body fails, and a missing privilege or tool
is an error (RuntimeError, which the conftest fixtures turn into ``pytest.fail``), never a
silent skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

MiB = 1024 * 1024
_CHUNK = MiB


class FilesystemSetupError(RuntimeError):
    """A real filesystem could not be made (not root, no loop devices, mount refused)."""


def _run(cmd: list[str], what: str) -> str:
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FilesystemSetupError(f"{what}: {' '.join(cmd)}: {exc}") from exc
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        raise FilesystemSetupError(
            f"{what}: {' '.join(cmd)} exited {result.returncode}: {detail}"
            + ("" if os.geteuid() == 0 else " (tests that mount filesystems need root)")
        )
    return result.stdout


def _umount(mount_point: Path) -> None:
    """Unmount, retrying briefly while a just-exited process still holds a file open."""
    for _ in range(50):
        result = subprocess.run(["umount", str(mount_point)], capture_output=True, text=True)
        if result.returncode == 0 or not os.path.ismount(mount_point):
            return
        time.sleep(0.1)
    # Last resort: detach lazily so the test run does not leave a stuck mount behind.
    subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, text=True)


@contextlib.contextmanager
def loop_ext4(size_bytes: int, reserved_percent: float = 0, name: str = "mnt") -> Iterator[Path]:
    """A fresh ext4 of ``size_bytes`` on a loop device, mounted; yields the mount point.

    ``reserved_percent`` is ``mkfs.ext4 -m`` (root-reserved blocks); 0 by default so that
    df's used + available is the whole data area and test arithmetic stays simple.
    """
    mkfs = ["mkfs.ext4", "-q", "-F", "-m", str(reserved_percent)]
    with loop_fs(size_bytes, mkfs, "ext4", name) as mount_point:
        yield mount_point


@contextlib.contextmanager
def loop_fs(size_bytes: int, mkfs: list[str], fstype: str, name: str = "mnt") -> Iterator[Path]:
    """``loop_ext4`` with any ``mkfs`` command line (the image path is appended) and type:
    e.g. ext2, or ext4 without a journal (``-O ^has_journal``)."""
    workdir = Path(tempfile.mkdtemp(prefix=f"diskguard-{fstype}-"))
    image = workdir / "disk.img"
    mount_point = workdir / name
    device: str | None = None
    mounted = False
    try:
        mount_point.mkdir()
        with open(image, "wb") as handle:
            handle.truncate(size_bytes)
        _run([*mkfs, str(image)], mkfs[0])
        device = _run(["losetup", "--find", "--show", str(image)], "losetup").strip()
        _run(["mount", "-t", fstype, device, str(mount_point)], f"mount {fstype}")
        mounted = True
        yield mount_point
    finally:
        if mounted:
            _umount(mount_point)
        if device:
            subprocess.run(["losetup", "-d", device], capture_output=True, text=True)
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def loop_btrfs(size_bytes: int = 256 * MiB, name: str = "mnt") -> Iterator[Path]:
    """A fresh btrfs on a loop device (at least ~114 MiB: mkfs.btrfs refuses smaller)."""
    with loop_fs(size_bytes, ["mkfs.btrfs", "-q", "-f"], "btrfs", name) as mount_point:
        yield mount_point


@contextlib.contextmanager
def loop_xfs(
    size_bytes: int = 320 * MiB, reflink: bool = True, name: str = "mnt"
) -> Iterator[Path]:
    """A fresh XFS on a loop device (at least 300 MiB: mkfs.xfs refuses smaller);
    ``reflink`` is ``-m reflink=1|0``."""
    mkfs = ["mkfs.xfs", "-q", "-f", "-m", f"reflink={int(reflink)}"]
    with loop_fs(size_bytes, mkfs, "xfs", name) as mount_point:
        yield mount_point


def btrfs(*args: str) -> str:
    """Run ``btrfs ARGS`` (subvolume create/snapshot...); FilesystemSetupError if it fails."""
    return _run(["btrfs", *args], "btrfs")


@contextlib.contextmanager
def tmpfs(size_bytes: int, name: str = "mnt") -> Iterator[Path]:
    """A tmpfs limited to ``size_bytes`` (rounded up to pages by the kernel), mounted."""
    workdir = Path(tempfile.mkdtemp(prefix="diskguard-tmpfs-"))
    mount_point = workdir / name
    mounted = False
    try:
        mount_point.mkdir()
        _run(
            ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(mount_point)],
            "mount tmpfs",
        )
        mounted = True
        yield mount_point
    finally:
        if mounted:
            _umount(mount_point)
        shutil.rmtree(workdir, ignore_errors=True)


def fill(path: str | os.PathLike[str], nbytes: int, *, sync: bool = True) -> Path:
    """Write ``nbytes`` of real data (allocated blocks, not a sparse hole) to ``path``.

    Raises OSError (ENOSPC) if the filesystem cannot hold it; what was written stays, so a
    test can also fill a disk to the brim on purpose. ``sync`` makes statvfs see the blocks
    at once (ext4 delayed allocation would otherwise lag).
    """
    target = Path(path)
    chunk = b"\xa5" * min(_CHUNK, max(nbytes, 1))
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = nbytes
        while left > 0:
            left -= os.write(fd, chunk[: min(left, len(chunk))])
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return target
