"""The pure planner: global-oldest order, prefix-only, minimal, never active/protected."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir, Partition, SegmentInfo
from diskguard.retention.limits import Limits, stand
from diskguard.retention.planner import (
    CommittedOffsets,
    HeadQueue,
    LocalHeads,
    MergedHeads,
    SegmentReader,
    plan_filesystem,
    unconsumed_records,
)
from support.planning import AheadHeads, FakeReader, GiB, MiB, make_fs, part


def test_picks_globally_oldest_across_topics_and_stops_when_covered() -> None:
    parts = [part("a", 0, [0, 100, 200, 300]), part("b", 0, [0, 50, 90])]
    segs = {
        ("a", 0, 0): (10 * MiB, 1000),
        ("a", 0, 100): (10 * MiB, 4000),
        ("a", 0, 200): (10 * MiB, 6000),
        ("a", 0, 300): (10 * MiB, 9000),
        ("b", 0, 0): (10 * MiB, 2000),
        ("b", 0, 50): (10 * MiB, 3000),
        ("b", 0, 90): (10 * MiB, 9999),
    }
    # 1000 MiB filesystem, 900 used = 90% > 88%; target 87% = 870 MiB used -> excess 30 MiB.
    fs = make_fs(parts, used=900 * MiB, avail=100 * MiB)
    fs_plan, chosen = plan_filesystem(fs, Limits(88.0, 87.0), FakeReader(segs))
    assert [(d.topic, d.base_offset) for d in chosen] == [("a", 0), ("b", 0), ("b", 50)]
    assert fs_plan.excess_bytes == 30 * MiB
    assert [d.next_offset for d in chosen] == [100, 50, 90]
    assert fs_plan.reachable


def test_under_limit_reads_nothing() -> None:
    reader = FakeReader({})
    fs = make_fs([part("a", 0, [0, 1, 2])], used=50 * MiB, avail=50 * MiB)
    fs_plan, chosen = plan_filesystem(fs, Limits(80.0, 80.0), reader)
    assert chosen == [] and reader.reads == 0 and fs_plan.excess_bytes == 0


def test_pending_reclaim_is_subtracted() -> None:
    segs = {("a", 0, 0): (10 * MiB, 1), ("a", 0, 10): (10 * MiB, 2)}
    fs = make_fs([part("a", 0, [0, 10, 20])], used=90 * MiB, avail=10 * MiB, pending=5 * MiB)
    fs_plan, chosen = plan_filesystem(fs, Limits(85.0, 85.0), FakeReader(segs))
    # excess = 90 - 85 - 5 = 0 -> nothing deleted although usage is over the ceiling
    assert fs_plan.excess_bytes == 0 and chosen == []


def test_active_and_protected_never_chosen_and_unreachable_reported() -> None:
    segs = {("a", 0, 0): (1 * MiB, 1), ("__consumer_offsets", 0, 0): (50 * MiB, 0)}
    parts = [part("a", 0, [0, 5]), part("__consumer_offsets", 0, [0, 7], protected=True)]
    fs = make_fs(parts, used=95 * MiB, avail=5 * MiB)
    fs_plan, chosen = plan_filesystem(fs, Limits(50.0, 50.0), FakeReader(segs))
    assert [(d.topic, d.base_offset) for d in chosen] == [("a", 0)]
    assert not fs_plan.reachable and fs_plan.unreachable_bytes > 0


def test_segments_below_log_start_are_pending_not_candidates() -> None:
    p = part("a", 0, [0, 10, 20, 30], log_start_offset=20)
    assert p.reclaiming == (0, 10)
    assert p.candidates == ((20, 30),)


def test_ties_break_deterministically_and_prefer_consumed() -> None:
    segs = {("b", 0, 0): (MiB, 5), ("a", 1, 0): (MiB, 5), ("a", 0, 0): (MiB, 5)}
    parts = [part("b", 0, [0, 10]), part("a", 1, [0, 10]), part("a", 0, [0, 10])]
    fs = make_fs(parts, used=99 * MiB, avail=1 * MiB)
    _, chosen = plan_filesystem(fs, Limits(98.5, 98.5), FakeReader(segs))
    assert [(d.topic, d.partition) for d in chosen] == [("a", 0)]
    # g1 has not read a-0's segment yet, a-1's entirely -> a-1 goes first
    committed = {("a", 0): {"g1": 3}, ("a", 1): {"g1": 10}}
    _, chosen = plan_filesystem(fs, Limits(98.5, 98.5), FakeReader(segs), committed)
    assert [(d.topic, d.partition) for d in chosen] == [("a", 1)]
    # without a commit on a-1, g1 (a consumer of topic a) has read none of it -> b-0 first
    committed = {("a", 0): {"g1": 3}}
    _, chosen = plan_filesystem(fs, Limits(98.5, 98.5), FakeReader(segs), committed)
    assert [(d.topic, d.partition) for d in chosen] == [("b", 0)]


def test_unconsumed_records_per_group() -> None:
    assert unconsumed_records({"g": 5, "h": 100, "i": 0}, 0, 10) == {"g": 5, "i": 10}


def test_max_bytes_budget_per_log_dir() -> None:
    segs = {("a", 0, 0): (10 * MiB, 1), ("a", 0, 10): (10 * MiB, 2)}
    fs = make_fs([part("a", 0, [0, 10, 20])], used=10 * MiB, avail=990 * MiB, kafka_bytes=35 * MiB)
    _, chosen = plan_filesystem(fs, Limits(100.0, 100.0, max_bytes=20 * MiB), FakeReader(segs))
    assert [d.base_offset for d in chosen] == [0, 10]
    assert all(d.reason == "max_bytes" for d in chosen)


def filesystem_excess(fs: Filesystem, limits: Limits) -> tuple[int, bool]:
    standing = stand(fs.usage, limits, fs.pending_reclaim_bytes)
    return standing.excess_bytes, standing.over


def test_offline_headroom_applies_only_over_the_ceiling_and_is_capped() -> None:
    fs = make_fs([], used=80 * GiB, avail=20 * GiB)
    # under the ceiling: headroom never triggers a deletion (KIP-61 off means off)
    assert filesystem_excess(fs, Limits(100.0, 100.0, headroom_bytes=30 * GiB)) == (0, False)
    assert filesystem_excess(fs, Limits(90.0, 90.0, headroom_bytes=30 * GiB)) == (0, False)
    # over the ceiling: leave the headroom free too, but at most 5% of the disk
    full = make_fs([], used=97 * GiB, avail=3 * GiB)
    assert filesystem_excess(full, Limits(96.0, 96.0)) == (1 * GiB, True)
    assert filesystem_excess(full, Limits(96.0, 96.0, headroom_bytes=1 * GiB)) == (1 * GiB, True)
    assert filesystem_excess(full, Limits(96.0, 96.0, headroom_bytes=30 * GiB)) == (2 * GiB, True)


# -- property: the chosen set is a global-oldest prefix set, minimal, safe --------------------


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[Partition], dict[tuple[str, int, int], tuple[int, int]]]:
    parts = []
    segs: dict[tuple[str, int, int], tuple[int, int]] = {}
    for i in range(draw(st.integers(1, 6))):
        topic = draw(st.sampled_from(["t1", "t2", "__consumer_offsets"]))
        n = draw(st.integers(1, 6))
        bases = [k * 100 for k in range(n)]
        ts = sorted(draw(st.lists(st.integers(0, 50), min_size=n, max_size=n)))
        for base, t in zip(bases, ts, strict=True):
            segs[(topic, i, base)] = (draw(st.integers(1, 5)) * MiB, t)
        parts.append(part(topic, i, bases, protected=topic.startswith("__")))
    return parts, segs


@settings(max_examples=300, deadline=None)
@given(layouts(), st.integers(0, 80))
def test_property_prefix_minimal_oldest(layout: tuple, excess_mib: int) -> None:  # type: ignore[type-arg]
    parts, segs = layout
    fs = make_fs(parts, used=100 * MiB + excess_mib * MiB, avail=0)
    total = fs.usage.used_bytes
    limit = 100.0 * 100 / (100 + excess_mib) if excess_mib else 100.0
    fs_plan, chosen = plan_filesystem(fs, Limits(limit, limit), FakeReader(segs))
    by_part: dict[tuple[str, int], list[int]] = {}
    for d in chosen:
        by_part.setdefault((d.topic, d.partition), []).append(d.base_offset)
    for p in parts:
        got = by_part.get((p.topic, p.partition), [])
        assert got == list(p.base_offsets[: len(got)]), "not a prefix"
        assert p.active_base_offset not in got, "active segment chosen"
        assert not (p.protected and got), "protected topic chosen"
    # global-oldest: nothing left unchosen among candidates is strictly older than a chosen one
    # that some *other* partition provided (within a partition order is forced by the prefix).
    chosen_ts = [d.max_timestamp_ms for d in chosen]
    assert chosen_ts == sorted(chosen_ts)
    heads = []
    for p in parts:
        if p.protected:
            continue
        n = len(by_part.get((p.topic, p.partition), []))
        if n < len(p.candidates):
            heads.append(segs[(p.topic, p.partition, p.candidates[n][0])][1])
    if chosen and heads:
        assert max(chosen_ts) <= min(heads) or fs_plan.excess_bytes <= 0
    # minimal: dropping the last chosen segment leaves the excess uncovered
    covered = sum(d.bytes for d in chosen)
    if chosen:
        assert covered - chosen[-1].bytes < fs_plan.excess_bytes
    if fs_plan.reachable:
        assert covered >= fs_plan.excess_bytes
    assert total == fs.usage.used_bytes


# -- a consumer group with no committed offset on a partition has not consumed it -------------


def _tied(parts: list[Partition]) -> FakeReader:
    return FakeReader({(p.topic, p.partition, 0): (MiB, 5) for p in parts})


def test_group_without_offset_on_a_partition_has_not_consumed_it() -> None:
    # "g" consumes topic a (offset 100 on a-1, past everything) but has no offset on a-0: it
    # has read nothing there, so a-0 is the *least* preferable of three equally old segments.
    parts = [part("a", 0, [0, 10]), part("a", 1, [0, 10]), part("b", 0, [0, 10])]
    fs = make_fs(parts, used=99 * MiB, avail=1 * MiB)
    for committed in (
        {("a", 1): {"g": 100}},  # a-0 missing from the answer (OffsetFetch for all partitions)
        {("a", 0): {"g": -1}, ("a", 1): {"g": 100}},  # explicitly -1 (nothing committed)
    ):
        _, chosen = plan_filesystem(fs, Limits(97.5, 97.5), _tied(parts), committed)
        assert [(d.topic, d.partition) for d in chosen] == [("a", 1), ("b", 0)]
        _, chosen = plan_filesystem(fs, Limits(96.5, 96.5), _tied(parts), committed)
        assert [(d.topic, d.partition) for d in chosen] == [("a", 1), ("b", 0), ("a", 0)]
        last = chosen[-1]
        assert last.unconsumed_records == {"g": 10}  # the whole segment
        assert last.groups_without_offset == ("g",)
        assert chosen[0].unconsumed_records == {} and chosen[0].groups_without_offset == ()


def test_a_group_with_no_offset_anywhere_in_a_topic_is_not_its_consumer() -> None:
    parts = [part("a", 0, [0, 10]), part("a", 1, [0, 10])]
    fs = make_fs(parts, used=99 * MiB, avail=1 * MiB)
    committed = {("a", 0): {"idle": -1}, ("a", 1): {"idle": -1}, ("b", 0): {"idle": 4}}
    _, chosen = plan_filesystem(fs, Limits(97.5, 97.5), _tied(parts), committed)
    assert [(d.topic, d.partition) for d in chosen] == [("a", 0), ("a", 1)]
    assert all(d.unconsumed_records == {} and d.groups_without_offset == () for d in chosen)


def test_unconsumed_records_without_offset_is_the_whole_segment() -> None:
    assert unconsumed_records({"g": -1, "h": 12}, 10, 20) == {"g": 10, "h": 8}


class _NoCandidatesTuple(Partition):
    @property
    def candidates(self) -> tuple[tuple[int, int], ...]:
        raise AssertionError("the planner must not rebuild the candidates tuple per head")


def test_planner_walks_candidates_by_index_not_by_rebuilding_the_tuple() -> None:
    """The planner asks for a partition's next candidate at every head it pops: rebuilding the
    whole ``candidates`` tuple each time made a plan of k segments per partition O(k²)."""
    bases = tuple(range(0, 100, 10))
    tricky = _NoCandidatesTuple(
        log_dir="/d", topic="t", partition=0, path="/d/t-0", base_offsets=bases, log_start_offset=15
    )
    fs = make_fs([tricky], used=95 * GiB, avail=5 * GiB)

    def read(p: Partition, base: int) -> SegmentInfo:
        return SegmentInfo(GiB, base, "timeindex", ())

    _plan, chosen = plan_filesystem(fs, Limits(90.0, 10.0), read)
    assert [d.base_offset for d in chosen] == list(bases[1:-1])


def test_partition_candidate_by_index_matches_candidates() -> None:
    for log_start in (None, 0, 15, 20, 99, 1000):
        part = Partition(
            log_dir="/d",
            topic="t",
            partition=0,
            path="/d/t-0",
            base_offsets=(0, 10, 20, 30),
            log_start_offset=log_start,
        )
        got = [part.candidate(i) for i in range(part.candidate_count)]
        assert got == list(part.candidates) and part.candidate(part.candidate_count) is None
        assert dataclasses.replace(part, log_start_offset=None).candidate(0) == (0, 10)


# -- merged queues: the order of one heap (the parallel plan's contract) ----------------------


@settings(max_examples=200, deadline=None)
@given(layouts(), st.integers(0, 80), st.lists(st.integers(0, 2), min_size=6, max_size=6))
def test_merged_queues_plan_exactly_what_one_heap_plans(
    layout: tuple,  # type: ignore[type-arg]
    excess_mib: int,
    owners: list[int],
) -> None:
    """Partitions spread over up to three queues in any way: the same deletions, in the same
    order, reading the same heads."""
    parts, segs = layout
    fs = make_fs(parts, used=100 * MiB + excess_mib * MiB, avail=0)
    limit = 100.0 * 100 / (100 + excess_mib) if excess_mib else 100.0
    one = FakeReader(segs)
    _plan, expected = plan_filesystem(fs, Limits(limit, limit), one)

    def split(
        ps: Sequence[Partition],
        read: SegmentReader,
        committed: CommittedOffsets,
        led_here: Collection[tuple[str, int]] | None,
    ) -> HeadQueue:
        groups = [[p for i, p in enumerate(ps) if owners[i % len(owners)] == k] for k in range(3)]
        return MergedHeads([LocalHeads(g, read, committed, led_here) for g in groups])

    merged = FakeReader(segs)
    _plan, got = plan_filesystem(fs, Limits(limit, limit), merged, heads=split)
    assert got == expected
    assert merged.reads == one.reads


def test_merged_queues_skip_a_log_dir_that_needs_nothing_like_one_heap() -> None:
    """``max_bytes``: heads of a log dir under its budget are popped and dropped while
    another dir still needs bytes; a queue that dates ahead must not change what goes."""
    a = [dataclasses.replace(part("a", i, [0, 10, 20, 30]), log_dir="/data/a") for i in range(3)]
    b = [dataclasses.replace(part("b", i, [0, 10, 20, 30]), log_dir="/data/b") for i in range(3)]
    segs = {
        (p.topic, p.partition, base): (1 * MiB, (ord(p.topic) * 7 + p.partition * 3 + k) % 11)
        for p in a + b
        for k, base in enumerate(p.base_offsets)
    }
    usage = FilesystemUsage("/data", "/dev/x", 100 * MiB, 50 * MiB, 50 * MiB)
    fs = Filesystem(
        usage,
        (
            LogDir("/data/a", "/data", tuple(a), 0, kafka_bytes=12 * MiB),
            LogDir("/data/b", "/data", tuple(b), 0, kafka_bytes=6 * MiB),
        ),
    )
    limits = Limits(99.0, 99.0, max_bytes=5 * MiB)
    _plan, expected = plan_filesystem(fs, limits, FakeReader(segs))
    assert {d.log_dir for d in expected} == {"/data/a", "/data/b"}

    def eager(
        ps: Sequence[Partition],
        read: SegmentReader,
        committed: CommittedOffsets,
        led_here: Collection[tuple[str, int]] | None,
    ) -> HeadQueue:
        return MergedHeads([AheadHeads(ps[0::2], read), LocalHeads(ps[1::2], read, committed)])

    _plan, got = plan_filesystem(fs, limits, FakeReader(segs), heads=eager)
    assert got == expected
