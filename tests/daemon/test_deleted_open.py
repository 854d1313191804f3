"""The daemon's walk of ``/proc/*/fd`` for deleted-but-open files (``Snapshots``): with each
check's snapshot, but only when the bytes no log dir's file explains moved, or the last walk
is old: beside a broker at rest it was a third of an idle check's CPU."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from diskguard.config import load_config
from diskguard.daemon import snapshot
from diskguard.daemon.snapshot import OPEN_FILES_MAX_AGE_S, OPEN_FILES_MOVED_BYTES, Snapshots
from diskguard.flow.state import FlowState
from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir
from diskguard.kafkalog.scan import ScanResult
from diskguard.snapshots.record import DeletedBytesCounter
from support.configs import write_config

MiB = 1 << 20
MOUNT = "/data"
#: The snapshots, the walks made (one entry each) and the clock.
Walks = tuple[Snapshots, list[int], list[float]]


def _scan(used: int, kafka: int | None) -> ScanResult:
    usage = FilesystemUsage(MOUNT, "/dev/x", 100_000 * MiB, used, 100_000 * MiB - used)
    log_dir = LogDir(path=f"{MOUNT}/kafka", mount=MOUNT, partitions=(), kafka_bytes=kafka)
    return ScanResult((Filesystem(usage, (log_dir,)),))


@pytest.fixture
def walks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Walks:
    """Snapshots whose walk is counted (it says 7 MiB held) and whose clock is ``clock[0]``."""
    (tmp_path / "kafka").mkdir()
    config = load_config(write_config(tmp_path, tmp_path / "kafka"))
    snaps = Snapshots(config, tmp_path / "state")
    walked: list[int] = []
    clock = [1000.0]

    def held(mounts: dict[str, list[str]]) -> dict[str, int]:
        walked.append(1)
        return {m: 7 * MiB for m in mounts}

    monkeypatch.setattr(snapshot, "held_by_mount", held)
    monkeypatch.setattr(
        snapshot, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time)
    )
    return snaps, walked, clock


def _record(snaps: Snapshots, scan: ScanResult) -> None:
    flow = {MOUNT: FlowState()}
    snaps.record(scan, {MOUNT: [f"{MOUNT}/kafka"]}, flow, {}, DeletedBytesCounter())


def test_the_walk_waits_while_the_unexplained_bytes_stay_put(
    walks: Walks,
) -> None:
    snaps, walked, clock = walks
    _record(snaps, _scan(500 * MiB, 400 * MiB))
    assert len(walked) == 1 and snaps.deleted_open == {MOUNT: 7 * MiB}
    # Kafka's files grew and usage with them: the bytes nothing explains did not move.
    clock[0] += 300
    _record(snaps, _scan(600 * MiB, 500 * MiB + OPEN_FILES_MOVED_BYTES - 1))
    assert len(walked) == 1
    # A file deleted but still held: usage stays, Kafka's bytes drop.
    clock[0] += 300
    _record(snaps, _scan(600 * MiB, 480 * MiB))
    assert len(walked) == 2
    # ... and its descriptor closed: usage drops, nothing else.
    clock[0] += 300
    _record(snaps, _scan(580 * MiB, 480 * MiB))
    assert len(walked) == 3


def test_the_walk_comes_again_when_old_or_unmeasured(
    walks: Walks,
) -> None:
    snaps, walked, clock = walks
    _record(snaps, _scan(500 * MiB, 400 * MiB))
    clock[0] += OPEN_FILES_MAX_AGE_S - 1
    _record(snaps, _scan(500 * MiB, 400 * MiB))
    assert len(walked) == 1
    clock[0] += 1
    _record(snaps, _scan(500 * MiB, 400 * MiB))
    assert len(walked) == 2
    # A scan that did not measure Kafka's bytes says nothing of them: walked.
    _record(snaps, _scan(500 * MiB, None))
    assert len(walked) == 3
    # ... and the next full one walks again (nothing to compare with).
    _record(snaps, _scan(500 * MiB, 400 * MiB))
    assert len(walked) == 4
    _record(snaps, _scan(500 * MiB, 400 * MiB))
    assert len(walked) == 4
