"""Stuck over the limit: the daemon says so once and waits, it does not spin (issue 11, item 7).

``diskguard run`` as a real process over a loop ext4 that is over its ceiling where nothing
more can be done: only active segments left, only a protected topic left, ``.lock`` held by
another process with mode offline, or dry-run. Before the fix every cycle's own reads of
``.lock`` and the checkpoints woke the loop for another cycle: 40-90 % CPU and hundreds of
log lines a second. Here, over a quiet window, a handful of lines and a small CPU time (from
``/proc/PID/stat``; generous bounds, not timings); then the disk really changes and the
daemon acts on it. That a change ends the backed-off skipping at its next iteration rather
than at the next rescan is held without a clock in ``tests/daemon/test_quiet.py``; here the
time taken is printed, never asserted (on two loaded cores it is scheduling, not the daemon).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path

import pytest

from support import configs
from support.daemonproc import DaemonProc
from support.disks import over_ceiling
from support.kafkagen import SegmentSpec, hold_lock, write_log_dir, write_partition

MiB = 1024**2
BASE_TS = 1_700_000_000_000
WINDOW_S = 8.0
MAX_LINES = 4
MAX_CPU_S = 1.0
#: How long the daemon may take to act on the change before the test fails as broken.
ACT_S = 60.0


def seg(minute: int) -> SegmentSpec:
    return SegmentSpec(
        records=20,
        payload_size=10_000,
        records_per_batch=5,
        timestamp_step_ms=10,
        first_timestamp_ms=BASE_TS + minute * 60_000,
    )


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (fields 14 and 15 of /proc/PID/stat)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_config(tmp: Path, log_dir: Path, limit: float, mode: str) -> Path:
    return configs.write_config(
        tmp, log_dir, disk_usage_percent=limit, mode=mode, offline_headroom=0
    )


def add_deletable_partition(disk: Path, log_dir: Path) -> None:
    """A partition with one old closed segment appears whole (written aside, then moved in),
    as a rename is what a broker's own directory moves look like too."""
    staging = disk / "staging"
    staging.mkdir()
    write_partition(staging, "fresh", 0, [seg(-1000), seg(5)])
    os.rename(staging / "fresh-0", log_dir / "fresh-0")


def remount(disk: Path, how: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{how}", str(disk)], check=True, timeout=30)


def quiet_window(daemon: DaemonProc) -> tuple[int, float]:
    """Lines logged and CPU seconds used over ``WINDOW_S`` of being stuck."""
    lines, cpu = len(daemon.raw), cpu_seconds(daemon.proc.pid)
    time.sleep(WINDOW_S)
    return len(daemon.raw) - lines, cpu_seconds(daemon.proc.pid) - cpu


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("active", "target_unreachable"),
        ("protected", "target_unreachable"),
        ("lock", "refused"),
        ("dry-run", "dry_run"),
        ("read-only", "delete_failed"),
    ],
)
def test_stuck_over_the_limit_is_quiet_then_reacts_to_a_real_change(
    disk: Path, tmp_path: Path, case: str, reason: str
) -> None:
    log_dir = disk / "kafka-logs"
    if case == "active":
        write_log_dir(log_dir, {("orders", p): [seg(p)] for p in range(3)})
    elif case == "protected":
        write_log_dir(log_dir, {("__consumer_offsets", p): [seg(p), seg(10 + p)] for p in range(3)})
    else:
        write_log_dir(log_dir, {("orders", p): [seg(p), seg(10 + p)] for p in range(3)})
    limit = over_ceiling(disk, 10)
    mode = {"lock": "offline", "dry-run": "dry-run"}.get(case, "offline")
    config = write_config(tmp_path, log_dir, limit, mode)

    # What the daemon must find from its first cycle on is in place before it starts: taken
    # after, the daemon could win the race on a loaded machine and delete in offline mode.
    with contextlib.ExitStack() as held:
        if case == "lock":
            held.enter_context(hold_lock(log_dir, timeout_s=60))
        if case == "read-only":
            # What ext4 does after a disk error (errors=remount-ro): every deletion fails.
            remount(disk, "ro")
            held.callback(remount, disk, "rw")
        with DaemonProc(config) as daemon:
            daemon.wait_for("daemon_started")
            time.sleep(1.0)
            lines, cpu = quiet_window(daemon)
            print(f"{case}: {lines} lines, {cpu:.2f} s CPU over {WINDOW_S} s stuck")
            assert lines <= MAX_LINES, daemon.raw[-10:]
            assert cpu < MAX_CPU_S, f"{cpu:.2f} s CPU in {WINDOW_S} s while stuck"
            stuck = daemon.named("retention_stuck")
            assert len(stuck) == 1 and stuck[0]["reason"] == reason, stuck
            assert stuck[0]["mount"] == str(disk)
            assert not daemon.named("segment_deleted")
            if case in ("active", "protected"):
                assert len(daemon.named("retention_target_unreachable")) == 1
            if case == "lock":
                assert len(daemon.named("retention_refused")) == 1
            if case == "read-only":
                assert "Read-only file system" in stuck[0]["detail"], stuck
                assert len(daemon.named("segment_delete_failed")) == 3  # the first cycle's, once

            # Now the disk really changes: the daemon acts on it.
            changed = time.monotonic()
            if case in ("active", "protected"):
                add_deletable_partition(disk, log_dir)
                event = daemon.wait_for("segment_deleted", timeout=ACT_S, topic="fresh")
                assert event["base_offset"] == 0
            elif case == "read-only":
                remount(disk, "rw")  # repaired; then a partition appears (a real change)
                add_deletable_partition(disk, log_dir)
                daemon.wait_for("segment_deleted", timeout=ACT_S)
                daemon.wait_for("retention_stuck_cleared", timeout=ACT_S, reason="delete_failed")
            elif case == "lock":
                held.close()  # the holder exits: the kernel drops its lock
                daemon.wait_for("segment_deleted", timeout=ACT_S)
                daemon.wait_for("retention_stuck_cleared", timeout=ACT_S, reason="refused")
            else:
                (disk / "filler").unlink()
                daemon.wait_for("retention_stuck_cleared", timeout=ACT_S, reason="dry_run")
            print(f"{case}: acted {time.monotonic() - changed:.2f} s after the change")
            assert daemon.stop() == 0
            assert all(e["event"] != "<not json>" for e in daemon.events)
