"""The daemon's decisions on fake time: no thread, no sleep, no disk. ``tick`` is fed what an
iteration saw and says what to do; these drive it through the loop's situations."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from diskguard.daemon.schedule import (
    HINT_PACE_S,
    QUIET_POLL_S,
    QUIET_RESCAN_MAX_S,
    QUIET_RESCAN_S,
    RESCAN_SHARE,
    STATE_EVERY_S,
    Action,
    Schedule,
    Seen,
    Settings,
    pace_s,
    tick,
    wait_s,
)

A = Action
SETTINGS = Settings(check_interval_s=10.0, snapshot_interval_s=60.0, poll_s=0.5)


class Loop:
    """The loop's memory between ticks, on a clock the test moves."""

    def __init__(self, settings: Settings = SETTINGS) -> None:
        self.settings = settings
        self.schedule = Schedule.first(settings)
        self.now = 0.0

    def tick(self, at: float | None = None, **seen: float) -> list[Action]:
        """The actions of one iteration but the state write (``test_the_state_is_written...``)."""
        return [a for a in self.actions(at, **seen) if a is not A.WRITE_STATE]

    def actions(self, at: float | None = None, **seen: float) -> list[Action]:
        if at is not None:
            self.now = at
        self.schedule, actions = tick(self.schedule, self.settings, Seen(now=self.now, **seen))
        return actions

    def started(self) -> None:
        """Past start-up: the first snapshot cycle ran and finished."""
        assert self.tick(0.0) == [A.SNAPSHOT]
        assert self.tick(1.0, finished=True) == [
            A.RECORD_SNAPSHOT,
            A.RECONCILE,
            A.ANNOUNCE_STARTED,
        ]


def test_start_up_is_a_snapshot_cycle_then_the_announcement() -> None:
    loop = Loop()
    assert loop.tick(0.0) == [A.SNAPSHOT]
    assert loop.schedule.running is A.SNAPSHOT
    # While it runs nothing else starts, whatever is seen; the wait is the usage poll.
    assert loop.tick(0.5, over=True) == []
    assert wait_s(loop.schedule, SETTINGS, 0.5) == SETTINGS.poll_s
    assert loop.tick(1.0, finished=True) == [
        A.RECORD_SNAPSHOT,
        A.RECONCILE,
        A.ANNOUNCE_STARTED,
    ]
    # The rescan is due a check interval after the cycle ended, the snapshot an interval on.
    assert (loop.schedule.next_full, loop.schedule.next_snapshot) == (11.0, 61.0)
    assert wait_s(loop.schedule, SETTINGS, 1.0) == SETTINGS.poll_s
    assert loop.tick(2.0, finished=True) == []  # announced once only
    assert loop.schedule.started


def test_the_periodic_rescan_runs_at_its_interval_and_not_before() -> None:
    loop = Loop()
    loop.started()
    assert loop.tick(10.9) == []
    assert loop.tick(11.0) == [A.CYCLE]
    assert loop.tick(11.5, finished=True) == [A.RECONCILE]
    assert loop.schedule.next_full == 21.5


def test_while_quiet_the_periodic_cycle_becomes_a_consistency_rescan() -> None:
    loop = Loop(replace(SETTINGS, snapshot_interval_s=1000.0))
    loop.started()  # the first scan ended at 1.0
    cycles = []
    t = 1.0
    while t < 200.0:
        t = round(t + 0.5, 1)
        actions = loop.tick(t, quiet=True)
        assert A.CYCLE not in actions
        if A.RESCAN in actions:
            cycles.append(t)
            loop.tick(t, finished=True)
    # One rescan a QUIET_RESCAN_S (from the end of the last scan), not one an interval.
    assert cycles == [1.0 + QUIET_RESCAN_S, 1.0 + 2 * QUIET_RESCAN_S, 1.0 + 3 * QUIET_RESCAN_S]
    # Between two, the loop sleeps: never a busy wait on an overdue timer; while quiet the
    # usage poll slows down, and speeds up again as soon as it is not.
    assert wait_s(loop.schedule, loop.settings, t) == QUIET_POLL_S
    loop.tick(t + 0.5)
    assert wait_s(loop.schedule, loop.settings, t + 0.5) == SETTINGS.poll_s
    # Never slower than the watchdog needs, nor faster than the config's own poll.
    assert replace(SETTINGS, watchdog_s=1.0).quiet_poll_every_s == 0.5
    assert replace(SETTINGS, poll_s=2.0).quiet_poll_every_s == 2.0


