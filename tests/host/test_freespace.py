"""What the kernel says about freeing: FIEMAP shared extents and syncfs, on real filesystems."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from diskguard.host import freespace
from support import fsfixtures

MiB = 1024**2


def _write(path: Path, nbytes: int) -> None:
    with open(path, "wb") as fh:
        fh.write(os.urandom(nbytes))
        os.fsync(fh.fileno())


def _shared(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return freespace.shared_bytes(fd)
    finally:
        os.close(fd)


def _used(path: Path) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def test_shared_extents_on_btrfs_snapshots_and_reflinks(
    loop_btrfs: Callable[..., Path],
) -> None:
    mount = loop_btrfs()
    fsfixtures.btrfs("subvolume", "create", str(mount / "sv"))
    _write(mount / "sv" / "a", 3 * MiB)
    assert freespace.can_share_extents(mount / "sv")
    assert not freespace.frees_at_once(mount / "sv")
    assert _shared(mount / "sv" / "a") == 0
    subprocess.run(["cp", "--reflink=always", mount / "sv" / "a", mount / "b"], check=True)
    assert _shared(mount / "sv" / "a") == 3 * MiB == _shared(mount / "b")
    _write(mount / "sv" / "c", 2 * MiB)
    fsfixtures.btrfs("subvolume", "snapshot", "-r", str(mount / "sv"), str(mount / "snap"))
    assert _shared(mount / "sv" / "c") == 2 * MiB


def test_reflinks_on_xfs_and_nothing_shared_on_ext4(
    loop_xfs: Callable[..., Path], loop_ext4: Callable[..., Path]
) -> None:
    xfs = loop_xfs(reflink=True)
    _write(xfs / "a", 2 * MiB)
    subprocess.run(["cp", "--reflink=always", xfs / "a", xfs / "b"], check=True)
    assert freespace.can_share_extents(xfs) and _shared(xfs / "a") == 2 * MiB
    ext4 = loop_ext4(32 * MiB)
    _write(ext4 / "a", 2 * MiB)
    assert not freespace.can_share_extents(ext4) and freespace.frees_at_once(ext4)
    assert _shared(ext4 / "a") == 0


def test_syncfs_shows_what_btrfs_frees_at_its_commit(loop_btrfs: Callable[..., Path]) -> None:
    mount = loop_btrfs()
    for i in range(4):
        _write(mount / f"f{i}", 8 * MiB)
    os.sync()
    before = _used(mount)
    for i in range(4):
        os.unlink(mount / f"f{i}")
    assert before - _used(mount) < 16 * MiB  # not shown yet: the next commit is seconds away
    freespace.syncfs(mount)
    assert before - _used(mount) >= 30 * MiB
