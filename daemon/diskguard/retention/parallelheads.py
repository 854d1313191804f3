"""Dating partition heads on two cores for a one-shot plan (edge).

Why: after listing, a one-shot ``plan`` over 1,000 partitions spends most of its time dating the
heads it walks, ~11 µs each in syscalls and Python, one after another on one core (a cold plan
should take no longer than ``du`` of the same tree). Here most partitions are walked in a forked
child (``host.forked.Worker``, forked before the Kafka client's threads exist, so a plan in broker
mode has it too) while this process walks the rest (``_shares``); the planner merges the two
queues (``MergedHeads``). The plan is the one a single heap gives: keys are unique, so the merge
of two key-ordered queues is the order of one. The child has dated the heads of the partitions it
listed while this process was still scanning (``date_ahead``), and walks those.

The child cannot know which of its heads the plan chooses, so it walks its share as if every
head were chosen, up to a pipe's worth ahead of the plan, and stops when the plan closes the
pipe. What that look-ahead reads is never reported: each head comes with the warnings
dating its successor gave, and they are kept only when the plan chooses that head; the
warnings of every partition's first head, dated before any choice, come first, in partition
order — the warnings, and their order, of a plan on one core.

Only for a one-shot plan, only with many partitions (sending them costs ~1 ms). The worker
remembers what it read (``SegmentFileReader.dated``), each read with the warnings it gave: what
it dated ahead is read from there, and a broker-mode plan that walks twice (the second time
knowing consumer offsets and leaders) reads no file again; the warnings are those of one core.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Collection, Iterator, Sequence
from typing import Any

from diskguard.host.forked import ChildFailed, Worker, WorkStream
from diskguard.kafkalog.dating import Dated, SegmentFileReader
from diskguard.kafkalog.listing import PartitionListing
from diskguard.kafkalog.model import Partition, SegmentInfo, parse_partition_dir, segment_info
from diskguard.retention.order import HeadKey, new_named
from diskguard.retention.planner import (
    CommittedOffsets,
    Head,
    HeadQueue,
    HeadsFactory,
    LocalHeads,
    MergedHeads,
    SegmentReader,
)

__all__ = [
    "MIN_PARTITIONS",
    "OWN_SHARE_AT_LEAST",
    "OWN_SHARE_WORKER_LISTED",
    "date_ahead",
    "parallel_heads",
]

#: Below this many partitions a fork costs more than it saves.
MIN_PARTITIONS = 256
#: The share of the partitions this process dates itself, as (numerator, denominator): it
#: also merges and builds the plan, so it takes less than half (measured: 2/5 left both
#: processes done at about the same time on a 2-core machine; 1/2 and 1/3 were slower).
OWN_SHARE = (2, 5)
#: The same where the worker has dated its own listings' heads ahead (``date_ahead``): this
#: process walks at most this share, and only partitions it listed itself.
OWN_SHARE_DATED_AHEAD = (2, 5)
#: ... and at least this share, of the worker's partitions where it listed too few itself.
OWN_SHARE_AT_LEAST = (1, 5)
#: ... or this, offline, where it listed next to none (under a tenth): with kept listings
#: (``listingstore``) the worker lists every dir in a few ms and dates heads ahead while
#: this process imports, which then comes to its walk with time to spare; in broker mode it
#: waits on the broker meanwhile, and each partition taken from the worker wastes what it
#: dated ahead. Measured at SCHED_FIFO, medians of 9, 100k segments: listings kept,
#: offline 3/10 0.299 s, 2/5 0.297 s, 1/5 0.318 s, 1/2 0.312 s, broker mode 1/5 0.503 s,
#: 3/10 0.562 s; not kept (this process listing ~1/4 of the dirs), offline 1/5 0.376 s,
#: 3/10 0.392 s.
OWN_SHARE_WORKER_LISTED = (3, 10)
#: How far ``date_ahead`` goes: this many heads per partition on average. Beside a broker
#: on two cores, dating further took the core the broker answered the plan's requests on
#: (measured: 4 a partition 0.71 s, 16 0.89 s, 1 0.75 s); offline the walk's request stops
#: it sooner anyway.
AHEAD_PER_PARTITION = 4


def parallel_heads(
    reader: SegmentFileReader,
    worker: Worker | None,
    min_partitions: int | None = None,
    dated_ahead: Collection[str] = (),
    at_least: tuple[int, int] = OWN_SHARE_AT_LEAST,
) -> HeadsFactory:
    """A ``HeadsFactory`` for plans that date through ``reader`` (its warnings get the
    child's): on two cores with ``worker`` where worth it (``min_partitions``, default
    ``MIN_PARTITIONS``), else ``LocalHeads``. The worker remembers what it read (a
    broker-mode plan plans twice) and what it dated ahead: ``dated_ahead``, the partition
    dirs it listed (``parallellisting``), which it walks itself."""

    def factory(
        parts: Sequence[Partition],
        read: SegmentReader,
        committed: CommittedOffsets,
        led_here: Collection[tuple[str, int]] | None,
    ) -> HeadQueue:
        least = MIN_PARTITIONS if min_partitions is None else min_partitions
        if worker is None or len(parts) < least:
            return LocalHeads(parts, read, committed, led_here)
        mine_parts, theirs = _shares(parts, dated_ahead, at_least)
        names = {(p.topic, p.partition) for p in theirs}
        try:
            stream = worker.stream(
                walk_share,
                [_plain(p) for p in theirs],
                {k: dict(v) for k, v in committed.items() if k in names},
                None if led_here is None else [k for k in led_here if k in names],
            )
        except ChildFailed:
            return LocalHeads(parts, read, committed, led_here)  # the worker is gone
        try:
            items = iter(stream)
            mine = _Capture(reader)
            local = LocalHeads(mine_parts, mine, committed, led_here)
            first = {path: list(ws) for path, ws in next(items)}
            first.update(mine.taken or {})
            mine.taken = None
            for part in parts:
                reader.warnings.extend(first.get(part.path, ()))
            remote = _Streamed(stream, items, theirs, committed, reader)
        except BaseException:
            stream.close()
            raise
        return MergedHeads((local, remote))

    return factory


def _shares(
    parts: Sequence[Partition],
    dated_ahead: Collection[str],
    at_least: tuple[int, int] = OWN_SHARE_AT_LEAST,
) -> tuple[list[Partition], list[Partition]]:
    """Which partitions this process walks and which the worker does. Spread out, not a
    block: partitions of one topic sit together and may be the oldest of all. Without
    ``dated_ahead``, every ``OWN_SHARE`` of them here; with it, the worker walks every
    partition it dated ahead and this process at most ``OWN_SHARE_DATED_AHEAD`` of all, of
    the rest, and at least ``OWN_SHARE_AT_LEAST`` (``at_least`` where it listed under a
    tenth itself), topped up with the worker's. A protected
    partition has no head (``LocalHeads``): not sent."""
    if not dated_ahead:
        num, den = OWN_SHARE
        mine = [p for i, p in enumerate(parts) if (i * num) % den < num]
        theirs = [p for i, p in enumerate(parts) if (i * num) % den >= num and not p.protected]
        return mine, theirs
    ahead = dated_ahead if isinstance(dated_ahead, (set, frozenset)) else set(dated_ahead)
    rest = [i for i, p in enumerate(parts) if p.path not in ahead]
    num, den = OWN_SHARE_DATED_AHEAD
    keep = min(len(rest), len(parts) * num // den)
    chosen = {rest[k * len(rest) // keep] for k in range(keep)} if keep else set()
    # Where the worker listed nearly all (a broker's round trips kept this process busy),
    # this process still walks some, of the worker's: it would otherwise only merge.
    num, den = at_least if len(rest) * 10 < len(parts) else OWN_SHARE_AT_LEAST
    least = len(parts) * num // den
    if len(chosen) < least:
        theirs_i = [i for i, p in enumerate(parts) if p.path in ahead]
        more = min(len(theirs_i), least - len(chosen))
        chosen |= {theirs_i[k * len(theirs_i) // more] for k in range(more)} if more else set()
    mine = [p for i, p in enumerate(parts) if i in chosen]
    theirs = [p for i, p in enumerate(parts) if i not in chosen and not p.protected]
    return mine, theirs


def _plain(part: Partition) -> tuple[Any, ...]:
    """What dating and walking a partition read of it, as plain data for the worker."""
    return (
        part.log_dir,
        part.topic,
        part.partition,
        part.path,
        part.base_offsets,
        part.log_start_offset,
        part.txn_indexes,
    )


#: What the worker dated (the worker lives for one command): ahead of the walk
#: (``date_ahead``), and in a broker-mode plan's first walk, which its second reads again.
_WORKER_DATED: Dated = {}


def walk_share(
    plain: list[tuple[Any, ...]],
    committed: dict[tuple[str, int], dict[str, int]],
    led_here: list[tuple[str, int]] | None,
) -> Iterator[Any]:
    """The worker's side: its share of the partitions walked (``_walk_half``)."""
    parts = [
        Partition(log_dir, topic, partition, path, bases, start, txn_indexes=txn)
        for log_dir, topic, partition, path, bases, start, txn in plain
    ]
    reader = SegmentFileReader(None, _WORKER_DATED)
    yield from _walk_half(parts, reader, committed, None if led_here is None else set(led_here))


