"""Freed space told apart from other writers' growth, on a simulated clock and disk.

Where unlinks free late (XFS, btrfs), ``await_freed`` waits for the space and decides whether
it came back. A steady writer beside it must never make space that did come back look
missing (the retention stopped on a disk that needed it), and a snapshot that frees nothing
must still be found when nobody else writes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from diskguard.host import freespace, fsusage
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.retention import unfreed
from diskguard.retention.waittrace import WaitTrace

KiB = 1024
MiB = 1024**2
BEFORE = 4 * 1024 * MiB


@dataclass
class _Clock:
    now: float = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:
        return 1_700_000_000.0 + self.now


def _simulate(
    monkeypatch: pytest.MonkeyPatch,
    used_at: Callable[[float], int],
    syncfs_s: float,
    expected: int,
) -> unfreed.Unfreed | None:
    """``await_freed`` on XFS whose usage at ``t`` seconds after the unlinks is ``used_at(t)``,
    whose syncfs takes ``syncfs_s`` (slow under load), nobody holding the files open."""
    clock = _Clock()
    started = clock.now
    monkeypatch.setattr(unfreed, "time", clock)

    def usage_of(_path: str, mount: str, device: str) -> FilesystemUsage:
        used = used_at(clock.now - started)
        return FilesystemUsage(mount, device, 16 * 1024 * MiB, used, 16 * 1024 * MiB - used)

    monkeypatch.setattr(fsusage, "usage_of", usage_of)
    monkeypatch.setattr(freespace, "frees_at_once", lambda _p: False)
    monkeypatch.setattr(freespace, "syncfs", lambda _p: clock.sleep(syncfs_s))
    monkeypatch.setattr(unfreed, "_holders", lambda _d, _p: [])
    before = FilesystemUsage("/mnt", "/dev/loop9", 16 * 1024 * MiB, BEFORE, 0)
    _usage, record = unfreed.await_freed("/mnt/kafka-logs", before, expected, [], 0.0, started)
    return record


def _writer(mib_per_s: float) -> Callable[[float], int]:
    """Another application appending 1 MiB, fsynced, ``mib_per_s`` times a second."""
    return lambda t: int(t * mib_per_s) * MiB


@pytest.mark.parametrize("syncfs_s", [0.0, 0.4, 1.0, 3.0])
@pytest.mark.parametrize("freed_at", [0.3, 1.2, 2.5, 3.5])
def test_space_freed_during_the_wait_beside_a_steady_writer_is_seen(
    monkeypatch: pytest.MonkeyPatch, syncfs_s: float, freed_at: float
) -> None:
    """The case CI met: 768 KiB came back during the wait while another app wrote 8 MiB/s in
    1 MiB steps. The net change over the wait counted the free against the writer's rate, and
    that rate stretched back over a slow syncfs made the freed space look missing."""
    expected = 768 * KiB
    grows = _writer(8)

    def used(t: float) -> int:
        return BEFORE + grows(t) - (expected if t >= freed_at else 0)

    assert _simulate(monkeypatch, used, syncfs_s, expected) is None


@pytest.mark.parametrize("syncfs_s", [0.0, 1.0])
def test_a_snapshot_that_frees_nothing_is_recorded_when_nobody_else_writes(
    monkeypatch: pytest.MonkeyPatch, syncfs_s: float
) -> None:
    record = _simulate(monkeypatch, lambda _t: BEFORE, syncfs_s, 3 * MiB)
    assert record is not None and record.bytes == 3 * MiB and not record.held_open
    assert "snapshot" in record.reason


def test_a_snapshot_is_recorded_beside_a_writer_whose_steps_are_small(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Others' growth excuses a shortfall only up to what it can explain: 64 KiB steps at
    2 MiB/s do not hide 3 MiB that never came back."""
    record = _simulate(
        monkeypatch, lambda t: BEFORE + int(t * 32) * 64 * KiB, syncfs_s=1.0, expected=3 * MiB
    )
    assert record is not None and record.bytes >= 2 * MiB


def test_the_trace_keeps_rises_and_drops_apart() -> None:
    trace = WaitTrace.starting(1000)
    for used in (1100, 1050, 1300, 1300, 900):
        trace.add(used)
    assert (trace.rises, trace.drops, trace.largest_rise, trace.last) == (350, 450, 250, 900)
    # Others wrote 350 over 1 s; they wrote for 2 s before the wait as well: 700 more. The
    # usage at the wait's start (1000) then hid 1000 + 700 - 1000 = 700 freed before it.
    assert trace.shown(before_used=1000, before_wait_s=2.0, waited_s=1.0, rate=0.0) == 1150
    # A rate known beforehand is used when the wait saw less growth than it.
    assert trace.shown(before_used=1000, before_wait_s=2.0, waited_s=1.0, rate=500.0) == 1450
