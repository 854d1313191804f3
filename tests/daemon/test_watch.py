"""The daemon's inotify hints on a real directory: a broker rewriting its log dir's own
checkpoints (every few seconds, changed or not) is not a partition's change; a segment rolled,
renamed or removed, and a partition dir made or removed, are."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from diskguard.daemon.watch import HintSummary, Watcher


def _hints(watcher: Watcher, woken: threading.Event) -> HintSummary:
    """What the hints said once one came (inotify is asynchronous), and a moment after, so
    that every event of one change is in."""
    assert woken.wait(30), "no inotify hint within 30 s"
    time.sleep(0.3)
    woken.clear()
    return watcher.take()


def test_a_log_dirs_own_checkpoints_are_not_a_partitions_change(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka"
    part = log_dir / "orders-0"
    part.mkdir(parents=True)
    (part / f"{0:020d}.log").write_bytes(b"x")
    woken = threading.Event()
    watcher = Watcher(woken.set)
    watcher.start([log_dir], lambda *_a: None)
    try:
        assert watcher.complete
        # As Kafka writes a checkpoint: a temporary file, written, closed, renamed over.
        tmp = log_dir / "replication-offset-checkpoint.tmp"
        tmp.write_text("0\n1\norders 0 5\n")
        os.replace(tmp, log_dir / "replication-offset-checkpoint")
        hint = _hints(watcher, woken)
        assert hint.structural and not hint.partitions, hint
        # A segment rolled in a partition dir.
        (part / f"{5:020d}.log").write_bytes(b"y")
        hint = _hints(watcher, woken)
        assert hint.structural and hint.partitions, hint
        # A segment renamed for deletion, as the broker does.
        os.replace(part / f"{0:020d}.log", part / f"{0:020d}.log.deleted")
        assert _hints(watcher, woken).partitions
        # A partition dir made in the log dir (a new topic), then one removed.
        (log_dir / "fresh-0").mkdir()
        assert _hints(watcher, woken).partitions
        (log_dir / "fresh-0").rmdir()
        assert _hints(watcher, woken).partitions
        # An append is a size, not a structure: usage shows it.
        with open(part / f"{5:020d}.log", "ab") as f:
            f.write(b"z" * 100)
            f.flush()
            hint = _hints(watcher, woken)
        assert not hint.partitions, hint
    finally:
        watcher.stop()
