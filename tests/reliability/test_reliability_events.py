"""Reliability: lost inotify events. Events are only a hint; the usage poll
(``retention.usage_poll_interval``) and the periodic rescan (``retention.check_interval``)
must converge without a single one.

- In-process, the daemon's inotify instance is replaced by one that never delivers an
  event (what lost events look like from user space): a disk pushed over its
  ceiling, and a log dir pushed over ``max_bytes`` (which only a rescan can see: usage
  percent stays low), are both brought back. Without events only the poll and the rescan
  can have done it; how long they took is printed, not asserted (``SETTLE_S`` only ends a
  test of a daemon that never acts: on two loaded cores seconds are scheduling).
- For real: the inotify *instance* limit is per user, so a helper running as ``nobody``
  takes every instance (``fs.inotify.max_user_instances``) and the daemon, also as
  ``nobody``, cannot get one. No global sysctl is touched. (Lowering
  ``max_user_watches``/``max_queued_events`` is global: it would break every other inotify
  user on the machine, including other tests running at the same time.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from inotify_simple import INotify

from diskguard.config import load_config
from diskguard.daemon import watch
from diskguard.daemon.loop import Daemon
from support.configs import write_config
from support.daemonproc import DaemonProc
from support.disks import df_percent, disk_capacity
from support.fsfixtures import fill
from support.kafkagen import SegmentSpec, write_log_dir, write_partition

MiB = 1024**2
BASE_TS = 1_700_000_000_000
#: How long the daemon may take to bring a disk back before the test fails as broken.
SETTLE_S = 60.0


def segs(n: int, minute0: int = 0) -> list[SegmentSpec]:
    return [
        SegmentSpec(
            records=10,
            payload_size=20_000,
            records_per_batch=2,
            first_timestamp_ms=BASE_TS + (minute0 + s) * 60_000,
        )
        for s in range(n)
    ]


def kafka_bytes(log_dir: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in log_dir.rglob("*") if p.is_file())


class _DeafINotify(INotify):
    """An inotify instance that accepts watches and never reports an event: none reaches
    the kernel, so the kernel's own list (``Watcher.verify``) shows the dirs unwatched."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled: list[str] = []

    def add_watch(self, path: Any, mask: int) -> int:
        self.scheduled.append(os.fsdecode(path))
        return len(self.scheduled)


def _run_in_thread(
    d: Daemon, monkeypatch: pytest.MonkeyPatch
) -> tuple[threading.Thread, list[object]]:
    monkeypatch.setattr(signal, "signal", lambda *_a: None)  # run() off the main thread
    result: list[object] = []

    def target() -> None:
        try:
            result.append(d.run())
        except BaseException as exc:  # reported by the test
            result.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, result