def test_the_consistency_rescan_is_rarer_the_more_it_costs_within_its_bounds() -> None:
    settings = SETTINGS
    assert settings.rescan_interval(0.0) == QUIET_RESCAN_S
    assert settings.rescan_interval(0.1) == pytest.approx(0.1 / RESCAN_SHARE)
    assert settings.rescan_interval(60.0) == QUIET_RESCAN_MAX_S
    # A check_interval longer than either bound is the interval.
    assert replace(settings, check_interval_s=900.0).rescan_interval(0.0) == 900.0
    assert replace(settings, check_interval_s=900.0).rescan_interval(60.0) == 900.0
    # Driven: each check's CPU time sets the time to the next; a costly one (a huge log
    # dir, a loaded machine) waits QUIET_RESCAN_MAX_S at most.
    loop = Loop(replace(SETTINGS, snapshot_interval_s=10_000.0))
    loop.started()
    gaps = []
    last, t = 1.0, 1.0
    for cost in (0.15, 0.15, 10.0, 10.0, 0.0):
        while A.RESCAN not in loop.tick(t, quiet=True):
            t = round(t + 0.5, 1)
        gaps.append(t - last)
        loop.tick(t, finished=True, cycle_cpu_s=cost)
        last = t
    assert gaps == [QUIET_RESCAN_S, 150.0, 150.0, QUIET_RESCAN_MAX_S, QUIET_RESCAN_MAX_S]


def test_while_quiet_snapshots_take_the_hints_word_but_the_rescan_takes_nothing_on_trust() -> None:
    loop = Loop()  # snapshots every 60 s
    loop.started()
    started: list[tuple[float, Action]] = []
    last_check = 1.0
    t = 1.0
    while t < 2000.0:
        t = round(t + 0.5, 1)
        actions = [a for a in loop.tick(t, quiet=True) if a not in (A.RECONCILE,)]
        if not actions:
            continue
        (action,) = actions
        started.append((t, action))
        checking = action in (A.SNAPSHOT, A.RESCAN)
        t = round(t + 0.5, 1)
        # Each check costs 0.25 s of CPU: a check every 250 s.
        loop.tick(t, finished=True, cycle_cpu_s=0.25 if checking else 0.05)
        if checking:
            # Never more than the interval after the last check ended.
            assert t - last_check <= 250.0 + 0.5
            last_check = t
    kinds = [a for _t, a in started]
    # Every snapshot on its timer; the last before the check is due is the check itself.
    assert set(kinds) == {A.HINTED_SNAPSHOT, A.SNAPSHOT}
    assert len(kinds) == pytest.approx(2000 / 60, abs=1)
    checks = [t for t, a in started if a is A.SNAPSHOT]
    assert all(200.0 <= b - a <= 250.0 for a, b in itertools.pairwise(checks))


def test_a_snapshot_is_checked_unless_quiet() -> None:
    loop = Loop()
    assert loop.tick(0.0) == [A.SNAPSHOT]
    # The first scan, cold, is no measure of a check: the next comes soon.
    loop.tick(1.0, finished=True, cycle_cpu_s=5.0)
    assert loop.schedule.next_rescan == 1.0 + QUIET_RESCAN_S
    assert loop.tick(61.0, quiet=True) == [A.SNAPSHOT]
    loop.tick(62.0, finished=True, cycle_cpu_s=0.2)  # the next check 200 s on
    assert loop.tick(122.0, quiet=True) == [A.HINTED_SNAPSHOT]
    loop.tick(122.5, finished=True, cycle_cpu_s=0.01)
    # The hinted snapshot is no check: the rescan is still due 200 s after the last check.
    assert loop.schedule.next_rescan == 262.0
    assert loop.tick(182.5) == [A.SNAPSHOT]  # something changed: no trust
    loop.tick(183.0, finished=True, cycle_cpu_s=0.2)
    assert loop.schedule.next_rescan == 383.0


