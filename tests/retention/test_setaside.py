"""Partitions set aside after a lasting failure (``retention.setaside``, pure).

The case it exists for: the broker denies DeleteRecords on the topic holding the oldest
segments. Without it every plan chooses those first, counts their bytes as freed and stops
short, so the filesystem stays over its limit although other topics' segments could go.
"""

from __future__ import annotations

from diskguard.retention.limits import Limits
from diskguard.retention.planner import Deletion, DeletionResult, plan_filesystem
from diskguard.retention.setaside import SetAside
from support.planning import FakeReader, MiB, make_fs, part

DENIED = "TOPIC_AUTHORIZATION_FAILED: denied (the client lacks DELETE permission on the topic)"


def deletion(topic: str, p: int, base: int = 0, nxt: int = 100) -> Deletion:
    return Deletion(
        topic=topic,
        partition=p,
        base_offset=base,
        next_offset=nxt,
        max_timestamp_ms=0,
        bytes=10 * MiB,
        log_dir="/data/kafka",
        mount="/data",
        files=(),
        reason="test",
    )


def failed(topic: str, p: int, lasting: bool = True, **kw: object) -> DeletionResult:
    return DeletionResult(deletion(topic, p), False, 0, "broker", DENIED, lasting=lasting, **kw)  # type: ignore[arg-type]


def test_only_lasting_failures_are_set_aside_each_partition_once() -> None:
    aside = SetAside(hold_s=300)
    added = aside.record(
        [
            failed("a", 0),
            failed("a", 0),  # a second segment of the same partition in the same plan
            failed("b", 0, lasting=False),  # a timeout, a leader moving: retried next cycle
            failed("c", 0, refused=True),  # nothing was tried
            DeletionResult(deletion("d", 0), True, 10 * MiB, "broker"),
        ],
        now=1000.0,
    )
    assert [(e.topic, e.partition, e.error) for e in added] == [("a", 0, DENIED)]
    assert list(aside.active(1000.0)) == [("a", 0)]
    # Failing again while aside (it was not planned, but say another path tried): not news.
    assert aside.record([failed("a", 0)], now=1100.0) == []


def test_a_refusal_of_the_topic_sets_aside_every_partition_of_it_at_once() -> None:
    """An ACL (or the topic's cleanup.policy) refuses the whole topic: its other partitions
    are set aside with the first, not found refused one per cycle while other topics wait.
    A refusal that is the partition's own (offline: one file's flags) stays the partition's."""
    aside = SetAside(hold_s=300)
    partitions = {"a": [0, 1, 2], "b": [0, 1]}
    added = aside.record(
        [failed("a", 1, whole_topic=True), failed("b", 0)],
        now=1000.0,
        partitions_of=lambda topic: partitions[topic],
    )
    assert [(e.topic, e.partition) for e in added] == [("a", 1), ("a", 0), ("a", 2), ("b", 0)]
    errors = {(e.topic, e.partition): e.error for e in added}
    assert errors[("b", 0)] == DENIED
    # One text for the topic's partitions, naming the refused one: the plan's one reason
    # per topic stays one line however many partitions the topic has.
    assert errors[("a", 0)] == errors[("a", 1)] == errors[("a", 2)]
    assert errors[("a", 0)].startswith(DENIED) and "for partition 1;" in errors[("a", 0)]
    assert len({e.reason(300) for e in added if e.topic == "a"}) == 1
    assert ("b", 1) not in aside.active(1000.0)


def test_an_entry_expires_and_is_set_aside_again_if_it_still_fails() -> None:
    aside = SetAside(hold_s=300)
    aside.record([failed("a", 0)], now=1000.0)
    assert aside.active(1299.9)
    assert aside.active(1300.0) == {}
    again = aside.record([failed("a", 0)], now=1300.0)
    assert [e.until for e in again] == [1600.0]


