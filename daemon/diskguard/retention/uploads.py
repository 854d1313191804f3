"""Tiered storage's upload lag, and a stalled upload as an alert of its own. Pure.

Only what is uploaded can be dropped locally without loss, so a tiered partition's closed
segments above its highest offset in remote storage are bytes the ladder's first rung cannot
free. Some lag is normal (the broker uploads a segment after it rolls, every
``remote.log.manager.task.interval.ms``); no progress at all for ``stall_after`` while closed
segments wait is not: the remote storage or the broker's copier is broken, and the disk will
fill with data that would otherwise be evictable.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from diskguard.kafkalog.model import Partition


@dataclass(frozen=True)
class Lag:
    """One tiered partition's closed segments not uploaded yet."""

    topic: str
    partition: int
    uploaded_offset: int
    #: Closed segments whose last offset is above ``uploaded_offset``.
    segments: int
    #: The last offset of the newest closed segment (what would be uploaded next, in time).
    closed_end: int


@dataclass(frozen=True)
class Stall:
    """A partition whose upload made no progress for ``for_s`` with segments waiting."""

    lag: Lag
    for_s: float


def lags(parts: Iterable[Partition], uploaded: Mapping[tuple[str, int], int]) -> list[Lag]:
    """The lag of each partition ``uploaded`` knows (one entry per partition)."""
    out: dict[tuple[str, int], Lag] = {}
    for part in parts:
        top = uploaded.get((part.topic, part.partition))
        if top is None or len(part.base_offsets) < 2:
            continue
        closed_end = part.base_offsets[-1] - 1
        waiting = sum(
            1
            for base, nxt in zip(part.base_offsets, part.base_offsets[1:], strict=False)
            if nxt - 1 > top and base >= (part.log_start_offset or 0)
        )
        key = (part.topic, part.partition)
        out[key] = Lag(part.topic, part.partition, top, waiting, closed_end)
    return [out[k] for k in sorted(out)]


class UploadWatch:
    """Per partition: when its uploaded offset last moved; which are stalled (said once,
    and again when they resume)."""

    def __init__(self, stall_after_s: float) -> None:
        self.stall_after_s = stall_after_s
        self._progress: dict[tuple[str, int], tuple[int, float]] = {}
        self._stalled: set[tuple[str, int]] = set()

    def observe(self, found: Iterable[Lag], now: float) -> tuple[list[Stall], list[Lag]]:
        """The partitions that became stalled and those that resumed, from this reading."""
        stalled: list[Stall] = []
        resumed: list[Lag] = []
        seen = set()
        for lag in found:
            key = (lag.topic, lag.partition)
            seen.add(key)
            last = self._progress.get(key)
            if last is None or lag.uploaded_offset != last[0] or lag.segments == 0:
                self._progress[key] = (lag.uploaded_offset, now)
                if key in self._stalled:
                    self._stalled.discard(key)
                    resumed.append(lag)
                continue
            waited = now - last[1]
            if waited >= self.stall_after_s and key not in self._stalled:
                self._stalled.add(key)
                stalled.append(Stall(lag, waited))
        for key in set(self._progress) - seen:
            self._progress.pop(key, None)
            self._stalled.discard(key)
        return stalled, resumed

    @property
    def stalled(self) -> frozenset[tuple[str, int]]:
        return frozenset(self._stalled)
