"""What the daemon does next, decided from what it just saw. Pure: no clock, no I/O.

The loop (``loop``) wakes on a hint, a signal or a timer, reads what the world says (usage,
whether a filesystem is over its limit, stuck, unchanged, whether the last retention cycle
finished) and asks ``tick`` what to do; it then carries the actions out through the
components that own their state. All times are the caller's monotonic clock, so the tests
drive it with plain numbers, and wall-clock jumps never stall or rush it.

Three clocks, as the loop has always had:

- a hint or the usage poll (``poll_s``) notices a crossing within a fraction of a second:
  flow control steps at once (the loop does that every iteration, whatever ``tick`` says)
  and a retention cycle starts when a filesystem is over its ceiling;
- ``check_interval`` runs a retention cycle regardless (the rescan is the truth), backed off
  while every filesystem over its limit is stuck and nothing changed, and skipped while the
  daemon is *quiet* (no partition dir changed since the last scan, every dir watched, every
  filesystem well under its limits and their forecast): then the rescan is a consistency
  check (``RESCAN``: a full scan that takes nothing on trust), not each interval's work. Its
  interval grows with what the last check cost (``rescan_interval``: from ``QUIET_RESCAN_S``
  to ``QUIET_RESCAN_MAX_S``, so that it stays near ``RESCAN_SHARE`` of a core), which bounds
  how long a change inotify never reported can go unseen. A cycle that may act never
  depends on it: over a limit (or predicted to be) a cycle starts at once, and every cycle
  but the quiet snapshot's lists the log dirs afresh;
- ``snapshot_interval`` (and every flow/alert transition) runs a full scan for the usage
  snapshot; while quiet, one that takes the hints' word for every partition dir no event
  touched (``HINTED_SNAPSHOT``: appends are events, so a growing segment is read again).

One retention cycle at a time runs beside the loop (``CYCLE``/``SNAPSHOT``): what it waits
for (a hung broker) never holds up flow control or a stop. A snapshot or a reload wanted
while one runs waits for it to finish.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

#: The shortest time between two iterations woken by hints (seconds): a crossing is still
#: noticed within this much of the write that made it, and a stream of appends costs at most
#: 1 / HINT_PACE_S iterations a second.
HINT_PACE_S = 0.02
#: state.json is rewritten at least this often (seconds): ``plan``, ``enforce`` and
#: ``status`` read the measured growth rate and reclaim latency from it.
STATE_EVERY_S = 5.0
#: A byte budget (``retention.max_bytes``) needs a stat of every file to check: on a hint,
#: but at most this often, or a busy broker's stream of inotify events would keep it
#: scanning.
BUDGET_CHECK_EVERY_S = 1.0
#: While quiet, the periodic rescan runs at least this far apart (seconds; at least
#: ``check_interval``): the consistency check of what the hints said (inotify can drop
#: events), rebuilding the model of the log dirs and asking the broker what only it knows
#: (its log dirs' state).
QUIET_RESCAN_S = 60.0
#: ... and at most this far apart (or ``check_interval``, if longer): the longest a change
#: the hints never reported goes unseen while quiet. Kafka's own retention check runs every
#: 300 s by default.
QUIET_RESCAN_MAX_S = 300.0
#: While quiet, the usage poll runs at most this often (seconds; ``usage_poll_interval`` if
#: longer), and appends and the broker's checkpoints alone wake the loop no earlier: every
#: filesystem then keeps ``limits.quiet_margin_bytes`` below every limit beyond the growth
#: forecast (1 % of it, or the fastest growth seen lately over a poll and a cycle), and
#: whatever else changes (a roll, a deletion, a partition made) still wakes it at once.
QUIET_POLL_S = 1.0
#: The share of one core the consistency rescan may take while quiet: the interval is its
#: last CPU time divided by this, within the two bounds above (0.25 s of CPU: 250 s).
RESCAN_SHARE = 0.001


class Action(enum.Enum):
    """What ``tick`` asks the loop to do, in the order given."""

    #: Reload the config (SIGHUP), now that no cycle runs.
    RELOAD = "reload"
    #: Start a retention cycle beside the loop.
    CYCLE = "cycle"
    #: Start a retention cycle with a full scan, for the usage snapshot.
    SNAPSHOT = "snapshot"
    #: The same while quiet, the consistency rescan not due: its scan takes the hints' word
    #: for the partition dirs no event touched since the last full scan.
    HINTED_SNAPSHOT = "hinted_snapshot"
    #: Start the consistency rescan while quiet: a retention cycle with a full scan that
    #: takes nothing on trust, no snapshot recorded.
    RESCAN = "rescan"
    #: The snapshot cycle finished: record the usage snapshots.
    RECORD_SNAPSHOT = "record_snapshot"
    #: The first cycle (a snapshot) finished: the daemon is up (``daemon_started``, READY=1).
    ANNOUNCE_STARTED = "announce_started"
    #: A cycle finished: topics come and go, so re-apply the actuators' view and the ballast.
    RECONCILE = "reconcile"
    #: Rewrite ``state.json`` (and the unit's status line).
    WRITE_STATE = "write_state"
    #: Tell systemd the loop is alive.
    WATCHDOG = "watchdog"


@dataclass(frozen=True)
class Settings:
    """The config's intervals (seconds). ``watchdog_s``: systemd's ``WatchdogSec`` or None."""

    check_interval_s: float
    snapshot_interval_s: float
    poll_s: float
    watchdog_s: float | None = None
    max_backoff_s: float = 60.0

    @property
    def quiet_rescan_s(self) -> float:
        """The shortest interval of the consistency rescan while quiet (``QUIET_RESCAN_S``)."""
        return max(self.check_interval_s, QUIET_RESCAN_S)

    def rescan_interval(self, cost_s: float) -> float:
        """The consistency rescan's interval after a check that took ``cost_s`` of CPU:
        ``RESCAN_SHARE`` of a core, bounded (``QUIET_RESCAN_S`` ... ``QUIET_RESCAN_MAX_S``).
        A large log dir is checked less often rather than costing more, never past the
        bound."""
        longest = max(self.quiet_rescan_s, QUIET_RESCAN_MAX_S, self.check_interval_s)
        return min(longest, max(self.quiet_rescan_s, cost_s / RESCAN_SHARE))

    @property
    def poll_every_s(self) -> float:
        """The usage poll, often enough for the watchdog too."""
        if self.watchdog_s:
            return min(self.poll_s, self.watchdog_s / 2)
        return self.poll_s

    @property
    def quiet_poll_every_s(self) -> float:
        """The usage poll while quiet (``QUIET_POLL_S``), often enough for the watchdog."""
        poll = max(self.poll_s, QUIET_POLL_S)
        if self.watchdog_s:
            return min(poll, self.watchdog_s / 2)
        return poll


@dataclass(frozen=True)
class Seen:
    """What one iteration saw. ``finished``: the cycle under way ended since the last
    iteration (its outcome already taken in). The retention facts (``over`` ... ``all_stuck``)
    are read only while no cycle runs (the cycle owns them while it does); ``hinted``: woken
    by an inotify hint rather than a timer."""

    now: float
    hinted: bool = False
    reload: bool = False
    finished: bool = False
    transitions: bool = False
    #: Some filesystem is over its limit now (usage or the broker-mode forecast), or could
    #: not be measured.
    over: bool = False
    #: Some filesystem is stuck over its limit (``retention.stuck``).
    stuck: bool = False
    #: Every filesystem over its limit is stuck and nothing a plan reads changed since.
    unchanged: bool = False
    #: Every filesystem over its usage ceiling is known stuck (the back-off may grow).
    all_stuck: bool = False
    #: ``retention.max_bytes`` is set.
    byte_budget: bool = False
    #: The CPU time (seconds) of the cycle that finished (``finished``).
    cycle_cpu_s: float = 0.0
    #: Nothing a plan reads changed since the last cycle's scan as far as the hints can tell
    #: (every dir watched, no partition dir changed), and every filesystem is well under its
    #: limits and their forecast, with nothing pending, stuck or in flight: the periodic
    #: cycle would repeat the last one.
    quiet: bool = False


@dataclass(frozen=True)
class Schedule:
    """The loop's timers and what runs: all the loop remembers between iterations."""

    next_full: float = 0.0
    next_snapshot: float = 0.0
    next_state_write: float = 0.0
    next_watchdog: float = 0.0
    next_budget_check: float = 0.0
    #: The next periodic rescan while quiet (the end of a cycle of any kind resets it).
    next_rescan: float = 0.0
    last_iteration: float = float("-inf")
    #: The rescan interval now (``check_interval``, doubled while stuck and unchanged).
    backoff_s: float = 0.0
    #: What runs beside the loop: None, ``Action.CYCLE`` or ``Action.SNAPSHOT``.
    running: Action | None = None
    #: The rescan interval to apply once the cycle under way ends.
    next_backoff_s: float = 0.0
    #: The consistency rescan's interval now (``Settings.rescan_interval``).
    rescan_s: float = QUIET_RESCAN_S
    #: The cycle under way is a full scan that takes nothing on trust: its end restarts the
    #: consistency rescan's timer.
    checking: bool = False
    snapshot_wanted: bool = False
    reload_wanted: bool = False
    started: bool = False
    #: The last iteration found the daemon quiet (``Seen.quiet``): the poll slows down.
    quiet: bool = False

    @classmethod
    def first(cls, settings: Settings) -> Schedule:
        """Before the first iteration: a snapshot cycle at once (the first full scan)."""
        return cls(
            backoff_s=settings.check_interval_s,
            snapshot_wanted=True,
            rescan_s=settings.quiet_rescan_s,
        )