def test_quiet_ending_brings_the_periodic_cycle_back_within_an_interval() -> None:
    loop = Loop(replace(SETTINGS, snapshot_interval_s=1000.0))
    loop.started()
    assert loop.tick(11.0, quiet=True) == []  # skipped; looked at again at 21.0
    assert loop.tick(15.0) == []  # a partition dir changed: not quiet, but not due either
    assert loop.tick(21.0) == [A.CYCLE]


def test_quiet_never_holds_back_a_cycle_that_may_act() -> None:
    loop = Loop(replace(SETTINGS, snapshot_interval_s=1000.0))
    loop.started()
    assert loop.tick(11.0, quiet=True) == []
    # Over a limit (or predicted to be): a cycle at once, whatever "quiet" said; a stuck
    # filesystem whose state may have changed too, and a byte budget's check on a hint.
    assert loop.tick(12.0, quiet=True, over=True) == [A.CYCLE]
    loop.tick(12.5, finished=True)
    assert loop.tick(13.0, quiet=True, stuck=True) == [A.CYCLE]
    loop.tick(13.5, finished=True)
    assert loop.tick(14.0, quiet=True, hinted=True, byte_budget=True) == [A.CYCLE]


def test_a_snapshot_or_a_reload_is_a_rescan_too() -> None:
    loop = Loop(replace(SETTINGS, snapshot_interval_s=100.0))
    loop.started()
    assert loop.tick(1.0 + QUIET_RESCAN_S, quiet=True) == [A.RESCAN]
    loop.tick(1.0 + QUIET_RESCAN_S, finished=True)
    assert loop.tick(101.0, quiet=True) == [A.SNAPSHOT]  # due at 1.0 + 100
    loop.tick(101.5, finished=True)
    # The snapshot's full scan counts as the rescan: the next is QUIET_RESCAN_S after it.
    assert loop.tick(2 * QUIET_RESCAN_S + 1.0, quiet=True) == []
    assert loop.tick(101.5 + QUIET_RESCAN_S, quiet=True) == [A.RESCAN]
    loop.tick(170.0, finished=True)
    # A reload: everything a plan reads may have changed; a cycle at once, quiet or not.
    assert loop.tick(175.0, quiet=True, reload=True) == [A.RELOAD, A.RESCAN]
    loop.tick(176.0, finished=True)
    assert loop.tick(180.0, reload=True) == [A.RELOAD, A.CYCLE]


def test_quiet_with_snapshots_every_rescan_interval_is_one_cycle_an_interval() -> None:
    loop = Loop(replace(SETTINGS, snapshot_interval_s=QUIET_RESCAN_S))
    loop.started()
    started = []
    t = 1.0
    while t < 400.0:
        t = round(t + 0.5, 1)
        actions = loop.tick(t, quiet=True)
        started += [(t, a) for a in actions if a in (A.CYCLE, A.SNAPSHOT)]
        if started and started[-1][0] == t:
            loop.tick(t + 0.5, finished=True)
            t += 0.5
    # The snapshot is the rescan: no extra cycle just before each.
    assert [a for _t, a in started] == [A.SNAPSHOT] * len(started)
    assert len(started) == 6


def test_over_the_limit_starts_a_cycle_at_once_one_at_a_time() -> None:
    loop = Loop()
    loop.started()
    assert loop.tick(2.0, over=True) == [A.CYCLE]
    assert loop.tick(2.1, over=True) == []  # one cycle at a time
    assert loop.tick(2.4, over=True, finished=True) == [A.RECONCILE, A.CYCLE]
    # Stuck, and nothing a plan reads changed: no cycle until the periodic rescan.
    loop.tick(2.6, finished=True)
    assert loop.tick(3.0, over=True, stuck=True, unchanged=True) == []
    # A filesystem of a stuck set going back under is a change: a cycle clears it.
    assert loop.tick(3.5, stuck=True) == [A.CYCLE]


