"""Deletions that free nothing, or free it later: btrfs and XFS, for real.

- A btrfs snapshot of the log dir's subvolume, or reflinked copies of its segments (btrfs,
  XFS ``reflink=1``), share the segments' extents: unlinking them frees nothing, and
  ``st_blocks`` does not show it. ``plan`` must say so in advance (FIEMAP) and nothing may go.
- Plain btrfs shows freed extents at its next commit, XFS after background inode
  inactivation: what diskguard unlinked counts as pending until the filesystem shows it
  (``syncfs``, a bounded wait), so a cycle neither reports "still over" nor deletes again.
- Space that does not come back although nothing said so in advance (here: segment files a
  backup process holds open) stops the retention on that filesystem, in one event, also
  across separate ``enforce --once`` runs: a retry loop must not walk the history.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from support import fsfixtures
from support.cli import json_events, run_cli
from support.configs import write_config
from support.daemonproc import DaemonProc
from support.disks import ceiling_under, df_percent
from support.kafkagen import SegmentSpec, write_log_dir
from support.logdirs import build

BASE_TS = 1_700_000_000_000
MiB = 1024**2
#: A daemon that rescans and polls fast enough for a few seconds of test to hold many cycles.
_DAEMON_PACE = {"check_interval": "200ms", "usage_poll_interval": "20ms"}


def _segment_bytes(truth: dict[Any, tuple[int, list[Path]]]) -> int:
    return max(sum(os.lstat(f).st_blocks * 512 for f in files) for _, files in truth.values())


def _over_by_2_5_segments(
    tmp_path: Path, log_dir: Path, mount: Path, segment_bytes: int, **retention: object
) -> tuple[Path, float]:
    """An offline config whose limit the disk is over by 2.5 segments, and that limit."""
    limit = round(ceiling_under(mount, int(2.5 * segment_bytes)), 3)
    cfg = write_config(
        tmp_path,
        log_dir,
        disk_usage_percent=limit,
        mode="offline",
        offline_headroom=0,
        **retention,
    )
    return cfg, limit


def _reflinked_copy(log_dir: Path, mount: Path) -> None:
    subprocess.run(
        ["cp", "-a", "--reflink=always", str(log_dir), str(mount / "backup")], check=True
    )
    os.sync()


def _enforce(cfg: Path) -> tuple[int, list[dict[str, Any]], str]:
    proc = run_cli("enforce", "--once", "--json", "-c", str(cfg))
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json_events(proc.stdout), proc.stderr


def _deleted(events: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    return [
        (e["topic"], e["partition"], e["base_offset"])
        for e in events
        if e["event"] == "segment_deleted"
    ]


def _live_segments(log_dir: Path) -> set[str]:
    return {str(p) for p in log_dir.rglob("*.log")}


# ----------------------------------------------------------------- shared extents, in advance


def _assert_nothing_goes_and_it_says_why(log_dir: Path, cfg: Path, shared_by: str) -> None:
    before = _live_segments(log_dir)
    proc = run_cli("plan", "--json", "-c", str(cfg))
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    (fs,) = plan["filesystems"]
    assert fs["excess_bytes"] > 0, fs
    assert plan["deletions"] == [], plan["deletions"]
    assert fs["unreachable_bytes"] > 0, fs
    assert "extents shared" in proc.stderr and shared_by in proc.stderr, proc.stderr
    human = run_cli("plan", "-c", str(cfg))
    assert "share their extents" in " ".join(human.stdout.split()), human.stdout
    for _run in range(3):  # a retry loop: every run keeps every segment
        code, events, stderr = _enforce(cfg)
        assert code == 1, (events, stderr)
        assert _deleted(events) == [], events
        (why,) = [e for e in events if e["event"] == "retention_target_unreachable"]
        assert "snapshot" in why["reason"] and "reflink" in why["reason"], why
    assert _live_segments(log_dir) == before


def test_a_btrfs_snapshot_of_the_log_dir_frees_nothing_and_nothing_goes(
    loop_btrfs: Callable[..., Path], tmp_path: Path
) -> None:
    mount = loop_btrfs()
    fsfixtures.btrfs("subvolume", "create", str(mount / "kafka-logs"))
    log_dir, truth = build(mount)
    os.sync()
    fsfixtures.btrfs("subvolume", "snapshot", "-r", str(log_dir), str(mount / "nightly"))
    os.sync()
    cfg, _limit = _over_by_2_5_segments(tmp_path, log_dir, mount, _segment_bytes(truth))
    _assert_nothing_goes_and_it_says_why(log_dir, cfg, "snapshot")


def test_reflinked_copies_on_btrfs_free_nothing_and_nothing_goes(
    loop_btrfs: Callable[..., Path], tmp_path: Path
) -> None:
    mount = loop_btrfs()
    log_dir, truth = build(mount)
    _reflinked_copy(log_dir, mount)
    cfg, _limit = _over_by_2_5_segments(tmp_path, log_dir, mount, _segment_bytes(truth))
    _assert_nothing_goes_and_it_says_why(log_dir, cfg, "reflink")


def test_reflinked_copies_on_xfs_free_nothing_and_nothing_goes(
    loop_xfs: Callable[..., Path], tmp_path: Path
) -> None:
    mount = loop_xfs(reflink=True)
    log_dir, truth = build(mount)
    _reflinked_copy(log_dir, mount)
    cfg, _limit = _over_by_2_5_segments(tmp_path, log_dir, mount, _segment_bytes(truth))
    _assert_nothing_goes_and_it_says_why(log_dir, cfg, "reflink")


# ------------------------------------------------------------------------- freed later


def _big_log_dir(mount: Path, segments: int = 6, payload: int = 400_000) -> tuple[Path, int]:
    """4 partitions x ``segments`` segments of ~8 MB: XFS shows such unlinks free only after
    its background inode inactivation (small ones it often frees at once)."""
    log_dir = mount / "kafka-logs"
    parts = {
        ("orders", p): [
            SegmentSpec(
                records=20, payload_size=payload, first_timestamp_ms=BASE_TS + (s * 4 + p) * 60_000
            )
            for s in range(segments)
        ]
        for p in range(4)
    }
    write_log_dir(log_dir, parts)
    os.sync()
    return log_dir, 20 * payload


def _assert_exactly_the_plan_goes_and_exit_0(log_dir: Path, mount: Path, cfg: Path) -> None:
    plan = json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)
    planned = [(d["topic"], d["partition"], d["base_offset"]) for d in plan["deletions"]]
    assert len(planned) == 3, planned
    limit = plan["filesystems"][0]["limit_percent"]
    code, events, stderr = _enforce(cfg)
    assert _deleted(events) == planned, events
    assert code == 0, (stderr, [e for e in events if e["event"] == "retention_cycle"])
    (cycle,) = [e for e in events if e["event"] == "retention_cycle"]
    assert cycle["usage_after"] <= limit, cycle
    assert df_percent(mount) <= limit  # what the disk says now, no sync of ours needed
    # And a retry deletes nothing more: the disk is under its limit.
    code, events, stderr = _enforce(cfg)
    assert code == 0 and _deleted(events) == [], (stderr, events)


def test_plain_btrfs_shows_freed_extents_at_its_commit_exactly_the_plan_goes(
    loop_btrfs: Callable[..., Path], tmp_path: Path
) -> None:
    mount = loop_btrfs()
    log_dir, truth = build(mount)
    os.sync()
    cfg, _limit = _over_by_2_5_segments(tmp_path, log_dir, mount, _segment_bytes(truth))
    _assert_exactly_the_plan_goes_and_exit_0(log_dir, mount, cfg)


def test_xfs_frees_unlinked_inodes_in_the_background_exactly_the_plan_goes(
    loop_xfs: Callable[..., Path], tmp_path: Path
) -> None:
    mount = loop_xfs(reflink=False)
    log_dir, seg = _big_log_dir(mount)
    cfg, _limit = _over_by_2_5_segments(tmp_path, log_dir, mount, seg)
    _assert_exactly_the_plan_goes_and_exit_0(log_dir, mount, cfg)


def _daemon_deletes(cfg: Path, settle_s: float) -> tuple[list[tuple[str, int, int]], DaemonProc]:
    daemon = DaemonProc(cfg)
    try:
        daemon.wait_for("daemon_started", timeout=30)
        daemon.wait_for("retention_cycle", timeout=30)
        time.sleep(settle_s)
    finally:
        daemon.stop()
    return _deleted(daemon.events), daemon


def test_the_daemon_on_plain_btrfs_deletes_only_the_plan(
    loop_btrfs: Callable[..., Path], tmp_path: Path
) -> None:
    """It deleted every closed segment, cycle after cycle, while statvfs still showed the
    space taken until btrfs's next commit."""
    mount = loop_btrfs()
    log_dir, truth = build(mount)
    os.sync()
    cfg, limit = _over_by_2_5_segments(
        tmp_path,
        log_dir,
        mount,
        _segment_bytes(truth),
        **_DAEMON_PACE,
    )
    planned = json.loads(run_cli("plan", "--json", "-c", str(cfg)).stdout)["deletions"]
    assert len(planned) == 3, planned
    deleted, daemon = _daemon_deletes(cfg, settle_s=5.0)
    assert deleted == [(d["topic"], d["partition"], d["base_offset"]) for d in planned], deleted
    (cycle, *_) = daemon.named("retention_cycle")
    assert cycle["usage_after"] <= limit + 0.001, cycle