def test_without_any_inotify_event_the_poll_and_the_rescan_still_converge(
    disk: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log_dir = disk / "kafka-logs"
    write_log_dir(log_dir, {("orders", p): segs(6, p) for p in range(2)}, segment_index_bytes=MiB)
    os.sync()
    ceiling = round(df_percent(disk) + 3, 2)
    check_interval = 1.0
    cfg_path = write_config(
        tmp_path,
        log_dir,
        snapshots={"interval": "30s"},
        disk_usage_percent=ceiling,
        max_bytes=str(kafka_bytes(log_dir) + MiB),
        check_interval=f"{check_interval}s",
        usage_poll_interval="0.1s",
        mode="offline",
        offline_headroom=0,
    )
    config = load_config(cfg_path)
    deaf = _DeafINotify()
    monkeypatch.setattr(watch, "INotify", lambda: deaf)
    d = Daemon(config)
    thread, result = _run_in_thread(d, monkeypatch)
    try:
        deadline = time.monotonic() + SETTLE_S
        while not deaf.scheduled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert str(log_dir) in deaf.scheduled, "the daemon never asked for its watches"

        # 1. Over max_bytes (usage percent stays low): only the periodic rescan can see it.
        write_partition(log_dir, "clicks", 0, segs(8, 100), segment_index_bytes=MiB)
        budget = config.retention.max_bytes
        assert budget is not None and kafka_bytes(log_dir) > budget
        grown = time.monotonic()
        while kafka_bytes(log_dir) > budget:
            assert time.monotonic() - grown < SETTLE_S, "rescan did not act"
            assert thread.is_alive(), result
            time.sleep(0.05)
        print(f"max_bytes: back under {time.monotonic() - grown:.2f}s after, no inotify event")
        # 2. Over the ceiling, no event: the usage poll notices it.
        cap = disk_capacity(disk)
        fill(disk / "filler", int((ceiling + 3 - df_percent(disk)) / 100 * cap))
        crossed = time.monotonic()
        while df_percent(disk) > ceiling:
            assert time.monotonic() - crossed < SETTLE_S, "usage poll did not act"
            assert thread.is_alive(), result
            time.sleep(0.02)
        print(f"ceiling: back under {time.monotonic() - crossed:.2f}s after, no inotify event")
        (disk / "filler").unlink()

    finally:
        d.request_stop()
        thread.join(timeout=15)
    assert result == [0]


# ----------------------------------------------------------------------------- for real

_HOG = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while True:
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        break
    fds.append(fd)
sys.stdout.write(f"{len(fds)} {ctypes.get_errno()}\n")
sys.stdout.flush()
sys.stdin.read()
"""

_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"]


def _config_owned_by(
    disk: Path, log_dir: Path, work_name: str, uid: int
) -> tuple[Path, Path, float]:
    """A work dir and an offline config 3 points above today's usage, the config, the work dir
    and the log dir owned by ``uid`` (the daemon runs as that user); returns (work, config,
    ceiling)."""
    work = disk.parent / work_name
    work.mkdir()
    os.sync()
    ceiling = round(df_percent(disk) + 3, 2)
    cfg = write_config(
        work,
        log_dir,
        disk_usage_percent=ceiling,
        check_interval="1s",
        usage_poll_interval="0.1s",
        mode="offline",
        offline_headroom=0,
    )
    for path in [work, cfg, log_dir, *log_dir.rglob("*")]:
        os.chown(path, uid, uid, follow_symlinks=False)
    return work, cfg, ceiling


def _pushed_over_and_brought_under(disk: Path, ceiling: float, daemon: DaemonProc) -> None:
    """Fill the disk 3 points over ``ceiling``; the daemon brings it under (printed: how long)."""
    cap = disk_capacity(disk)
    fill(disk / "filler", int((ceiling + 3 - df_percent(disk)) / 100 * cap))
    crossed = time.monotonic()
    while df_percent(disk) > ceiling:
        assert time.monotonic() - crossed < SETTLE_S, "not brought under"
        assert daemon.proc.poll() is None, daemon.stderr_tail()
        time.sleep(0.05)
    print(f"ceiling: back under {time.monotonic() - crossed:.2f}s after")


def test_no_inotify_instance_left_the_daemon_still_guards_the_disk(
    disk: Path, tmp_path: Path
) -> None:
    os.chmod(disk.parent, 0o755)  # mkdtemp's 0700 would keep nobody out
    log_dir = disk / "kafka-logs"
    write_log_dir(log_dir, {("orders", p): segs(6, p) for p in range(2)}, segment_index_bytes=MiB)
    work, cfg, ceiling = _config_owned_by(disk, log_dir, "nobody", 65534)
    hog = subprocess.Popen(
        [*_NOBODY, sys.executable, "-c", _HOG],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    daemon: DaemonProc | None = None
    try:
        assert hog.stdout is not None
        taken, err = hog.stdout.readline().split()
        assert int(taken) >= 1 and int(err) == 24, (taken, err)  # EMFILE: none left for nobody
        daemon = DaemonProc(cfg, env={"HOME": str(work)}, prefix=_NOBODY)
        daemon.wait_for("daemon_started", timeout=SETTLE_S)
        time.sleep(1.0)
        assert daemon.proc.poll() is None, (
            f"daemon exited {daemon.proc.returncode}: {daemon.stderr_tail()}"
        )
        _pushed_over_and_brought_under(disk, ceiling, daemon)
    finally:
        if daemon is not None:
            daemon.stop()
        if hog.stdin is not None:
            hog.stdin.close()
        hog.wait(timeout=10)


# A uid of its own: the inotify watch limit is per user, and ``nobody`` is also the user other
# tests' Kafka brokers run as (Java's WatchService uses inotify): taking nobody's watches
# would starve them. setpriv needs no passwd entry for a numeric uid.
_WATCH_UID = 47_291

_WATCH_HOG = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
IN_ATTRIB = 0x4
files_dir, leave = sys.argv[1], int(sys.argv[2])
limit = int(open("/proc/sys/fs/inotify/max_user_watches").read())
names = [os.path.join(files_dir, n).encode() for n in sorted(os.listdir(files_dir))]
want, taken, fds = limit - leave, 0, []
while taken < want:
    fd = libc.inotify_init1(os.O_CLOEXEC)
    if fd < 0:
        sys.stdout.write(f"instance {ctypes.get_errno()}\n"); sys.stdout.flush(); sys.exit(1)
    fds.append(fd)
    for name in names:
        if taken >= want:
            break
        if libc.inotify_add_watch(fd, name, IN_ATTRIB) < 0:
            sys.stdout.write(f"watch {ctypes.get_errno()}\n"); sys.stdout.flush(); sys.exit(1)
        taken += 1
sys.stdout.write(f"{taken} {len(fds)}\n")
sys.stdout.flush()
sys.stdin.read()
"""


def test_past_the_inotify_watch_limit_the_daemon_says_so_and_still_guards(
    disk: Path, tmp_path: Path
) -> None:
    """watchdog swallows the ENOSPC of every watch past the first (a recursive watch's
    subdirectories): with 64 watches left for 301 dirs the daemon ran without a word and
    nothing in 237 partition dirs woke it. Now ``watch_failed`` says how many dirs are not
    watched and the rescans keep guarding."""
    limit = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
    instances = 100  # of the 128 a user may have: some are left for the daemon
    per_instance = -(-limit // instances)
    os.chmod(disk.parent, 0o755)  # mkdtemp's 0700 would keep the uid out
    log_dir = disk / "kafka-logs"
    small = [
        SegmentSpec(records=4, payload_size=2_000, first_timestamp_ms=BASE_TS + s * 60_000)
        for s in range(2)
    ]
    write_log_dir(log_dir, {("orders", p): small for p in range(300)}, segment_index_bytes=4096)
    files = disk.parent / "hog-files"  # not on the disk: its inodes are few
    files.mkdir()
    for i in range(per_instance):
        (files / f"{i:07d}").touch()
    work, cfg, ceiling = _config_owned_by(disk, log_dir, "watcher", _WATCH_UID)
    as_uid = ["setpriv", f"--reuid={_WATCH_UID}", f"--regid={_WATCH_UID}", "--clear-groups", "--"]
    hog = subprocess.Popen(
        [*as_uid, sys.executable, "-c", _WATCH_HOG, str(files), "64"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    daemon: DaemonProc | None = None
    try:
        assert hog.stdout is not None
        taken, _fds = hog.stdout.readline().split()
        assert int(taken) == limit - 64, taken
        daemon = DaemonProc(cfg, env={"HOME": str(work)}, prefix=as_uid)
        daemon.wait_for("daemon_started", timeout=SETTLE_S)
        failed = daemon.wait_for("watch_failed", timeout=SETTLE_S)
        assert failed["log_dir"] == str(log_dir), failed
        assert "inotify watch limit" in failed["error"], failed
        # What the kernel says the daemon watches (setpriv exec'd it: same pid).
        pid = daemon.proc.pid
        watches = sum(
            Path(f"/proc/{pid}/fdinfo/{fd}").read_text().count("\ninotify wd:")
            for fd in os.listdir(f"/proc/{pid}/fd")
            if os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:inotify"
        )
        assert 0 < watches <= 64, watches
        assert failed["unwatched_dirs"] == 301 - watches, (failed, watches)
        assert "max_user_watches" in failed["error"], failed
        assert "rescan" in failed["fallback"], failed
        _pushed_over_and_brought_under(disk, ceiling, daemon)
    finally:
        if daemon is not None:
            daemon.stop()
        if hog.stdin is not None:
            hog.stdin.close()
        hog.wait(timeout=30)
