"""Plain planner inputs for tests of the pure planner: filesystems, partitions, a reader."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir, Partition, SegmentInfo
from diskguard.retention.planner import CommittedOffsets, Head, LocalHeads, SegmentReader

GiB = 1024**3
MiB = 1024**2


@dataclass
class FakeReader:
    """segment (topic, partition, base) -> (bytes, max_ts); counts reads to prove laziness."""

    segments: dict[tuple[str, int, int], tuple[int, int]]
    reads: int = 0

    def __call__(self, partition: Partition, base_offset: int) -> SegmentInfo:
        self.reads += 1
        size, ts = self.segments[(partition.topic, partition.partition, base_offset)]
        return SegmentInfo(size, ts, "timeindex", (f"{partition.path}/{base_offset:020d}.log",))


def make_fs(
    parts: list[Partition], used: int, avail: int, pending: int = 0, kafka_bytes: int | None = None
) -> Filesystem:
    usage = FilesystemUsage("/data", "/dev/x", used + avail, used, avail)
    return Filesystem(
        usage,
        (LogDir("/data/kafka", "/data", tuple(parts), pending, kafka_bytes=kafka_bytes),),
    )


def part(topic: str, p: int, bases: list[int], **kw: object) -> Partition:
    return Partition("/data/kafka", topic, p, f"/data/kafka/{topic}-{p}", tuple(bases), **kw)  # type: ignore[arg-type]


class AheadHeads:
    """A queue that dates each head's successor as soon as it pops it, as the forked worker
    does (``parallelheads``): its ``tied`` is said before the successor joins."""

    def __init__(
        self,
        parts: Sequence[Partition],
        read: SegmentReader,
        committed: CommittedOffsets | None = None,
        led_here: Collection[tuple[str, int]] | None = None,
    ) -> None:
        self._local = LocalHeads(parts, read, committed or {}, led_here)
        self.tied = True

    def pop(self) -> Head | None:
        head = self._local.pop()
        if head is not None:
            self.tied = self._local.tied
            self._local.advance(head)
        return head

    def advance(self, head: Head) -> None:
        return None

    def close(self) -> None:
        self._local.close()