def test_the_daemon_on_xfs_reports_usage_after_as_the_disk_will_be(
    loop_xfs: Callable[..., Path], tmp_path: Path
) -> None:
    mount = loop_xfs(reflink=False)
    log_dir, seg = _big_log_dir(mount)
    cfg, limit = _over_by_2_5_segments(
        tmp_path, log_dir, mount, seg, check_interval="200ms", usage_poll_interval="20ms"
    )
    deleted, daemon = _daemon_deletes(cfg, settle_s=3.0)
    assert len(deleted) == 3, deleted
    (cycle, *_) = daemon.named("retention_cycle")
    assert cycle["usage_after"] <= limit + 0.001, cycle


# ------------------------------------------------- freed never, and nothing said so in advance


_HOLD_OPEN = r"""
import os, sys
fds = [os.open(p, os.O_RDONLY) for p in sys.argv[1:]]
sys.stdout.write("open\n"); sys.stdout.flush()
sys.stdin.read()
"""


@contextmanager
def _held_open(paths: list[Path]) -> Iterator[int]:
    """A backup tool reading the segments: they stay allocated after their unlink."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_OPEN, *map(str, paths)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "open\n"
        yield proc.pid
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=10)


def test_deletions_that_did_not_free_stop_the_retention_across_runs(
    disk: Path, tmp_path: Path
) -> None:
    """Every segment file held open by another process: the first run deletes the plan,
    sees nothing come back, says why and exits 1; the runs after it (a cron or ``until``
    loop) delete nothing more while the space has not come back."""
    log_dir, truth = build(disk)
    os.sync()
    cfg, _limit = _over_by_2_5_segments(tmp_path, log_dir, disk, _segment_bytes(truth))
    every_file = [f for _, files in truth.values() for f in files]
    with _held_open(every_file) as holder:
        code, events, stderr = _enforce(cfg)
        first = _deleted(events)
        assert len(first) == 3 and code == 1, (events, stderr)
        (why,) = [e for e in events if e["event"] == "retention_target_unreachable"]
        assert "did not free" in why["reason"] and f"pid {holder}" in why["reason"], why
        for _run in range(3):
            code, events, stderr = _enforce(cfg)
            assert code == 1 and _deleted(events) == [], (events, stderr)
            assert "did not free" in stderr, stderr
    # The holder is gone: the space comes back, and the next run knows it.
    code, events, stderr = _enforce(cfg)
    assert code == 0 and _deleted(events) == [], (events, stderr)


def test_the_daemon_stops_deleting_where_deletions_did_not_free(disk: Path, tmp_path: Path) -> None:
    log_dir, truth = build(disk)
    os.sync()
    cfg, _limit = _over_by_2_5_segments(
        tmp_path,
        log_dir,
        disk,
        _segment_bytes(truth),
        **_DAEMON_PACE,
    )
    every_file = [f for _, files in truth.values() for f in files]
    with _held_open(every_file):
        deleted, daemon = _daemon_deletes(cfg, settle_s=5.0)
    assert len(deleted) == 3, deleted
    (why,) = daemon.named("retention_target_unreachable")
    assert "did not free" in why["reason"], why


def test_on_xfs_deletions_held_open_stop_the_retention_after_the_wait(
    loop_xfs: Callable[..., Path], tmp_path: Path
) -> None:
    """Where the filesystem frees late, the cycle first commits it (syncfs) and waits: space
    held open does not come back then either, the holder is named, nothing more goes."""
    mount = loop_xfs(reflink=False)
    log_dir, truth = build(mount)
    os.sync()
    cfg, _limit = _over_by_2_5_segments(tmp_path, log_dir, mount, _segment_bytes(truth))
    every_file = [f for _, files in truth.values() for f in files]
    with _held_open(every_file) as holder:
        started = time.monotonic()
        code, events, stderr = _enforce(cfg)
        assert time.monotonic() - started >= 2.0  # it waited for the space before saying so
        assert len(_deleted(events)) == 3 and code == 1, (events, stderr)
        (why,) = [e for e in events if e["event"] == "retention_target_unreachable"]
        assert "did not free" in why["reason"] and f"pid {holder}" in why["reason"], why
        code, events, stderr = _enforce(cfg)
        assert code == 1 and _deleted(events) == [], (events, stderr)


def test_on_btrfs_what_the_offline_sweep_frees_is_seen_before_planning(
    loop_btrfs: Callable[..., Path], tmp_path: Path
) -> None:
    """A ``-delete`` dir alone covers the excess: its removal shows only at btrfs's commit,
    so a scan right after the sweep planned live segments as well. Now the filesystem is
    committed before the scan: the sweep alone, no live segment goes."""
    mount = loop_btrfs()
    log_dir, truth = build(mount)
    doomed = log_dir / "gone-0.3f2a9c5b7e8d4f10a1b2c3d4e5f60718-delete"
    doomed.mkdir()
    with open(doomed / "00000000000000000000.log", "wb") as fh:
        fh.write(os.urandom(8 * MiB))
    os.sync()
    cfg, _limit = _over_by_2_5_segments(tmp_path, log_dir, mount, _segment_bytes(truth))
    before = {p for p in _live_segments(log_dir) if "-delete/" not in p}
    code, events, stderr = _enforce(cfg)
    assert code == 0, (events, stderr)
    assert [e["what"] for e in events if e["event"] == "offline_swept"] == ["delete_dir"]
    assert _deleted(events) == [] and _live_segments(log_dir) == before, events


@contextmanager
def _writing(path: Path, mib_per_s: float) -> Iterator[None]:
    """Another application writing steadily to the disk meanwhile."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)\n"
            "chunk = os.urandom(1 << 20)\n"
            "while True:\n"
            "    os.write(fd, chunk); os.fsync(fd); time.sleep(1 / float(sys.argv[2]))\n",
            str(path),
            str(mib_per_s),
        ]
    )
    try:
        time.sleep(0.5)
        yield
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_on_xfs_another_writer_meanwhile_does_not_stop_the_retention(
    loop_xfs: Callable[..., Path], tmp_path: Path
) -> None:
    """Where an unlink frees late, a shortfall can also be someone else's growth: a disk that
    grows during the wait is not evidence of a snapshot, and the retention goes on."""
    mount = loop_xfs(reflink=False)
    log_dir, truth = build(mount)
    os.sync()
    with _writing(mount / "other-app.data", mib_per_s=8):
        cfg, _limit = _over_by_2_5_segments(tmp_path, log_dir, mount, _segment_bytes(truth))
        _code, events, stderr = _enforce(cfg)
    assert len(_deleted(events)) >= 3, (events, stderr)
    halts = [e for e in events if "did not free" in str(e.get("reason", ""))]
    assert not halts and "did not free" not in stderr, halts
    assert not (tmp_path / "state" / "unfreed.json").exists()
