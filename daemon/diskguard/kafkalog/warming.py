"""Dating segments ahead of need, so that a plan over a limit finds their ages in the age
cache (``dating.AgeCache``) instead of reading indexes on a crossing's path: each
partition's head in the daemon's quiet cycles (``warm_heads``), and after an acting cycle
the segments the next crossing will reach (``date_ahead``). Both only read, through the
same ``SegmentFileReader`` a plan uses, within a time budget."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping

from diskguard.kafkalog.dating import SegmentFileReader
from diskguard.kafkalog.model import Partition


def warm_heads(
    partitions: Iterable[Partition],
    reader: SegmentFileReader,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Date each partition's oldest candidate not dated yet, until ``budget_s`` is spent.

    Why: a plan over the limit needs the age of *every* partition's head to find the
    globally oldest, and dating a thousand cold heads took a second, all of it in the first
    cycle over the limit. The daemon warms them in its quiet cycles instead, a bounded slice
    per cycle; a head changes only when its segment goes. Returns the heads dated.
    """
    ages = reader.ages
    if ages is None or budget_s <= 0:
        return 0
    deadline = clock() + budget_s
    dated = 0
    for part in partitions:
        if part.protected:
            continue  # never planned, never dated
        head = part.candidate(0)
        if head is None or ages.has_segment(part.path, head[0]):
            continue
        reader(part, head[0])
        dated += 1
        if clock() >= deadline:
            break
    return dated


def date_ahead(
    partitions: Iterable[Partition],
    taken: Mapping[tuple[str, str, int], int],
    reader: SegmentFileReader,
    budget_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """After a cycle deleted ``taken[(log dir, topic, partition)]`` segments from the head of
    each partition, date as many of the segments that follow them (the first after each
    partition before the second after any), until ``budget_s`` is spent.

    Why: with the broker writing at a steady rate, the next crossing deletes about as much
    again from the same partitions, and its plan dated those new heads on the crossing's
    path (at a million segments, ~12 % of an acting cycle). Dated here, once this cycle's
    space is back, the next plan finds them in the age cache, which keys each age by the
    identity of the segment's files: a segment that changes meanwhile is dated again.
    Returns the segments dated.
    """
    ages = reader.ages
    if ages is None or budget_s <= 0 or not taken:
        return 0
    deadline = clock() + budget_s
    queue = [
        (part, n)
        for part in partitions
        if not part.protected and (n := taken.get((part.log_dir, part.topic, part.partition), 0))
    ]
    dated = 0
    for step in range(max((n for _part, n in queue), default=0)):
        for part, n in queue:
            if step >= n:
                continue
            candidate = part.candidate(n + step)
            if candidate is None or ages.has_segment(part.path, candidate[0]):
                continue
            reader(part, candidate[0])
            dated += 1
            if clock() >= deadline:
                return dated
    return dated
