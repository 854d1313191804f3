"""The broker's facts given to a plan without a second walk (``with_facts``): wherever it
answers, its plan is the second walk's to the field (deletions, order, unconsumed records,
every ``Why``); where the facts could reorder the walk (a head they mark had a rival as old)
it answers None and the caller walks again."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.kafkalog.model import Filesystem, Partition
from diskguard.retention.limits import Limits, Standing, stand
from diskguard.retention.planner import (
    CommittedOffsets,
    HeadQueue,
    HeadsFactory,
    LocalHeads,
    MergedHeads,
    Plan,
    SegmentReader,
    WalkTrace,
    plan,
    with_facts,
)
from support.planning import AheadHeads, FakeReader, MiB, make_fs, part

Segments = dict[tuple[str, int, int], tuple[int, int]]


def _queues(kind: str) -> HeadsFactory:
    def split(
        ps: Sequence[Partition],
        read: SegmentReader,
        committed: CommittedOffsets,
        led_here: Collection[tuple[str, int]] | None,
    ) -> HeadQueue:
        if kind == "one":
            return LocalHeads(ps, read, committed, led_here)
        mine = LocalHeads(ps[0::3], read, committed, led_here)
        theirs = [p for i, p in enumerate(ps) if i % 3]
        if kind == "ahead":
            return MergedHeads([mine, AheadHeads(theirs, read, committed, led_here)])
        return MergedHeads([mine, LocalHeads(theirs, read, committed, led_here)])

    return split


@st.composite
def _trees(draw: st.DrawFn) -> tuple[list[Partition], Segments]:
    """Up to 8 partitions of 3 topics, timestamps from a narrow range (many ties), not always
    rising within a partition (a successor may be older than a head popped before it)."""
    parts = []
    segs: Segments = {}
    for i in range(draw(st.integers(1, 8))):
        topic = draw(st.sampled_from(["t1", "t2", "t3"]))
        n = draw(st.integers(1, 6))
        bases = [k * 100 for k in range(n)]
        stamps = draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))
        if draw(st.booleans()):
            stamps.sort()
        for base, ts in zip(bases, stamps, strict=True):
            segs[(topic, i, base)] = (draw(st.integers(1, 4)) * MiB, ts)
        log_dir = draw(st.sampled_from(["/data/kafka", "/data/kafka", "/data/other"]))
        parts.append(dataclasses.replace(part(topic, i, bases), log_dir=log_dir))
    return parts, segs


def _facts(
    data: st.DataObject, parts: list[Partition]
) -> tuple[CommittedOffsets, frozenset[tuple[str, int]] | None]:
    """Some partitions with a group's offset (-1: it has read none there), some led here."""
    committed: dict[tuple[str, int], dict[str, int]] = {}
    for p in parts:
        if data.draw(st.booleans()):
            committed[(p.topic, p.partition)] = {"g": data.draw(st.integers(-1, 600))}
    led = None
    if data.draw(st.booleans()):
        led = frozenset((p.topic, p.partition) for p in parts if data.draw(st.booleans()))
    return committed, led


def _fs(parts: list[Partition], excess_mib: int) -> Filesystem:
    fs = make_fs(parts, used=100 * MiB + excess_mib * MiB, avail=0)
    dirs = {p.log_dir for p in parts}
    return dataclasses.replace(
        fs,
        log_dirs=tuple(
            dataclasses.replace(
                fs.log_dirs[0],
                path=d,
                partitions=tuple(p for p in parts if p.log_dir == d),
                kafka_bytes=10 * MiB,
            )
            for d in sorted(dirs)
        ),
    )


def _standing_of(limits: Limits) -> Callable[[Filesystem], Standing]:
    def standing(fs: Filesystem) -> Standing:
        return stand(fs.usage, limits, fs.pending_reclaim_bytes)

    return standing


