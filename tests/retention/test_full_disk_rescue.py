"""The rescue at 100 %: the state dir on the very disk that filled (ext4 ``-m 0``: no root
reserve to write into), made earlier by a routine ``enforce --once`` that deleted nothing.

The audit line and the journal entry must still be written (the audit reserve is there for
exactly this), the deletions must happen, and when they cannot, the event must say why
rather than blame protected segments.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from support.cli import json_events, run_cli
from support.configs import write_config
from support.disks import df_percent
from support.logdirs import build

MiB = 1024**2


def _offline_config(tmp_path: Path, log_dir: Path, state: Path, limit: float) -> Path:
    return write_config(
        tmp_path,
        log_dir,
        state_dir=state,
        disk_usage_percent=limit,
        mode="offline",
        offline_headroom=0,
    )


def _fill_to_the_brim(path: Path) -> None:
    """Write until ENOSPC (as a broker filling its disk would): not one block left."""
    chunk = b"\x5a" * MiB
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                break
        for size in (64 * 1024, 4096, 512, 1):  # then the last partial blocks
            while True:
                try:
                    os.write(fd, chunk[:size])
                except OSError:
                    break
        os.fsync(fd)
    finally:
        os.close(fd)
    assert os.statvfs(path).f_bavail == 0


def test_rescue_at_100_percent_with_the_state_dir_on_that_disk(disk: Path, tmp_path: Path) -> None:
    log_dir, _truth = build(disk)
    state = disk / "diskguard-state"  # on the guarded disk, beside (not inside) the log dir
    cfg = _offline_config(tmp_path, log_dir, state, 95)
    # A routine run, well under the limit: it makes the state dir, deletes nothing.
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert state.is_dir()
    # The audit reserve exists as soon as the state dir does.
    assert (state / "audit.reserve").stat().st_blocks * 512 >= MiB
    # Then the disk fills to the last block (a broker writing until "No space left").
    _fill_to_the_brim(log_dir.parent / "broker-filler")
    os.sync()
    assert df_percent(disk) == 100.0
    # Give the filler's bytes back to the log (the broker's data would be segments; the
    # filler only makes the disk full). Here: the limit is set so that only segments can
    # bring it under.
    cfg = _offline_config(tmp_path, log_dir, state, 99.0)
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    events = json_events(proc.stdout)
    deleted = [e for e in events if e["event"] == "segment_deleted"]
    assert deleted, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not [e for e in events if e["event"] == "audit_write_failed"]
    assert df_percent(disk) <= 99.0


def test_without_a_reserve_at_100_percent_the_failure_says_so(disk: Path, tmp_path: Path) -> None:
    """A state dir made by hand (or by an older diskguard) without the reserve, on a disk that
    is then full: nothing can be audited, so nothing is deleted, and every message says why
    (the reserve), not that only protected segments are left."""
    log_dir, _truth = build(disk)
    state = disk / "diskguard-state"
    state.mkdir()
    _fill_to_the_brim(log_dir.parent / "broker-filler")
    os.sync()
    cfg = _offline_config(tmp_path, log_dir, state, 99.0)
    proc = run_cli("enforce", "--once", "-c", str(cfg))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    events = json_events(proc.stdout)
    assert not [e for e in events if e["event"] == "segment_deleted"]
    (warning,) = [e for e in events if e["event"] == "audit_reserve_unavailable"]
    assert warning["path"] == str(state / "audit.reserve")
    assert "0 bytes free" in warning["reason"], warning
    failed = [e for e in events if e["event"] == "segment_delete_failed"]
    assert failed and all("audit reserve" in e["error"] for e in failed), failed
    assert "only active, protected" not in proc.stdout + proc.stderr
    # The one line for the operator names the cause too.
    assert "audit reserve" in proc.stderr.splitlines()[-1], proc.stderr
