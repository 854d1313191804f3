"""The stuck-state tracker on plain data: which cycles are stuck, what is logged when, and when
a change in usage needs a new cycle (the daemon end to end is in test_stuck.py)."""

from __future__ import annotations

import dataclasses

from structlog.testing import capture_logs

from diskguard.kafkalog.model import FilesystemUsage
from diskguard.retention.limits import Limits, stand
from diskguard.retention.mode import BROKER, DRY_RUN, OFFLINE, REFUSED, ModeDecision
from diskguard.retention.planner import FilesystemPlan, Plan
from diskguard.retention.stuck import (
    HEARTBEAT_S,
    MIN_MOVE_BYTES,
    UNREACHABLE_DETAIL,
    StuckTracker,
    stuck_reason,
)

GiB = 1024**3
MiB = 1024**2


def fs_plan(**kw: object) -> FilesystemPlan:
    base: dict[str, object] = {
        "mount": "/data",
        "device": "/dev/x",
        "log_dirs": ("/data/kafka",),
        "total_bytes": 100 * GiB,
        "used_bytes": 90 * GiB,
        "available_bytes": 10 * GiB,
        "usage_percent": 90.0,
        "limit_percent": 80.0,
        "target_percent": 80.0,
        "pending_reclaim_bytes": 0,
        "excess_bytes": 10 * GiB,
        "chosen_bytes": 0,
        "chosen_count": 0,
        "unreachable_bytes": 10 * GiB,
    }
    base.update(kw)
    # Bytes and the rounded percentage agree, as in a real plan: the stuck rule reads the bytes.
    if "usage_percent" in kw and "used_bytes" not in kw:
        used = int(100 * GiB * float(kw["usage_percent"]) / 100)  # type: ignore[arg-type]
        base.update(used_bytes=used, available_bytes=100 * GiB - used)
    elif "used_bytes" in kw and "usage_percent" not in kw:
        used = int(kw["used_bytes"])  # type: ignore[call-overload]
        base.update(available_bytes=100 * GiB - used, usage_percent=round(used / GiB, 3))
    return FilesystemPlan(**base)  # type: ignore[arg-type]


def usage(used: int) -> FilesystemUsage:
    return FilesystemUsage(
        mount="/data",
        device="/dev/x",
        total_bytes=100 * GiB,
        used_bytes=used,
        available_bytes=100 * GiB - used,
    )


def mode(name: str) -> ModeDecision:
    return ModeDecision(name, f"mode = {name}")


def test_the_four_reasons_and_the_cases_that_are_not_stuck() -> None:
    assert stuck_reason(mode(OFFLINE), fs_plan()) == ("target_unreachable", UNREACHABLE_DETAIL)
    halted = fs_plan(halted="earlier deletions did not free their space")
    assert stuck_reason(mode(OFFLINE), halted) == ("target_unreachable", halted.halted)
    chosen = fs_plan(chosen_count=3, chosen_bytes=GiB)
    assert stuck_reason(mode(REFUSED), chosen)[0] == "refused"  # type: ignore[index]
    assert stuck_reason(mode(DRY_RUN), chosen)[0] == "dry_run"  # type: ignore[index]
    covered = fs_plan(excess_bytes=0, pending_reclaim_bytes=12 * GiB, unreachable_bytes=0)
    assert stuck_reason(mode(BROKER), covered)[0] == "pending_reclaim"  # type: ignore[index]
    # Acting on chosen segments is progress, not stuck; under the limit is not stuck either.
    assert stuck_reason(mode(OFFLINE), chosen) is None
    under = fs_plan(usage_percent=70.0, excess_bytes=0, unreachable_bytes=0)
    assert stuck_reason(mode(OFFLINE), under) is None


def test_logged_when_it_begins_changes_on_the_heartbeat_and_when_it_clears() -> None:
    tracker = StuckTracker()
    stuck = Plan((fs_plan(),), ())
    with capture_logs() as logs:
        assert tracker.observe(mode(OFFLINE), stuck, 0.0) == frozenset()  # begins: not quiet
        for t in range(1, 100):
            assert tracker.observe(mode(OFFLINE), stuck, float(t)) == {"/data"}
        assert tracker.observe(mode(OFFLINE), stuck, HEARTBEAT_S) == frozenset()
        refused = Plan((fs_plan(chosen_count=1, chosen_bytes=GiB),), ())
        assert tracker.observe(mode(REFUSED), refused, HEARTBEAT_S + 1) == frozenset()
        assert tracker.observe(mode(REFUSED), refused, HEARTBEAT_S + 2) == {"/data"}
        under = Plan((fs_plan(usage_percent=70.0, excess_bytes=0, unreachable_bytes=0),), ())
        assert tracker.observe(mode(OFFLINE), under, HEARTBEAT_S + 3) == frozenset()
        assert tracker.observe(mode(OFFLINE), under, HEARTBEAT_S + 4) == frozenset()
    events = [(e["event"], e.get("reason"), e.get("heartbeat")) for e in logs]
    assert events == [
        ("retention_stuck", "target_unreachable", False),
        ("retention_stuck", "target_unreachable", True),
        ("retention_stuck", "refused", False),
        ("retention_stuck_cleared", "refused", None),
    ]
    assert logs[1]["stuck_for_s"] == HEARTBEAT_S
    assert not tracker.states


