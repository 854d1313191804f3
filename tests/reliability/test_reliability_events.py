"""Reliability: lost inotify events. Events are only a hint; the usage poll
(``retention.usage_poll_interval``) and the periodic rescan (``retention.check_interval``)
must converge without a single one.

- In-process, the daemon's watchdog ``Observer`` is replaced by one that never delivers an
  event (what a kernel queue overflow looks like from user space): a disk pushed over its
  ceiling, and a log dir pushed over ``max_bytes`` (which only a rescan can see: usage
  percent stays low), are both brought back within ``check_interval`` plus slack.
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


class _DeafObserver:
    """A watchdog Observer that accepts watches and never reports an event."""

    def __init__(self) -> None:
        self.daemon = True
        self.scheduled: list[str] = []

    def schedule(self, _handler: Any, path: str, recursive: bool = False, **_kw: Any) -> str:
        self.scheduled.append(path)
        return path

    def add_handler_for_watch(self, _handler: Any, _watch: Any) -> None:
        """A second handler on the same watch (the reclaim-latency timer): never called."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def join(self, timeout: float | None = None) -> None:
        pass


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
    deaf = _DeafObserver()
    monkeypatch.setattr(watch, "Observer", lambda: deaf)
    d = Daemon(config)
    thread, result = _run_in_thread(d, monkeypatch)
    try:
        deadline = time.monotonic() + 10
        while not deaf.scheduled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert deaf.scheduled == [str(log_dir)], "the daemon never asked for its watches"

        # 1. Over max_bytes (usage percent stays low): only the periodic rescan can see it.
        write_partition(log_dir, "clicks", 0, segs(8, 100), segment_index_bytes=MiB)
        budget = config.retention.max_bytes
        assert budget is not None and kafka_bytes(log_dir) > budget
        grown = time.monotonic()
        while kafka_bytes(log_dir) > budget:
            assert time.monotonic() - grown < check_interval + 4, "rescan did not act"
            assert thread.is_alive(), result
            time.sleep(0.05)
        print(f"max_bytes: back under {time.monotonic() - grown:.2f}s after, no inotify event")
        # 2. Over the ceiling, no event: the usage poll notices it.
        cap = disk_capacity(disk)
        fill(disk / "filler", int((ceiling + 3 - df_percent(disk)) / 100 * cap))
        crossed = time.monotonic()
        while df_percent(disk) > ceiling:
            assert time.monotonic() - crossed < check_interval + 4, "usage poll did not act"
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


def test_no_inotify_instance_left_the_daemon_still_guards_the_disk(
    disk: Path, tmp_path: Path
) -> None:
    os.chmod(disk.parent, 0o755)  # mkdtemp's 0700 would keep nobody out
    log_dir = disk / "kafka-logs"
    write_log_dir(log_dir, {("orders", p): segs(6, p) for p in range(2)}, segment_index_bytes=MiB)
    work = disk.parent / "nobody"
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
        os.chown(path, 65534, 65534, follow_symlinks=False)
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
        daemon.wait_for("daemon_started", timeout=20)
        time.sleep(1.0)
        assert daemon.proc.poll() is None, (
            f"daemon exited {daemon.proc.returncode}: {daemon.stderr_tail()}"
        )
        cap = disk_capacity(disk)
        fill(disk / "filler", int((ceiling + 3 - df_percent(disk)) / 100 * cap))
        crossed = time.monotonic()
        while df_percent(disk) > ceiling:
            assert time.monotonic() - crossed < 6, "not brought under without inotify"
            assert daemon.proc.poll() is None, daemon.stderr_tail()
            time.sleep(0.05)
    finally:
        if daemon is not None:
            daemon.stop()
        if hog.stdin is not None:
            hog.stdin.close()
        hog.wait(timeout=10)