def test_the_rescan_backs_off_while_stuck_and_unchanged_and_resets_on_change() -> None:
    loop = Loop(replace(SETTINGS, snapshot_interval_s=1000.0))
    loop.started()
    now = loop.schedule.next_full
    intervals = []
    for _ in range(5):
        stuck = {"over": True, "stuck": True, "unchanged": True, "all_stuck": True}
        assert loop.tick(now, **stuck) == [A.CYCLE]
        loop.tick(now, finished=True)
        intervals.append(loop.schedule.next_full - now)
        now = loop.schedule.next_full
    assert intervals == [20.0, 40.0, 60.0, 60.0, 60.0]  # doubled up to MAX_BACKOFF_S
    # Something changed: the next cycle runs at once and the interval is back to the base.
    assert loop.tick(now - 30.0, over=True, stuck=True) == [A.CYCLE]
    loop.tick(now - 29.0, finished=True)
    assert loop.schedule.next_full - loop.now == SETTINGS.check_interval_s


def test_a_snapshot_is_due_on_its_timer_or_a_transition_and_waits_for_a_running_cycle() -> None:
    loop = Loop()
    loop.started()
    assert loop.tick(5.0, over=True) == [A.CYCLE]
    # A flow transition while that cycle runs: the snapshot waits, the state is written now.
    assert loop.tick(5.5, transitions=True) == []
    assert loop.tick(6.0, finished=True) == [A.RECONCILE, A.SNAPSHOT]
    assert loop.tick(7.0, finished=True) == [A.RECORD_SNAPSHOT, A.RECONCILE]
    assert loop.schedule.next_snapshot == 67.0
    assert loop.tick(67.0) == [A.SNAPSHOT]


def test_a_reload_waits_for_the_running_cycle_then_a_cycle_runs_at_once() -> None:
    loop = Loop()
    loop.started()
    assert loop.tick(3.0, over=True) == [A.CYCLE]
    assert loop.tick(3.2, reload=True) == []
    assert loop.tick(3.6, finished=True) == [A.RECONCILE, A.RELOAD, A.CYCLE]


def test_a_byte_budget_is_checked_on_hints_at_most_once_a_second() -> None:
    loop = Loop()
    loop.started()
    budget = {"hinted": True, "byte_budget": True}
    assert loop.tick(2.0, **budget) == [A.CYCLE]
    loop.tick(2.1, finished=True)
    assert loop.tick(2.5, **budget) == []
    assert loop.tick(3.0, **budget) == [A.CYCLE]
    loop.tick(3.1, finished=True)
    assert loop.tick(4.5, hinted=True) == []  # no budget: a hint alone is no reason
    assert loop.tick(4.6, hinted=True, byte_budget=True, unchanged=True) == []


def test_the_state_is_written_every_few_seconds_and_the_watchdog_pinged() -> None:
    loop = Loop(replace(SETTINGS, watchdog_s=3.0))
    assert wait_s(loop.schedule, loop.settings, 0.0) == 0.0  # the first snapshot: now
    assert loop.actions(0.0) == [A.SNAPSHOT, A.WRITE_STATE, A.WATCHDOG]
    loop.tick(0.5, finished=True)
    writes, pings = [], []
    t = 0.5
    while t < 20.0:
        t = round(t + 0.5, 1)
        actions = loop.actions(t)
        if A.WRITE_STATE in actions:
            writes.append(t)
        if A.WATCHDOG in actions:
            pings.append(t)
        assert A.CYCLE not in actions or t >= 10.5
        if A.CYCLE in actions:
            loop.tick(t, finished=True)
    assert all(b - a <= STATE_EVERY_S + 0.5 for a, b in itertools.pairwise(writes))
    assert all(b - a <= 1.0 + 0.5 for a, b in itertools.pairwise(pings))  # every 3/3 s
    # The poll comes often enough for the watchdog.
    assert loop.settings.poll_every_s == 0.5
    assert replace(loop.settings, poll_s=10.0).poll_every_s == 1.5


def test_hints_are_paced() -> None:
    loop = Loop()
    loop.tick(100.0)
    assert pace_s(loop.schedule, 100.0) == HINT_PACE_S
    assert pace_s(loop.schedule, 100.0 + HINT_PACE_S / 2) == pytest.approx(HINT_PACE_S / 2)
    assert pace_s(loop.schedule, 101.0) == 0.0
