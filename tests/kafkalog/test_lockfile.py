"""The ``.lock`` probe and hold against real POSIX record locks held by real other processes
(the way a Kafka broker's ``FileChannel.tryLock`` holds them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from diskguard.kafkalog import lockfile
from support.kafkagen import hold_lock

_TRY_LOCK = r"""
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(3)
sys.exit(0)
"""


def other_process_can_lock(log_dir: Path) -> bool:
    """What a broker starting now would experience: can it take ``.lock``?"""
    proc = subprocess.run(
        [sys.executable, "-c", _TRY_LOCK, str(log_dir / ".lock")], timeout=30, check=False
    )
    assert proc.returncode in (0, 3), proc
    return proc.returncode == 0


def test_missing_lock_file_is_unlocked_and_probe_creates_nothing(tmp_path: Path) -> None:
    assert lockfile.held_by_other(tmp_path) is False
    assert lockfile.holder_pid(tmp_path) is None
    assert not (tmp_path / ".lock").exists()


def test_unlocked_lock_file(tmp_path: Path) -> None:
    (tmp_path / ".lock").touch()
    assert lockfile.held_by_other(tmp_path) is False


def test_lock_held_by_another_process_is_seen_with_its_pid(tmp_path: Path) -> None:
    with hold_lock(tmp_path) as pid:
        assert lockfile.held_by_other(tmp_path) is True
        assert lockfile.holder_pid(tmp_path) == pid
        # Probing never takes the lock: the holder is unaffected and we still see it.
        assert lockfile.held_by_other(tmp_path) is True
    assert lockfile.held_by_other(tmp_path) is False


def test_hold_refuses_when_another_process_holds_it(tmp_path: Path) -> None:
    with hold_lock(tmp_path) as pid:
        with pytest.raises(lockfile.LockHeld) as info, lockfile.hold(tmp_path):
            pytest.fail("must not get here")
        assert info.value.pid == pid
        assert str(tmp_path) in str(info.value)
        assert not lockfile.held_by_us(tmp_path)


def test_hold_keeps_a_starting_broker_out_and_releases_after(tmp_path: Path) -> None:
    assert not (tmp_path / ".lock").exists()
    with lockfile.hold(tmp_path):
        # Created, as Kafka would create it.
        assert (tmp_path / ".lock").is_file()
        assert lockfile.held_by_us(tmp_path)
        assert other_process_can_lock(tmp_path) is False
    assert not lockfile.held_by_us(tmp_path)
    assert other_process_can_lock(tmp_path) is True


def test_probing_while_holding_does_not_drop_our_lock(tmp_path: Path) -> None:
    """The POSIX-lock trap: closing any fd of the file drops the process's lock. A probe
    from inside ``hold`` (also via another path to the same dir) must not open the file."""
    alias = tmp_path / "alias"
    alias.symlink_to(tmp_path)
    with lockfile.hold(tmp_path):
        for _ in range(3):
            assert lockfile.held_by_other(tmp_path) is False
            assert lockfile.held_by_other(alias) is False
        assert other_process_can_lock(tmp_path) is False


def test_nested_hold_is_reentrant(tmp_path: Path) -> None:
    with lockfile.hold(tmp_path):
        with lockfile.hold(tmp_path):
            assert other_process_can_lock(tmp_path) is False
        # The inner exit must not release the outer hold.
        assert other_process_can_lock(tmp_path) is False
    assert other_process_can_lock(tmp_path) is True


def test_a_symlinked_lock_file_counts_as_held(tmp_path: Path) -> None:
    """Doubt means "a broker may be running": the probe gates deleting files."""
    target = tmp_path / "elsewhere"
    target.touch()
    os.symlink(target, tmp_path / ".lock")
    assert lockfile.held_by_other(tmp_path) is True
    with pytest.raises(OSError), lockfile.hold(tmp_path):
        pytest.fail("must not get here")