def test_usage_growth_past_the_pending_reclaim_needs_a_cycle_at_once() -> None:
    """Growing past what pending reclaim covers makes the excess positive again: that, or the
    0.1 % move if smaller, is the threshold; a 4 KiB margin reacts to 4 KiB more."""
    used = 90 * GiB
    target_used = 80 * GiB
    pending = used - target_used + 200 * MiB
    tracker = StuckTracker()
    covered = fs_plan(used_bytes=used, excess_bytes=0, pending_reclaim_bytes=pending)
    tracker.observe(mode(BROKER), Plan((covered,), ()), 0.0)
    move = 100 * GiB // 1000  # 0.1 % of the disk caps the allowance
    assert tracker.states["/data"].grow_allowance == move
    assert not tracker.usage_moved({"/data": usage(used + move - 1)})
    assert tracker.usage_moved({"/data": usage(used + move)})

    tight = dataclasses.replace(covered, pending_reclaim_bytes=used - target_used + 4096)
    tracker.observe(mode(BROKER), Plan((tight,), ()), 1.0)
    assert not tracker.usage_moved({"/data": usage(used + 4096)})
    assert tracker.usage_moved({"/data": usage(used + 8192)})


def test_only_active_segments_left_a_meaningful_move_either_way_needs_a_cycle() -> None:
    tracker = StuckTracker()
    tracker.observe(mode(OFFLINE), Plan((fs_plan(),), ()), 0.0)
    move = max(MIN_MOVE_BYTES, 100 * GiB // 1000)
    assert not tracker.usage_moved({"/data": usage(90 * GiB + move - 1)})
    assert tracker.usage_moved({"/data": usage(90 * GiB + move)})
    assert tracker.usage_moved({"/data": usage(90 * GiB - move)})
    assert tracker.usage_moved({}), "a usage that could not be read is a change"
    assert tracker.all_stuck(["/data"]) and not tracker.all_stuck(["/data", "/other"])
    assert not tracker.all_stuck([])


def failed(
    fs: FilesystemPlan,
    ok: bool = False,
    error: str = "Read-only file system",
    lasting: bool = False,
) -> object:
    from diskguard.retention.planner import Deletion, DeletionResult

    d = Deletion(
        log_dir="/data/kafka",
        topic="orders",
        partition=0,
        base_offset=0,
        next_offset=10,
        max_timestamp_ms=0,
        bytes=GiB,
        files=("00000000000000000000.log",),
        mount=fs.mount,
    )
    return DeletionResult(d, ok, GiB if ok else 0, OFFLINE, None if ok else error, lasting=lasting)


def test_every_deletion_failing_is_stuck_until_one_succeeds() -> None:
    """A read-only log dir: the plan chooses segments every cycle and every deletion fails.
    Said once (with the error), quiet on the retries, cleared when a deletion goes through."""
    tracker = StuckTracker()
    chosen = fs_plan(chosen_count=1, chosen_bytes=GiB, unreachable_bytes=0)
    plan = Plan((chosen,), ())
    with capture_logs() as logs:
        assert tracker.observe(mode(OFFLINE), plan, 0.0) == frozenset()  # not known yet
        assert tracker.observe_results(mode(OFFLINE), plan, [failed(chosen)], 0.1) == frozenset()
        assert tracker.states["/data"].reason == "delete_failed"
        for t in range(1, 5):  # the retries: quiet before and after acting
            assert tracker.observe(mode(OFFLINE), plan, float(t)) == {"/data"}
            assert tracker.observe_results(mode(OFFLINE), plan, [failed(chosen)], t + 0.1) == {
                "/data"
            }
        assert tracker.all_stuck(["/data"])
        assert tracker.observe(mode(OFFLINE), plan, 10.0) == {"/data"}
        both = [failed(chosen), failed(chosen, ok=True)]
        assert tracker.observe_results(mode(OFFLINE), plan, both, 10.1) == frozenset()
    events = [(e["event"], e.get("reason")) for e in logs]
    assert events == [
        ("retention_stuck", "delete_failed"),
        ("retention_stuck_cleared", "delete_failed"),
    ]
    assert "Read-only file system" in logs[0]["detail"]
    assert logs[0]["log_level"] == "warning"
    assert not tracker.states


def test_failures_that_set_their_partitions_aside_are_stuck_only_the_second_time() -> None:
    """Denied by an ACL (``lasting``): the partitions are set aside and the next plan takes
    other segments, so that cycle runs at once, not after a stuck back-off. If it fails the
    same way, nothing may be deletable (no DELETE on any topic): stuck, so further partitions
    are tried at the back-off's pace, not in a burst of cycles. A success starts afresh."""
    tracker = StuckTracker()
    chosen = fs_plan(chosen_count=1, chosen_bytes=GiB, unreachable_bytes=0)
    plan = Plan((chosen,), ())
    denied = failed(chosen, error="TOPIC_AUTHORIZATION_FAILED", lasting=True)
    with capture_logs() as logs:
        assert tracker.observe_results(mode(BROKER), plan, [denied], 0.0) == frozenset()
        assert not tracker.states
        tracker.observe_results(mode(BROKER), plan, [denied, denied], 1.0)
        assert tracker.states["/data"].reason == "delete_failed"
        assert "TOPIC_AUTHORIZATION_FAILED" in tracker.states["/data"].detail
        tracker.observe_results(mode(BROKER), plan, [denied, failed(chosen, ok=True)], 2.0)
        assert not tracker.states
        # A new episode: the first all-lasting failure is again not stuck; a plain failure
        # among lasting ones is (retrying cannot help it).
        assert tracker.observe_results(mode(BROKER), plan, [denied], 3.0) == frozenset()
        assert not tracker.states
        under = fs_plan(usage_percent=70.0, excess_bytes=0, unreachable_bytes=0)
        tracker.observe(mode(BROKER), Plan((under,), ()), 4.0)  # under its limit meanwhile
        assert tracker.observe_results(mode(BROKER), plan, [denied], 5.0) == frozenset()
        tracker.observe_results(mode(BROKER), plan, [denied, failed(chosen)], 6.0)
        assert tracker.states["/data"].reason == "delete_failed"
    assert [e["event"] for e in logs] == [
        "retention_stuck",
        "retention_stuck_cleared",
        "retention_stuck",
    ]


def test_stuck_on_failed_deletions_then_refused_or_under_the_limit() -> None:
    tracker = StuckTracker()
    chosen = fs_plan(chosen_count=1, chosen_bytes=GiB, unreachable_bytes=0)
    tracker.observe_results(mode(OFFLINE), Plan((chosen,), ()), [failed(chosen)], 0.0)
    # A broker took .lock: the reason changes (logged), no retry decides it any more.
    assert tracker.observe(mode(REFUSED), Plan((chosen,), ()), 1.0) == frozenset()
    assert tracker.states["/data"].reason == "refused"
    tracker.observe_results(mode(OFFLINE), Plan((chosen,), ()), [failed(chosen)], 2.0)
    under = fs_plan(usage_percent=70.0, excess_bytes=0, unreachable_bytes=0)
    with capture_logs() as logs:
        assert tracker.observe(mode(OFFLINE), Plan((under,), ()), 3.0) == frozenset()
    assert [e["event"] for e in logs] == ["retention_stuck_cleared"]


def test_over_the_limit_by_less_than_the_rounding_is_over() -> None:
    """70.0003 % reads 70.0 in a plan, but the trigger (exact bytes) calls it over 70 %: the
    tracker must agree, or the daemon's skip check (stuck set == over set) never matches and
    a stuck filesystem in that band would run a cycle on every poll."""
    used = int(100 * GiB * 0.700003)
    covered = fs_plan(
        used_bytes=used,
        limit_percent=70.0,
        target_percent=70.0,
        excess_bytes=0,
        pending_reclaim_bytes=GiB,
        unreachable_bytes=0,
    )
    assert covered.usage_percent == 70.0
    assert stand(covered.usage, Limits(70.0, 70.0), 0).over
    assert covered.over_usage_limit
    assert stuck_reason(mode(BROKER), covered)[0] == "pending_reclaim"  # type: ignore[index]
    tracker = StuckTracker()
    tracker.observe(mode(BROKER), Plan((covered,), ()), 0.0)
    assert tracker.states["/data"].over_percent
    # Exactly at the limit is not over, for the trigger and the tracker alike.
    at = fs_plan(used_bytes=70 * GiB, limit_percent=70.0, excess_bytes=0, unreachable_bytes=0)
    assert not stand(at.usage, Limits(70.0, 70.0), 0).over
    assert stuck_reason(mode(BROKER), at) is None