def _two_walks(
    fs: Filesystem,
    limits: Limits,
    segs: Segments,
    committed: CommittedOffsets,
    led: frozenset[tuple[str, int]] | None,
    kind: str,
) -> tuple[Plan, Plan | None]:
    """The second walk's plan, and ``with_facts`` over the first walk's."""
    standing_of = _standing_of(limits)
    trace = WalkTrace()
    first = plan([fs], standing_of, FakeReader(segs), {}, None, _queues(kind), None, trace)
    second = plan([fs], standing_of, FakeReader(segs), committed, led, _queues(kind))
    return second, with_facts(first, trace, standing_of, committed, led)


@settings(max_examples=400, deadline=None)
@given(st.data(), _trees(), st.integers(0, 60), st.sampled_from(["one", "merged", "ahead"]))
def test_with_facts_is_the_second_walk_wherever_it_answers(
    data: st.DataObject,
    tree: tuple[list[Partition], Segments],
    excess_mib: int,
    kind: str,
) -> None:
    parts, segs = tree
    committed, led = _facts(data, parts)
    limit = 100.0 * 100 / (100 + excess_mib) if excess_mib else 100.0
    max_bytes = data.draw(st.sampled_from([None, 4 * MiB]))
    limits = Limits(limit, limit, max_bytes=max_bytes)
    second, same = _two_walks(_fs(parts, excess_mib), limits, segs, committed, led, kind)
    if same is not None:
        assert same == second


def test_with_facts_answers_when_no_fact_touches_a_tie() -> None:
    """Every head as old as another, no fact set on any of them: one walk is enough, and
    the facts still show (the unconsumed records of a head that had no rival)."""
    parts = [part("a", 0, [0, 10, 20]), part("b", 0, [0, 10, 20]), part("c", 0, [0, 10, 20])]
    segs = {
        ("a", 0, 0): (MiB, 5),
        ("b", 0, 0): (MiB, 5),
        ("a", 0, 10): (MiB, 7),
        ("b", 0, 10): (MiB, 8),
        ("c", 0, 0): (MiB, 1),
        ("c", 0, 10): (MiB, 9),
    }
    fs = make_fs(parts, used=103 * MiB, avail=0)
    committed = {("c", 0): {"g": 4}}  # c's oldest, alone in its age, not read by g
    led = frozenset({("a", 0), ("b", 0), ("c", 0)})
    second, same = _two_walks(fs, Limits(97.5, 97.5), segs, committed, led, "one")
    assert same == second
    assert same.deletions[0].unconsumed_records == {"g": 6}
    assert [(d.topic, d.base_offset) for d in same.deletions] == [("c", 0), ("a", 0), ("b", 0)]


def test_with_facts_declines_where_a_fact_could_reorder_a_tie() -> None:
    """a-0 and b-0 are as old; knowing a-0 is led elsewhere, b-0 goes first: a walk again."""
    parts = [part("a", 0, [0, 10]), part("b", 0, [0, 10])]
    segs = {("a", 0, 0): (MiB, 5), ("b", 0, 0): (MiB, 5)}
    fs = make_fs(parts, used=101 * MiB, avail=0)
    led = frozenset({("b", 0)})
    second, same = _two_walks(fs, Limits(99.5, 99.5), segs, {}, led, "one")
    assert same is None
    assert [d.topic for d in second.deletions] == ["b"]


def test_with_facts_declines_when_the_standing_moved() -> None:
    """The limits a second walk would plan under are not the traced walk's: walk again."""
    parts = [part("a", 0, [0, 10, 20])]
    segs = {("a", 0, 0): (MiB, 5), ("a", 0, 10): (MiB, 6)}
    fs = make_fs(parts, used=102 * MiB, avail=0)
    trace = WalkTrace()
    first = plan([fs], _standing_of(Limits(99.5, 99.5)), FakeReader(segs), trace=trace)
    led = frozenset({("a", 0)})
    assert first.deletions
    assert with_facts(first, trace, _standing_of(Limits(99.5, 99.5)), {}, led) is not None
    assert with_facts(first, trace, _standing_of(Limits(99.0, 99.0)), {}, led) is None