def wait_s(schedule: Schedule, settings: Settings, now: float) -> float:
    """How long the loop may sleep before something is due (a hint may wake it earlier)."""
    due = [settings.quiet_poll_every_s if schedule.quiet else settings.poll_every_s]
    if schedule.running is None:
        due += [schedule.next_full - now, schedule.next_snapshot - now]
    return max(0.0, min(due))


def pace_s(schedule: Schedule, now: float) -> float:
    """Woken by a hint: how long to wait first, so that a broker's stream of appends (one
    hint each) costs at most one iteration per ``HINT_PACE_S``; hints arriving meanwhile are
    handled by the same iteration."""
    return max(0.0, HINT_PACE_S - (now - schedule.last_iteration))


def tick(schedule: Schedule, settings: Settings, seen: Seen) -> tuple[Schedule, list[Action]]:
    """One iteration's decision: the next ``Schedule`` and the actions to carry out."""
    now = seen.now
    s = replace(schedule, last_iteration=now, quiet=seen.quiet)
    actions: list[Action] = []
    if seen.reload:
        s = replace(s, reload_wanted=True)
    if seen.finished and s.running is not None:
        first = not s.started
        if s.running is Action.SNAPSHOT:
            actions.append(Action.RECORD_SNAPSHOT)
            s = replace(s, next_snapshot=now + settings.snapshot_interval_s)
        actions.append(Action.RECONCILE)
        if not s.started:
            actions.append(Action.ANNOUNCE_STARTED)
            s = replace(s, started=True)
        s = replace(
            s,
            running=None,
            backoff_s=s.next_backoff_s,
            next_full=now + s.next_backoff_s,
        )
        if s.checking:
            # Like the snapshot's, from the end of the scan: the rescan and a snapshot due
            # together are one cycle (the snapshot's), not two. The first scan lists every
            # dir cold (and learns the topics' policies): its cost says nothing of a check's.
            cost_s = 0.0 if first else seen.cycle_cpu_s
            rescan_s = settings.rescan_interval(cost_s)
            s = replace(s, checking=False, rescan_s=rescan_s, next_rescan=now + rescan_s)
    if (now >= s.next_snapshot and s.running is not Action.SNAPSHOT) or seen.transitions:
        s = replace(s, snapshot_wanted=True)
    if s.running is None:
        s, started = _start(s, settings, seen)
        actions += started
    if seen.finished or seen.transitions or now >= s.next_state_write:
        actions.append(Action.WRITE_STATE)
        s = replace(s, next_state_write=now + STATE_EVERY_S)
    if settings.watchdog_s and now >= s.next_watchdog:
        # Pinged from the loop itself: a stuck loop stops pinging and systemd restarts it.
        actions.append(Action.WATCHDOG)
        s = replace(s, next_watchdog=now + settings.watchdog_s / 3)
    return s, actions