def date_ahead(listed: list[tuple[str, PartitionListing]]) -> Iterator[None]:
    """The worker, once it has listed its share (``parallellisting``), while this process
    is still busy: date the heads of those partitions a walk would come to first, into
    ``_WORKER_DATED``, one a step (``forked.meanwhile``: the walk's request stops it).

    Every partition's first candidate, then the oldest next as if every head were chosen,
    up to ``AHEAD_PER_PARTITION`` on average. Reading ahead changes nothing a plan says: a
    head dated here is what dating it in the walk would give, with the same warnings
    (``SegmentFileReader.dated``), only read a moment earlier, as its listing was."""
    reader = SegmentFileReader(None, _WORKER_DATED)
    parts = []
    for path, listing in listed:
        name = parse_partition_dir(os.path.basename(path))
        if name is not None and len(listing.bases) > 1:
            parts.append(
                Partition(
                    os.path.dirname(path),
                    name.topic,
                    name.partition,
                    path,
                    listing.bases,
                    txn_indexes=listing.txn_indexes,
                )
            )
    heap = []
    for i, part in enumerate(parts):
        heap.append((reader(part, part.base_offsets[0]).max_timestamp_ms, i, 0))
        yield None
    heapq.heapify(heap)
    for _ in range(AHEAD_PER_PARTITION * len(parts)):
        if not heap:
            return
        _ts, i, index = heapq.heappop(heap)
        part = parts[i]
        if index + 2 < len(part.base_offsets):  # the next is closed too
            info = reader(part, part.base_offsets[index + 1])
            heapq.heappush(heap, (info.max_timestamp_ms, i, index + 1))
        yield None


