"""When the daemon may skip its periodic cycle (``Retention.quiet``), on a real log dir in
offline mode: only after a cycle that acted on nothing, with nothing it left under way, and
every filesystem well under its limits. Whether the log dirs changed is the hints' to say
(``test_watch``); when the loop skips, ``schedule`` (``test_schedule``)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

from diskguard.config import load_config
from diskguard.daemon.brokerprobe import BrokerProbe
from diskguard.daemon.cycles import Retention
from diskguard.daemon.filesystems import Filesystems
from diskguard.daemon.flowcontrol import FlowControl
from diskguard.daemon.watch import HintSummary
from diskguard.metrics import Metrics
from diskguard.retention.planner import Deletion
from support import kafkagen
from support.configs import write_config


def _retention(
    tmp_path: Path, percent: float, log_dir: Path | None = None
) -> tuple[Retention, Filesystems]:
    """Offline retention at ``percent`` over ``log_dir`` (default: one partition written
    under ``tmp_path``)."""
    if log_dir is None:
        log_dir = _log_dir(tmp_path)
    config = load_config(
        write_config(tmp_path, log_dir, mode="offline", disk_usage_percent=percent)
    )
    probe = BrokerProbe(lambda: False, 1.0, lambda: None)
    return Retention(config, Metrics(), probe, lambda: None), Filesystems(config.broker.log_dirs)


def _log_dir(root: Path) -> Path:
    log_dir = root / "kafka"
    kafkagen.write_partition(log_dir, "orders", 0, [kafkagen.SegmentSpec()] * 3)
    return log_dir


def _cycle(retention: Retention, full: bool = False, trust: frozenset[str] | None = None) -> None:
    retention.start(full=full, trust=trust)
    deadline = time.monotonic() + 60
    while not retention.take():
        assert time.monotonic() < deadline, "the cycle did not finish within 60 s"
        time.sleep(0.05)


def test_quiet_only_after_a_cycle_and_while_well_under(tmp_path: Path) -> None:
    retention, filesystems = _retention(tmp_path, 99.9)
    usages = filesystems.usage()
    (usage,) = usages.values()
    assert not retention.quiet(usages, len(filesystems), 60.0, {})  # no cycle yet
    _cycle(retention)
    assert usage.usage_percent < 97.0, f"{usage.mount} too full for this test: {usage}"
    assert retention.quiet(usages, len(filesystems), 60.0, {})
    # The loop's margin (the fastest growth seen lately over a poll and a cycle) counts.
    assert not retention.quiet(usages, len(filesystems), 60.0, {usage.mount: usage.available_bytes})
    # A filesystem that could not be measured is never quiet.
    assert not retention.quiet({}, len(filesystems), 60.0, {})
    # DeleteRecords the broker has not carried out yet: the next cycle must see them go.
    (log_dir,) = retention.runtime.config.broker.log_dirs
    retention.runtime.requested.record(
        [Deletion(str(log_dir), "orders", 0, 0, 1, 0, 1, (), usage.mount)]
    )
    assert not retention.quiet(usages, len(filesystems), 60.0, {})


def test_never_quiet_near_the_ceiling(disk: Path, tmp_path: Path) -> None:
    # A disk of its own: others' writes and deletions on a shared one would move the usage
    # by more than the half point between the two reads.
    log_dir = _log_dir(disk)
    (usage,) = Filesystems([log_dir]).usage().values()
    # A ceiling half a point above today's usage: under it, but not well under.
    retention, filesystems = _retention(tmp_path, round(usage.usage_percent + 0.5, 3), log_dir)
    _cycle(retention)
    assert not retention.quiet(filesystems.usage(), len(filesystems), 60.0, {})
    retention.close()


def _snapshot(retention: Retention, trust: frozenset[str] | None) -> dict[str, int]:
    """A full cycle (a snapshot's), its scan taking ``trust``'s word; the topics' bytes."""
    _cycle(retention, full=True, trust=trust)
    assert retention.last is not None
    (topics,) = retention.last.scan.topics_by_mount.values()
    return {topic: usage.bytes for topic, usage in topics.items()}


def test_a_change_the_hints_missed_is_seen_by_the_next_check_not_before(tmp_path: Path) -> None:
    """A snapshot while quiet takes the hints' word (``HINTED_SNAPSHOT``): a dir no event
    touched is as the last full scan left it, with no ``stat``. So a change inotify never
    reported (written through a mapping, on another host's NFS client...) is invisible to
    it, and the consistency rescan, which takes nothing on trust, is what finds it; a dir
    the hints name is read again at once."""
    retention, _filesystems = _retention(tmp_path, 99.9)
    log_dir = tmp_path / "kafka"
    kafkagen.write_partition(log_dir, "audit", 0, [kafkagen.SegmentSpec()] * 2)
    past = time.time() - 30  # kept listings: no dir changed within the cache's settle time
    for path in (log_dir, log_dir / "orders-0", log_dir / "audit-0"):
        os.utime(path, (past, past))
    before = _snapshot(retention, None)
    assert _snapshot(retention, frozenset()) == before
    # Behind the hints' back: an append to each partition's active segment, a segment
    # rolled in one, a new partition.
    for part in ("orders-0", "audit-0"):
        active = max((log_dir / part).glob("*.log"))
        with open(active, "ab") as segment:
            segment.write(os.urandom(1 << 20))
    kafkagen.write_partition(log_dir, "late", 0, [kafkagen.SegmentSpec()])
    assert _snapshot(retention, frozenset()) == before  # taken on trust: unseen
    # A dir the hints name is read again, the others still taken as they were.
    hinted = _snapshot(retention, frozenset({"audit-0"}))
    assert hinted["orders"] == before["orders"]
    assert hinted["audit"] >= before["audit"] + (1 << 20)
    assert "late" not in hinted
    # The check sees everything.
    checked = _snapshot(retention, None)
    assert checked["orders"] >= before["orders"] + (1 << 20)
    assert checked["audit"] == hinted["audit"]
    assert checked["late"] > 0
    # And a snapshot on trust after it starts from what the check read.
    assert _snapshot(retention, frozenset()) == checked
    retention.close()


def test_a_stuck_cycle_is_skipped_until_a_change_or_the_broker_answers(tmp_path: Path) -> None:
    """Stuck over its limit with nothing changed, the loop skips cycles and backs its rescans
    off (``unchanged``). A hint that a name changed, a usage move, or the probe's answer (which
    wakes the loop) ends that at the next iteration; the answer once. This is what lets a
    stuck daemon act on a real change or the broker's return without waiting out the back-off
    (end to end: ``test_stuck``, ``test_broker_back_e2e``)."""
    log_dir = tmp_path / "kafka"
    kafkagen.write_partition(log_dir, "orders", 0, [kafkagen.SegmentSpec()] * 3)
    # A limit no deletion can reach, in dry-run: stuck at once, with no broker, none deleted.
    config = load_config(write_config(tmp_path, log_dir, mode="dry-run", disk_usage_percent=0.1))
    woken = threading.Event()
    answered = threading.Event()
    probe = BrokerProbe(lambda: answered.wait(60), 60.0, woken.set)
    retention = Retention(config, Metrics(), probe, lambda: None)
    filesystems = Filesystems(config.broker.log_dirs)
    probe.start()
    try:
        _cycle(retention)
        usages = filesystems.usage()
        assert retention.stuck.states, "dry-run over the limit is stuck"
        assert retention.unchanged(usages, HintSummary(), len(filesystems))
        # A name appeared, went or moved (a partition, a roll, a deletion): the plan's inputs.
        assert not retention.unchanged(usages, HintSummary(structural=True), len(filesystems))
        # Usage moved (a file outside the log dirs went): by ``stuck.MOVE_FRACTION`` or more.
        moved = {
            m: replace(u, used_bytes=u.used_bytes - u.total_bytes // 100) for m, u in usages.items()
        }
        assert not retention.unchanged(moved, HintSummary(), len(filesystems))
        assert retention.unchanged(usages, HintSummary(), len(filesystems))
        probe.want(True)
        answered.set()
        assert woken.wait(60), "the probe's answer wakes the loop"
        assert not retention.unchanged(usages, HintSummary(), len(filesystems))
        assert retention.unchanged(usages, HintSummary(), len(filesystems))  # each answer once
    finally:
        probe.stop()
        retention.close()


def test_never_quiet_near_a_flow_limit_below_the_ceiling(disk: Path, tmp_path: Path) -> None:
    """An overfull or low-space limit set below the retention ceiling engages flow control
    or an alert first: the daemon is quiet (its usage poll slower) only while every one of
    them is far off too, on today's usage and on the forecast's. On a disk of its own, whose
    usage nobody else moves between the reads."""
    (disk / "kafka").mkdir()
    (usage,) = Filesystems([disk]).usage().values()
    near = round(usage.usage_percent + 0.5, 3)
    far = round(usage.usage_percent + 5.0, 3)
    cases: list[tuple[str, dict[str, float | int], bool]] = [
        ("flow_control", {"overfull_percent": far, "underfull_percent": far - 1}, True),
        ("flow_control", {"overfull_percent": near, "underfull_percent": near / 2}, False),
        ("alerts", {"low_space_percent": near}, False),
        ("alerts", {"low_space_bytes": usage.available_bytes - 1024}, False),
    ]
    for n, (key, section, quiet) in enumerate(cases):
        (tmp_path / str(n)).mkdir()
        config = load_config(write_config(tmp_path / str(n), disk / "kafka", **{key: section}))
        flow = FlowControl(config, tmp_path / "state", Metrics())
        usages = Filesystems(config.broker.log_dirs).usage()
        assert flow.well_under(usages, lambda _u: None, {}) is quiet, section
        # The loop's margin, when the growth seen lately asks for more than 1 % of the disk.
        (mount,) = usages
        wide = {mount: usage.available_bytes}
        assert not flow.well_under(usages, lambda _u: None, wide), section
        # The usage the forecast predicts counts as much as today's.
        (now,) = usages.values()
        ahead = replace(now, used_bytes=now.used_bytes + now.available_bytes // 2)
        assert not flow.well_under(usages, lambda _u, ahead=ahead: ahead, {}), section