def _start(s: Schedule, settings: Settings, seen: Seen) -> tuple[Schedule, list[Action]]:
    """No cycle runs: reload if asked, then start the snapshot or retention cycle now due."""
    now = seen.now
    actions: list[Action] = []
    if s.reload_wanted:
        # A new config: everything a plan reads may have changed, so a cycle runs at once.
        actions.append(Action.RELOAD)
        s = replace(
            s,
            reload_wanted=False,
            next_full=now,
            next_rescan=now,
            backoff_s=settings.check_interval_s,
        )
    backoff = _backoff(s, settings, seen)
    rescan_due = now >= s.next_rescan
    if s.snapshot_wanted:
        # While quiet the snapshot takes the hints' word, but for the last one before the
        # consistency rescan is due: that one is the rescan (one full scan, not two).
        hinted = seen.quiet and now + settings.snapshot_interval_s < s.next_rescan
        actions.append(Action.HINTED_SNAPSHOT if hinted else Action.SNAPSHOT)
        s = replace(
            s,
            running=Action.SNAPSHOT,
            checking=not hinted,
            snapshot_wanted=False,
            next_backoff_s=backoff,
            next_snapshot=now + settings.snapshot_interval_s,
        )
        return s, actions
    needs_bytes = (
        seen.hinted and not seen.unchanged and seen.byte_budget and now >= s.next_budget_check
    )
    if needs_bytes:
        s = replace(s, next_budget_check=now + BUDGET_CHECK_EVERY_S)
    # Stuck over a limit and nothing a plan reads has changed: another cycle would only
    # repeat the last one. While stuck, a filesystem going back under also ends it.
    wanted = (seen.over or seen.stuck) and not seen.unchanged
    periodic = now >= s.next_full
    if periodic and seen.quiet and not wanted:
        if rescan_due:
            # The consistency check: every dir stat'ed and every file's size read again.
            actions.append(Action.RESCAN)
            s = replace(s, running=Action.CYCLE, checking=True, next_backoff_s=backoff)
            return s, actions
        # Quiet: this interval's cycle would repeat the last one. Looked at again an
        # interval on; the consistency rescan stays due at ``next_rescan``.
        s = replace(s, next_full=min(now + settings.check_interval_s, s.next_rescan))
        periodic = False
    if periodic or needs_bytes or wanted:
        actions.append(Action.CYCLE)
        s = replace(s, running=Action.CYCLE, checking=False, next_backoff_s=backoff)
    return s, actions


def _backoff(s: Schedule, settings: Settings, seen: Seen) -> float:
    """``check_interval``, doubled after each periodic rescan that found the same stuck
    state (up to ``max_backoff_s``); back to ``check_interval`` on any change."""
    base = settings.check_interval_s
    if seen.unchanged and seen.all_stuck:
        return min(max(base, settings.max_backoff_s), max(s.backoff_s, base) * 2)
    return base
