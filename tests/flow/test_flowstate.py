"""The flow-control state machine, pure: every transition, both units, the floor, no flapping."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.flow.state import (
    CLEARED_MESSAGE,
    OVERFULL_MESSAGE,
    FlowLimits,
    FlowState,
    Transition,
    step,
)
from diskguard.kafkalog.model import FilesystemUsage

GiB = 1024**3
TOTAL = 100 * GiB


def usage(used: int, total: int = TOTAL, mount: str = "/data") -> FilesystemUsage:
    """A filesystem with no root reserve: used + available == total."""
    return FilesystemUsage(mount, "/dev/x", total, used, total - used)


def pct(p: float, total: int = TOTAL) -> FilesystemUsage:
    return usage(int(total * p / 100), total)


PERCENT = FlowLimits(overfull_percent=90, underfull_percent=80, min_free_bytes=0)
BYTES = FlowLimits(overfull_bytes=90 * GiB, underfull_bytes=80 * GiB, min_free_bytes=0)


def run(limits: FlowLimits, observations: list[FilesystemUsage]) -> list[list[str]]:
    state = FlowState()
    out = []
    for obs in observations:
        state, transitions = step(state, obs, limits)
        out.append([t.event for t in transitions if t.event != "disk_alert"])
    return out


@pytest.mark.parametrize("limits", [PERCENT, BYTES], ids=["percent", "bytes"])
def test_enter_at_overfull_leave_below_underfull(limits: FlowLimits) -> None:
    events = run(limits, [pct(50), pct(89.9), pct(90), pct(95), pct(85), pct(80), pct(79.9)])
    assert events == [[], [], ["overfull"], [], [], [], ["overfull_cleared"]]


@pytest.mark.parametrize("limits", [PERCENT, BYTES], ids=["percent", "bytes"])
def test_band_between_limits_holds_either_state(limits: FlowLimits) -> None:
    # Rising into the band: still normal. Falling into it from overfull: still overfull.
    assert run(limits, [pct(85), pct(89), pct(81)]) == [[], [], []]
    assert run(limits, [pct(91), pct(85), pct(89.99), pct(80.5)]) == [["overfull"], [], [], []]


def test_overfull_event_fields_and_message() -> None:
    state, transitions = step(FlowState(overfull=False, alert_level=0), pct(92), PERCENT)
    assert state == FlowState(overfull=True, alert_level=2)
    over = transitions[0]
    assert over.event == "overfull"
    assert over.message == OVERFULL_MESSAGE == "store overfull, flow control will be enforced"
    fields = over.fields()
    assert fields["mount"] == "/data"
    assert fields["usage_percent"] == pytest.approx(92, abs=0.01)
    assert fields["free_bytes"] == TOTAL - int(TOTAL * 0.92)
    assert fields["limit"] == "overfull_percent=90%"
    state, transitions = step(state, pct(10), PERCENT)
    cleared = transitions[0]
    assert cleared.event == "overfull_cleared"
    assert cleared.message == CLEARED_MESSAGE == "store overfull condition cleared"
    assert "underfull_percent=80%" in cleared.fields()["limit"]


def test_either_unit_enters_and_every_unit_must_clear() -> None:
    both = FlowLimits(
        overfull_percent=90,
        underfull_percent=80,
        overfull_bytes=50 * GiB,
        underfull_bytes=40 * GiB,
        min_free_bytes=0,
    )
    # Bytes limit is the lower one here: 50 GiB used = 50% enters on bytes alone.
    assert run(both, [usage(49 * GiB), usage(50 * GiB)]) == [[], ["overfull"]]
    # 45 GiB is under 80% but not under 40 GiB: still overfull; 39 GiB clears.
    assert run(both, [usage(60 * GiB), usage(45 * GiB), usage(39 * GiB)]) == [
        ["overfull"],
        [],
        ["overfull_cleared"],
    ]


def test_min_free_floor_blocks_even_under_the_percent_limit() -> None:
    limits = FlowLimits(overfull_percent=99, underfull_percent=98, min_free_bytes=5 * GiB)
    state, transitions = step(FlowState(), usage(TOTAL - 4 * GiB), limits)  # 96%, 4 GiB free
    assert state.overfull is True
    assert transitions[0].fields()["limit"] == f"min_free_bytes={5 * GiB}"
    # Usage under underfull is not enough while free is still under the floor.
    tight = FlowLimits(overfull_percent=99, underfull_percent=98, min_free_bytes=5 * GiB)
    state2, t2 = step(FlowState(overfull=True, alert_level=2), usage(TOTAL - 4 * GiB), tight)
    assert state2.overfull is True and not [t for t in t2 if t.event == "overfull_cleared"]
    _state3, t3 = step(state2, usage(TOTAL - 6 * GiB), tight)
    assert next(t.event for t in t3) == "overfull_cleared"


def test_floor_alone_without_percent_or_byte_limits() -> None:
    limits = FlowLimits(min_free_bytes=GiB)
    assert run(limits, [usage(TOTAL - 2 * GiB), usage(TOTAL - GiB // 2), usage(TOTAL - GiB)]) == [
        [],
        ["overfull"],
        ["overfull_cleared"],
    ]


def test_startup_reports_an_already_overfull_disk_and_is_silent_when_healthy() -> None:
    _, transitions = step(FlowState(), pct(95), PERCENT)
    assert [t.event for t in transitions] == ["overfull", "disk_alert"]
    assert transitions[1].level == 2 and transitions[1].previous_level is None
    state, transitions = step(FlowState(), pct(10), PERCENT)
    assert transitions == [] and state == FlowState(overfull=False, alert_level=0)
    # Starting inside the band: not known to be overfull, so normal and silent.
    state, transitions = step(FlowState(), pct(85), PERCENT)
    assert transitions == [] and state.overfull is False


def test_alert_levels_follow_redpanda() -> None:
    limits = FlowLimits(
        overfull_percent=90,
        underfull_percent=80,
        min_free_bytes=0,
        low_space_percent=70,
        low_space_bytes=20 * GiB,
    )
    state = FlowState()
    seen = []
    for obs in [pct(50), pct(70), pct(75), pct(79.5), pct(90), pct(85), pct(79), pct(60)]:
        state, transitions = step(state, obs, limits)
        seen.append([(t.level, t.previous_level) for t in transitions if t.event == "disk_alert"])
    assert seen == [
        [],  # healthy at start: silent
        [(1, 0)],  # usage >= low_space_percent
        [],
        [],
        [(2, 1)],  # overfull = degraded
        [],  # still overfull inside the band
        [(1, 2)],  # cleared, but still low on space
        [(0, 1)],
    ]
    # low_space_bytes alone (free < 20 GiB) gives level 1 even under the percent.
    bytes_only = FlowLimits(min_free_bytes=0, low_space_bytes=20 * GiB)
    state, transitions = step(FlowState(), usage(TOTAL - 19 * GiB), bytes_only)
    assert state.alert_level == 1 and transitions[0].fields()["alert_level"] == 1


def test_inverted_band_is_rejected() -> None:
    with pytest.raises(ValueError, match="underfull_percent"):
        FlowLimits(overfull_percent=80, underfull_percent=80)
    with pytest.raises(ValueError, match="set together"):
        FlowLimits(overfull_bytes=10)


def test_would_be_overfull_after_is_the_ballast_precheck() -> None:
    limits = FlowLimits(overfull_percent=90, underfull_percent=80, min_free_bytes=5 * GiB)
    assert limits.would_be_overfull_after(pct(80), 5 * GiB) == []
    assert limits.would_be_overfull_after(pct(80), 10 * GiB) == ["overfull_percent=90%"]
    assert limits.would_be_overfull_after(usage(TOTAL - 6 * GiB), 2 * GiB) == [
        "overfull_percent=90%",
        f"min_free_bytes={5 * GiB}",
    ]


@settings(max_examples=300, deadline=None)
@given(
    seq=st.lists(st.integers(min_value=0, max_value=TOTAL), min_size=1, max_size=60),
    over=st.integers(min_value=2, max_value=100),
    gap=st.integers(min_value=1, max_value=30),
    floor=st.integers(min_value=0, max_value=10 * GiB),
    use_bytes=st.booleans(),
)
def test_events_strictly_alternate(
    seq: list[int], over: int, gap: int, floor: int, use_bytes: bool
) -> None:
    under = max(1, over - gap)
    if under >= over:
        under = over - 1
    if use_bytes:
        limits = FlowLimits(
            overfull_bytes=TOTAL * over // 100,
            underfull_bytes=TOTAL * under // 100,
            min_free_bytes=floor,
        )
    else:
        limits = FlowLimits(overfull_percent=over, underfull_percent=under, min_free_bytes=floor)
    state = FlowState()
    events: list[Transition] = []
    for used in seq:
        obs = usage(used)
        before = state.overfull
        state, transitions = step(state, obs, limits)
        flow = [t for t in transitions if t.event != "disk_alert"]
        events.extend(flow)
        assert len(flow) <= 1
        # The state reported matches the events: a change of state always says so.
        if flow:
            assert state.overfull == (flow[0].event == "overfull")
        else:
            assert bool(before) == bool(state.overfull)
        # Level 2 exactly while overfull.
        assert (state.alert_level == 2) == bool(state.overfull)
        # In the band (between the limits, floor satisfied) the state never changes.
        in_band = (
            not limits.is_overfull(obs) and not limits.is_underfull(obs) and before is not None
        )
        if in_band:
            assert state.overfull == before
    names = [t.event for t in events]
    for a, b in itertools.pairwise(names):
        assert a != b, names
    if names:
        assert names[0] == "overfull"


def test_well_under_every_limit_by_a_margin() -> None:
    """Quiet needs room: a margin more written must cross no overfull or low-space limit."""
    GiB = 1024**3
    usage = FilesystemUsage("/d", "/dev/x", 100 * GiB, 60 * GiB, 40 * GiB)
    limits = FlowLimits(overfull_percent=62.0, underfull_percent=55.0)
    assert limits.well_under(usage, 1 * GiB)
    assert not limits.well_under(usage, 2 * GiB)  # 62 % with 2 GiB more
    assert not FlowLimits(low_space_percent=61.0).well_under(usage, 1 * GiB)
    assert not FlowLimits(low_space_bytes=40 * GiB).well_under(usage, 1)
    assert not FlowLimits(min_free_bytes=39 * GiB + 1).well_under(usage, 1 * GiB)
    assert FlowLimits().well_under(usage, 30 * GiB)
    # A margin that fills the disk: not well under, even with no limit that says so.
    assert not FlowLimits().well_under(usage, 40 * GiB)
    assert not FlowLimits(overfull_bytes=200 * GiB, underfull_bytes=150 * GiB).well_under(
        usage, 41 * GiB
    )
