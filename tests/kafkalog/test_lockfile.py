"""The ``.lock`` probe and hold against real POSIX record locks held by real other processes
(the way a Kafka broker's ``FileChannel.tryLock`` holds them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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


_AS_NOBODY_LOCK = r"""
import fcntl, os, sys
os.setgid(65534); os.setuid(65534)
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
"""


def broker_user_can_lock(log_dir: Path) -> bool:
    """What a broker running as nobody (not root) experiences at start-up: Kafka opens
    ``.lock`` read-write, creating it if it is missing."""
    proc = subprocess.run(
        [sys.executable, "-c", _AS_NOBODY_LOCK, str(log_dir / ".lock")],
        timeout=30,
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0


@pytest.fixture()
def nobody_log_dir() -> Iterator[Path]:
    """A log dir owned by nobody, outside pytest's temp root (0700 root: nobody cannot
    enter it)."""
    root = Path(tempfile.mkdtemp(prefix="diskguard-lock-"))
    os.chmod(root, 0o755)
    log_dir = root / "kafka-logs"
    log_dir.mkdir()
    os.chown(log_dir, 65534, 65534)
    yield log_dir
    shutil.rmtree(root)


def test_a_lock_file_hold_created_is_gone_after_and_the_broker_user_can_lock(
    nobody_log_dir: Path,
) -> None:
    """Kafka 3.x/4.x delete ``.lock`` at a clean shutdown. A root-owned ``.lock`` left behind
    by diskguard failed the whole log dir at the next start of a non-root broker (Kafka 4.4:
    "Disk error while locking directory", AccessDeniedException): hold leaves no file."""
    log_dir = nobody_log_dir
    with lockfile.hold(log_dir):
        info = (log_dir / ".lock").stat()
        # Owned by the broker's user from the start: a crash here leaves a usable file.
        assert (info.st_uid, info.st_gid) == (65534, 65534)
        assert not broker_user_can_lock(log_dir)
    assert not (log_dir / ".lock").exists()
    assert broker_user_can_lock(log_dir)


def test_a_lock_file_left_by_root_is_given_back_to_the_log_dirs_owner(
    nobody_log_dir: Path,
) -> None:
    log_dir = nobody_log_dir
    (log_dir / ".lock").write_bytes(b"")  # root's, as an older diskguard left it
    assert not broker_user_can_lock(log_dir)
    with lockfile.hold(log_dir):
        pass
    assert (log_dir / ".lock").exists()  # not ours to remove: it was there before
    assert broker_user_can_lock(log_dir)
