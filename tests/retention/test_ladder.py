"""The ladder (pure): tiered eviction before deletion, moves bounded by the target's room and
the ceiling's clock, deletion only for what is left."""

from __future__ import annotations

from dataclasses import replace

from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir
from diskguard.retention.ladder import (
    BALANCE,
    TIERED,
    BalanceFacts,
    MoveCandidate,
    TargetDir,
    TieredFacts,
    climb,
    uploaded_prefix,
)
from diskguard.retention.limits import Limits, Standing, stand
from diskguard.retention.planner import plan
from support.planning import FakeReader, MiB, make_fs, part

NOW = 10_000_000


def _standing(limits: Limits) -> object:
    return lambda fs: stand(fs.usage, limits, fs.pending_reclaim_bytes)


def test_uploaded_prefix_keeps_only_uploaded_closed_segments() -> None:
    p = part("t", 0, [0, 100, 200, 300], protected=True, protected_reason="tiered")
    cut = uploaded_prefix(p, 199)
    assert cut is not None and not cut.protected
    assert cut.candidates == ((0, 100), (100, 200))
    assert uploaded_prefix(p, 98) is None  # the first segment ends at 99: not uploaded
    # Everything closed uploaded: still never the active segment.
    full = uploaded_prefix(p, 10_000)
    assert full is not None and full.candidates == ((0, 100), (100, 200), (200, 300))


def test_tiered_eviction_covers_the_excess_and_deletion_gets_the_rest() -> None:
    tiered = part("t", 0, [0, 100, 200, 300], protected=True, protected_reason="tiered")
    plain = part("d", 0, [0, 50, 99])
    segs = {
        ("t", 0, 0): (10 * MiB, 1000),
        ("t", 0, 100): (10 * MiB, 3000),
        ("t", 0, 200): (10 * MiB, 5000),
        ("d", 0, 0): (10 * MiB, 2000),
        ("d", 0, 50): (10 * MiB, 4000),
    }
    fs = make_fs([tiered, plain], used=900 * MiB, avail=100 * MiB)
    limits = Limits(88.0, 86.0)  # excess: 900 - 860 = 40 MiB
    facts = TieredFacts(frozenset({"t"}), {("t", 0): 199}, NOW)
    reader = FakeReader(segs)
    ladder = climb([fs], _standing(limits), reader, tiered=facts)
    # Only the two uploaded segments of t (its third ends at 299 > 199).
    (ev,) = ladder.evictions
    assert ev.topic == "t" and [d.base_offset for d in ev.segments] == [0, 100]
    assert ev.cutoff_ms == 3000 and ev.local_retention_ms == NOW - 3000
    assert ladder.covered == {"/data": 20 * MiB}
    assert [r.rung for r in ladder.steps["/data"]] == [TIERED]
    # The deletion plan takes the other 20 MiB, oldest first, never the tiered topic.
    rest = plan([fs], _standing(limits), reader, covered=ladder.covered)
    assert [(d.topic, d.base_offset) for d in rest.deletions] == [("d", 0), ("d", 50)]
    assert rest.filesystems[0].excess_bytes == 40 * MiB
    assert rest.filesystems[0].chosen_bytes == 20 * MiB


def test_eviction_alone_when_it_suffices_and_nothing_is_deleted() -> None:
    tiered = part("t", 0, [0, 100, 200], protected=True, protected_reason="tiered")
    segs = {("t", 0, 0): (30 * MiB, 1000), ("t", 0, 100): (30 * MiB, 2000)}
    fs = make_fs([tiered, part("d", 0, [0, 5, 9])], used=900 * MiB, avail=100 * MiB)
    limits = Limits(88.0, 86.0)
    reader = FakeReader({**segs, ("d", 0, 0): (9 * MiB, 1), ("d", 0, 5): (9 * MiB, 2)})
    ladder = climb(
        [fs], _standing(limits), reader, TieredFacts(frozenset({"t"}), {("t", 0): 999}, NOW)
    )
    assert [d.base_offset for d in ladder.evictions[0].segments] == [0, 100]
    assert plan([fs], _standing(limits), reader, covered=ladder.covered).deletions == ()


def test_a_segment_stamped_in_the_future_stops_its_partition() -> None:
    tiered = part("t", 0, [0, 100, 200, 300], protected=True)
    segs = {
        ("t", 0, 0): (10 * MiB, 1000),
        ("t", 0, 100): (10 * MiB, NOW + 5),
        ("t", 0, 200): (10 * MiB, 2000),
    }
    fs = make_fs([tiered], used=900 * MiB, avail=100 * MiB)
    ladder = climb(
        [fs],
        _standing(Limits(88.0, 80.0)),
        FakeReader(segs),
        TieredFacts(frozenset({"t"}), {("t", 0): 999}, NOW),
    )
    assert [d.base_offset for d in ladder.evictions[0].segments] == [0]


def test_no_upload_known_no_eviction() -> None:
    tiered = part("t", 0, [0, 100, 200], protected=True)
    fs = make_fs([tiered], used=900 * MiB, avail=100 * MiB)
    facts = TieredFacts(frozenset({"t"}), {("t", 0): -1}, NOW)
    assert climb([fs], _standing(Limits(88.0, 80.0)), FakeReader({}), facts).evictions == ()