class _Capture:
    """A reader that files the warnings of each partition's dating under its path while
    ``taken`` is a dict, and passes them through once it is None."""

    def __init__(self, reader: SegmentFileReader) -> None:
        self.reader = reader
        self.taken: dict[str, list[str]] | None = {}

    def __call__(self, partition: Partition, base_offset: int) -> SegmentInfo:
        warnings = self.reader.warnings
        before = len(warnings)
        info = self.reader(partition, base_offset)
        if self.taken is not None and len(warnings) > before:
            self.taken.setdefault(partition.path, []).extend(warnings[before:])
            del warnings[before:]
        return info


def _walk_half(
    parts: Sequence[Partition],
    reader: SegmentFileReader,
    committed: CommittedOffsets,
    led_here: Collection[tuple[str, int]] | None,
) -> Iterator[Any]:
    """The child: its first heads' warnings per partition, then every head in key order,
    each advanced as if chosen and sent with the warnings its successor's dating gave."""
    capture = _Capture(reader)
    queue = LocalHeads(parts, capture, committed, led_here)
    yield list((capture.taken or {}).items())
    successors: dict[str, list[str]] = {}  # from now on: what dating each successor said
    capture.taken = successors
    position = {part.path: i for i, part in enumerate(parts)}
    while (head := queue.pop()) is not None:
        tied = queue.tied  # before its successor joins: what was queued with it
        queue.advance(head)
        (ts, unconsumed, led_elsewhere, _t, _p, base, _d), index, part, info, nxt, _g = head
        # Flat, and without what the parent has already (topic, log dir): marshal's cost.
        yield (
            position[part.path],
            index,
            ts,
            unconsumed,
            led_elsewhere,
            base,
            nxt,
            info.bytes,
            info.timestamp_source,
            info.files,
            info.shared_files,
            tuple(successors.pop(part.path, ())),
            tied,
        )


class _Streamed:
    """The child's half as a ``HeadQueue``: heads as they come, warnings kept per chosen
    head (``advance``)."""

    def __init__(
        self,
        stream: WorkStream,
        items: Iterator[Any],
        parts: Sequence[Partition],
        committed: CommittedOffsets,
        reader: SegmentFileReader,
    ) -> None:
        self._stream = stream
        self._items = items
        self._parts = parts
        self._committed = committed
        self._reader = reader
        self._pending: dict[str, tuple[str, ...]] = {}
        #: As the child's queue said when it popped the head (before its look-ahead).
        self.tied = True

    def pop(self) -> Head | None:
        item = next(self._items, None)
        if item is None:
            return None
        i, index, ts, unconsumed, led, base, nxt, size, source, files, shared, warned, tied = item
        self.tied = tied
        part = self._parts[i]
        # Always replaced: what an earlier head of this partition brought is not this one's.
        self._pending[part.path] = warned
        groups = self._committed.get((part.topic, part.partition)) if self._committed else None
        key: HeadKey = new_named(
            HeadKey, (ts, unconsumed, led, part.topic, part.partition, base, part.log_dir)
        )
        return key, index, part, segment_info(size, ts, source, files, shared), nxt, groups

    def advance(self, head: Head) -> None:
        self._reader.warnings.extend(self._pending.pop(head[2].path, ()))

    def close(self) -> None:
        self._stream.close()
