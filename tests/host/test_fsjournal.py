"""Which filesystems make one directory fsync enough for a batch (``host/fsjournal.py``).

On real filesystems: a loop ext4 (jbd2 journal) says yes; ext2, ext4 made without a journal
and tmpfs say no, so their every partition dir is fsync'd. XFS (no mkfs.xfs here) is read
from a mountinfo line; anything unreadable says no.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from diskguard.host.fsjournal import commits_in_order, fstype_of_device, has_jbd2_journal
from support import fsfixtures

MiB = 1024 * 1024


def test_ext4_with_its_journal_commits_in_order(loop_ext4: Callable[..., Path]) -> None:
    mnt = loop_ext4(16 * MiB)
    dev = os.stat(mnt).st_dev
    assert fstype_of_device(dev) == "ext4"
    assert has_jbd2_journal(dev)
    assert commits_in_order(dev)


@pytest.fixture()
def unjournaled() -> Iterator[dict[str, Path]]:
    with (
        fsfixtures.loop_fs(16 * MiB, ["mkfs.ext2", "-q", "-F"], "ext2") as ext2,
        fsfixtures.loop_fs(
            16 * MiB, ["mkfs.ext4", "-q", "-F", "-O", "^has_journal"], "ext4"
        ) as bare,
    ):
        yield {"ext2": ext2, "ext4 without a journal": bare}


def test_filesystems_without_an_ordered_journal_say_no(
    unjournaled: dict[str, Path], tmpfs: Callable[[int], Path]
) -> None:
    cases = {**unjournaled, "tmpfs": tmpfs(MiB)}
    for what, mnt in cases.items():
        assert not commits_in_order(os.stat(mnt).st_dev), what


def test_xfs_from_mountinfo_and_unknown_devices() -> None:
    dev = os.makedev(8, 17)
    line = "36 25 8:17 / /data rw,noatime shared:1 - xfs /dev/sdb1 rw,attr2,inode64\n"
    assert fstype_of_device(dev, line) == "xfs"
    assert commits_in_order(dev, line)
    assert not commits_in_order(os.makedev(8, 18), line)  # not mounted: cannot tell
    btrfs = "37 25 0:41 / /data rw - btrfs /dev/sdc rw\n"
    assert not commits_in_order(os.makedev(0, 41), btrfs)


def test_an_unreadable_proc_says_no(tmp_path: Path, loop_ext4: Callable[..., Path]) -> None:
    mnt = loop_ext4(16 * MiB)
    dev = os.stat(mnt).st_dev
    assert not has_jbd2_journal(dev, proc_jbd2=str(tmp_path))  # no journal listed
    with pytest.raises(OSError):
        has_jbd2_journal(dev, proc_jbd2=str(tmp_path / "missing"))