def test_the_plan_takes_other_partitions_while_one_is_aside() -> None:
    # a-0 holds the two oldest segments; the excess is 20 MiB.
    parts = [part("a", 0, [0, 100, 200]), part("b", 0, [0, 50, 90])]
    segs = {
        ("a", 0, 0): (10 * MiB, 1000),
        ("a", 0, 100): (10 * MiB, 2000),
        ("a", 0, 200): (10 * MiB, 9000),
        ("b", 0, 0): (10 * MiB, 3000),
        ("b", 0, 50): (10 * MiB, 4000),
        ("b", 0, 90): (10 * MiB, 9999),
    }
    fs = make_fs(parts, used=890 * MiB, avail=110 * MiB)
    limits = Limits(88.0, 87.0)
    _, chosen = plan_filesystem(fs, limits, FakeReader(segs))
    assert [(d.topic, d.base_offset) for d in chosen] == [("a", 0), ("a", 100)]

    aside = SetAside(hold_s=300)
    assert aside.apply((fs,), now=0.0)[0] is fs  # nothing aside: the same objects
    aside.record([failed("a", 0)], now=0.0)
    (protected_fs,) = aside.apply((fs,), now=60.0)
    fs_plan, chosen = plan_filesystem(protected_fs, limits, FakeReader(segs))
    assert [(d.topic, d.base_offset) for d in chosen] == [("b", 0), ("b", 50)]
    assert fs_plan.excess_bytes == fs_plan.chosen_bytes == 20 * MiB
    (a0,) = [p for p in protected_fs.log_dirs[0].partitions if p.topic == "a"]
    assert a0.protected and "set aside" in (a0.protected_reason or "")
    assert DENIED in (a0.protected_reason or "") and "tried again in 240 s" in (
        a0.protected_reason or ""
    )
    # After the hold the partition is tried again.
    (again,) = aside.apply((fs,), now=300.0)
    _, chosen = plan_filesystem(again, limits, FakeReader(segs))
    assert [(d.topic, d.base_offset) for d in chosen] == [("a", 0), ("a", 100)]


def test_a_partition_protected_by_policy_keeps_its_own_reason() -> None:
    fs = make_fs(
        [part("a", 0, [0, 100], protected=True, protected_reason="cleanup.policy=compact")],
        used=890 * MiB,
        avail=110 * MiB,
    )
    aside = SetAside()
    aside.record([failed("a", 0)], now=0.0)
    (out,) = aside.apply((fs,), now=1.0)
    assert out.log_dirs[0].partitions[0].protected_reason == "cleanup.policy=compact"


def test_export_and_load_carry_the_entries_across_processes_by_wall_clock() -> None:
    daemon = SetAside(hold_s=300)
    daemon.record([failed("a", 0)], now=1000.0)  # monotonic clock of the daemon
    exported = daemon.export(now=1060.0, wall_now=1_700_000_060.0)
    assert exported == [{"topic": "a", "partition": 0, "error": DENIED, "until": 1_700_000_300.0}]
    plan = SetAside(hold_s=300)  # another process, another monotonic clock
    plan.load(exported, now=5.0, wall_now=1_700_000_100.0)
    (entry,) = plan.active(5.0).values()
    assert entry.until == 205.0 and entry.error == DENIED


def test_load_ignores_what_it_cannot_trust() -> None:
    aside = SetAside(hold_s=300)
    aside.load(
        [
            {"topic": "expired", "partition": 0, "error": "x", "until": 99.0},
            {"topic": "no-error", "partition": 0, "until": 500.0},
            {"topic": "bad-partition", "partition": "0", "error": "x", "until": 500.0},
            "not a dict",
            {"topic": "far", "partition": 1, "error": "x", "until": 1e12},
        ],
        now=0.0,
        wall_now=100.0,
    )
    # Only the well-formed one, and a clock far ahead holds it no longer than hold_s.
    assert {k: e.until for k, e in aside.active(0.0).items()} == {("far", 1): 300.0}
    aside.load({"not": "a list"}, now=0.0, wall_now=100.0)
    assert list(aside.active(0.0)) == [("far", 1)]