def _two_disks(used_a: int, used_b: int, size: int = 1000 * MiB) -> tuple[Filesystem, TargetDir]:
    a = Filesystem(
        FilesystemUsage("/a", "/dev/a", size, used_a, size - used_a),
        (LogDir("/a/kafka", "/a", (part("m", 0, [0, 1]), part("n", 0, [0, 1]))),),
    )
    b_usage = FilesystemUsage("/b", "/dev/b", size, used_b, size - used_b)
    return a, TargetDir("/b/kafka", b_usage, Limits(80.0, 70.0))


def test_moves_largest_cold_first_bounded_by_the_targets_room() -> None:
    # Over its ceiling already: a move (2.5 s) lands before a deletion would (300 s).
    fs, target = _two_disks(900 * MiB, 500 * MiB)  # b may take 700 - 500 = 200 MiB
    facts = BalanceFacts(
        candidates=(
            MoveCandidate("m", 0, "/a/kafka", 150 * MiB),
            MoveCandidate("n", 0, "/a/kafka", 250 * MiB),  # larger, but no room for it
            MoveCandidate("h", 0, "/a/kafka", 180 * MiB, hot=True),
        ),
        targets=(target,),
        rate_bytes_per_s=100 * MiB,
        delete_delay_s=1.0,
    )
    limits = Limits(85.0, 80.0, reclaim_latency_s=300.0)
    ladder = climb([fs], _standing(limits), FakeReader({}), balance=facts)
    assert [(m.topic, m.target_dir) for m in ladder.moves] == [("m", "/b/kafka")]
    (step,) = ladder.steps["/a"]
    assert step.rung == BALANCE and step.bytes == 150 * MiB
    assert step.latency_s == 1.5 + 1.0


def test_a_move_that_lands_after_the_ceiling_is_crossed_is_not_made() -> None:
    fs, target = _two_disks(900 * MiB, 100 * MiB)
    facts = BalanceFacts((MoveCandidate("m", 0, "/a/kafka", 150 * MiB),), (target,), 1 * MiB, 0.5)
    # Growing 10 MiB/s, 150 s to copy: the disk would cross 95 % long before.
    limits = Limits(95.0, 80.0, growth_bytes_per_s=10 * MiB, reclaim_latency_s=2.0)
    ladder = climb([fs], _standing(limits), FakeReader({}), balance=facts)
    assert ladder.moves == ()


def test_a_move_is_planned_early_when_only_its_own_horizon_is_over() -> None:
    fs, target = _two_disks(700 * MiB, 100 * MiB)
    facts = BalanceFacts((MoveCandidate("m", 0, "/a/kafka", 200 * MiB),), (target,), 10 * MiB, 1.0)
    limits = Limits(
        80.0, 70.0, growth_bytes_per_s=4 * MiB, reclaim_latency_s=2.0, reclaim_period_s=10.0
    )
    standing_of = _standing(limits)
    # 700 + 8 + 40 < 800: at the retention check's horizon the disk is fine.
    assert not standing_of(fs).over

    def at(f: Filesystem, latency: float) -> Standing:
        return stand(f.usage, replace(limits, reclaim_latency_s=latency), f.pending_reclaim_bytes)

    assert climb([fs], standing_of, FakeReader({}), balance=facts).moves == ()
    ladder = climb([fs], standing_of, FakeReader({}), balance=facts, standing_at=at)
    # 21 s to move 200 MiB: 700 + 84 + 40 > 800 at that horizon, 700 + 84 < 800 when it
    # lands: move now, while it still lands in time.
    assert [m.topic for m in ladder.moves] == ["m"]


def test_no_target_on_the_same_disk() -> None:
    fs, target = _two_disks(900 * MiB, 100 * MiB)
    same = replace(target, usage=replace(target.usage, device="/dev/a"))
    facts = BalanceFacts((MoveCandidate("m", 0, "/a/kafka", 10 * MiB),), (same,), 10 * MiB, 1.0)
    limits = Limits(85.0, 80.0, reclaim_latency_s=300.0)
    assert climb([fs], _standing(limits), FakeReader({}), balance=facts).moves == ()


def test_describe_log_dirs_asks_only_for_the_replicas_a_rung_needs() -> None:
    from diskguard.kafkalog.scan import ScanResult
    from diskguard.retention.ladderstate import MoveInFlight
    from diskguard.retention.moverung import replicas_wanted

    one = make_fs([part("a", 0, [0]), part("a", 1, [0]), part("b", 0, [0])], 10, 90)
    other = replace(one, usage=replace(one.usage, mount="/data2", device="/dev/y"))
    move = MoveInFlight("b", 0, "/data/kafka", "/data2/kafka", 5, "/data", 0)
    # One device (or balancing off): the dirs' state alone, or the replicas moving.
    assert replicas_wanted(ScanResult((one,)), True, {}) == {}
    assert replicas_wanted(ScanResult((one, other)), False, {"b-0": move}) == {"b": [0]}
    # Two devices and balancing on: every replica the scan found (never "all of the
    # cluster's", which kafka-python would turn into a Metadata request for every topic).
    wanted = replicas_wanted(ScanResult((one, other)), True, {})
    assert {t: sorted(set(p)) for t, p in wanted.items()} == {"a": [0, 1], "b": [0]}
