"""When a filesystem is over its limit and nothing more can be done: say so once, then wait.

Stuck means a retention cycle ran and cannot bring the filesystem down, for one of five
reasons: only active or protected segments are left (``target_unreachable``), deleting is
refused for safety (``refused``, e.g. ``.lock`` held with mode offline), the mode is
``dry_run``, the excess is already on its way out and the broker has not removed it yet
(``pending_reclaim``), or every deletion the cycle tried failed (``delete_failed``: a log
dir remounted read-only after a disk error, a broker refusing DeleteRecords). Repeating the
same cycle cannot change that; before this tracker the daemon did, several times a second,
logging each time (``delete_failed``: 4,035 lines/s and 52 % CPU on a
read-only log dir of 2,000 segments, ``bench/bench_stuck.py``).

The tracker decides two things from each cycle's mode and plan:

- which events are logged: ``retention_stuck`` when a filesystem becomes stuck, when the
  reason changes and every ``HEARTBEAT_S`` while it lasts; ``retention_stuck_cleared`` when
  it ends; in between the cycle's own repeating events (``retention_cycle``,
  ``retention_refused``, ``retention_target_unreachable``) are quiet for that filesystem;
- when the daemon needs a new cycle although the last one changed nothing
  (:meth:`StuckTracker.usage_moved`): usage grew past what is already pending reclaim, or
  moved by ``MOVE_FRACTION`` of the disk. The daemon adds the other inputs of a plan (file
  names, the ``.lock``, the config) from its inotify hints.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger
from diskguard.retention.mode import DRY_RUN, REFUSED, ModeDecision
from diskguard.retention.planner import DeletionResult, FilesystemPlan, Plan

log = get_logger("diskguard.retention")

#: A stuck state is logged again this often while it lasts.
HEARTBEAT_S = 300.0
#: While stuck and nothing changes, the periodic rescan backs off up to this interval.
MAX_BACKOFF_S = 60.0
#: A usage move of this share of the filesystem (or ``MIN_MOVE_BYTES``) is a change.
MOVE_FRACTION = 0.001
MIN_MOVE_BYTES = 1024 * 1024

TARGET_UNREACHABLE = "target_unreachable"
REFUSED_REASON = "refused"
DRY_RUN_REASON = "dry_run"
PENDING_RECLAIM = "pending_reclaim"
DELETE_FAILED = "delete_failed"
#: What is left when a plan cannot cover the excess (and no deletion was stopped).
UNREACHABLE_DETAIL = (
    "only active, protected, hard-linked or extent-sharing segments are left (deleting a "
    "segment whose files are hard-linked, or whose extents a snapshot or reflinked copies "
    "share, frees nothing)"
)


@dataclass(frozen=True)
class StuckState:
    """One filesystem's stuck state as the last cycle left it."""

    reason: str
    mode: str
    detail: str
    since: float
    logged: float
    #: ``used_bytes`` the last cycle saw, and how far it may grow before a cycle must run.
    used_bytes: int
    grow_allowance: int
    move_bytes: int
    #: Over the usage-percent ceiling (not only a log dir's ``max_bytes``).
    over_percent: bool


def stuck_reason(mode: ModeDecision, fs: FilesystemPlan) -> tuple[str, str] | None:
    """Pure: ``(reason, detail)`` when ``fs`` is over its limit and the cycle cannot help."""
    if fs.halted and (fs.excess_bytes > 0 or fs.over_usage_limit):
        return TARGET_UNREACHABLE, fs.halted
    if fs.excess_bytes <= 0:
        if fs.over_usage_limit:
            return PENDING_RECLAIM, (
                f"{fs.pending_reclaim_bytes} bytes already pending reclaim cover the excess"
            )
        return None
    if fs.chosen_count:
        if mode.mode == REFUSED:
            return REFUSED_REASON, mode.reason
        if mode.mode == DRY_RUN:
            return DRY_RUN_REASON, mode.reason
        return None
    return TARGET_UNREACHABLE, UNREACHABLE_DETAIL


def _retrying(previous: StuckState, mode: ModeDecision, fs: FilesystemPlan) -> bool:
    """Stuck on failed deletions and this cycle will try again (same mode, segments chosen):
    whether it is still stuck is known only after it acted."""
    return previous.reason == DELETE_FAILED and previous.mode == mode.mode and fs.chosen_count > 0


def _allowance(reason: str, fs: FilesystemPlan, move: int) -> int:
    """How far ``used_bytes`` may grow before the plan could ask for a deletion again."""
    if reason != PENDING_RECLAIM:
        return move
    capacity = fs.used_bytes + fs.available_bytes
    target_used = int(capacity * fs.target_percent / 100.0)
    slack = fs.pending_reclaim_bytes - (fs.used_bytes - target_used)
    return max(0, min(move, slack))


class StuckTracker:
    """Per filesystem stuck states; consulted by the runtime after each cycle's plan."""

    def __init__(self, heartbeat_s: float = HEARTBEAT_S) -> None:
        self.heartbeat_s = heartbeat_s
        self.states: dict[str, StuckState] = {}
        #: Mounts whose last cycle that acted had only ``lasting`` failures, none succeeding.
        self._set_aside_only: set[str] = set()

    def observe(self, mode: ModeDecision, plan: Plan, now: float) -> frozenset[str]:
        """Update from one cycle, log what changed; return the mounts to keep quiet."""
        quiet: set[str] = set()
        seen: set[str] = set()
        for fs in plan.filesystems:
            seen.add(fs.mount)
            if fs.chosen_count == 0:  # nothing to try: a later failure starts afresh
                self._set_aside_only.discard(fs.mount)
            found = stuck_reason(mode, fs)
            previous = self.states.get(fs.mount)
            if found is None and previous is not None and _retrying(previous, mode, fs):
                # The cycle will try its deletions again: ``observe_results`` decides.
                quiet.add(fs.mount)
                continue
            if found is None:
                if previous is not None:
                    del self.states[fs.mount]
                    self._cleared(fs.mount, previous, now, fs.usage_percent)
                continue
            if self._update(fs, found, mode, previous, now):
                quiet.add(fs.mount)
        for mount in [m for m in self.states if m not in seen]:
            self._cleared(mount, self.states.pop(mount), now, None)
        return frozenset(quiet)

    def observe_results(
        self, mode: ModeDecision, plan: Plan, results: Iterable[DeletionResult], now: float
    ) -> frozenset[str]:
        """After the cycle acted: a filesystem where every deletion tried failed is stuck
        (``delete_failed``, the first error as detail); one where any succeeded is not any
        more. Failures that were all ``lasting`` set their partitions aside (``setaside``), so
        the next plan takes other segments: the first time that is not stuck (the next cycle
        runs at once); if that plan fails the same way too, nothing may be deletable at all
        (diskguard's principal lacks DELETE on every topic), and it is stuck like any other
        failure, so the retries that set more partitions aside come at the back-off's pace,
        not one cycle after another. Returns the mounts to keep quiet (stuck, said already)."""
        tried: dict[str, list[DeletionResult]] = {}
        for res in results:
            tried.setdefault(res.deletion.mount, []).append(res)
        quiet: set[str] = set()
        for fs in plan.filesystems:
            done = tried.get(fs.mount)
            if not done:
                continue
            previous = self.states.get(fs.mount)
            if any(r.ok for r in done):
                self._set_aside_only.discard(fs.mount)
                if previous is not None and previous.reason == DELETE_FAILED:
                    del self.states[fs.mount]
                    self._cleared(fs.mount, previous, now, fs.usage_percent)
                continue
            if all(r.lasting for r in done) and fs.mount not in self._set_aside_only:
                self._set_aside_only.add(fs.mount)
                continue
            first = next((r.error for r in done if r.error), "no error given")
            detail = f"all {len(done)} deletion(s) tried failed; the first: {first}"
            if self._update(fs, (DELETE_FAILED, detail), mode, previous, now):
                quiet.add(fs.mount)
        return frozenset(quiet)

    def _update(
        self,
        fs: FilesystemPlan,
        found: tuple[str, str],
        mode: ModeDecision,
        previous: StuckState | None,
        now: float,
    ) -> bool:
        """Record ``fs`` stuck for ``found``; log it if new, changed or due a heartbeat.
        Returns True when nothing was logged (the mount stays quiet)."""
        reason, detail = found
        move = max(MIN_MOVE_BYTES, int((fs.used_bytes + fs.available_bytes) * MOVE_FRACTION))
        fresh = StuckState(
            reason=reason,
            mode=mode.mode,
            detail=detail,
            since=now,
            logged=now,
            used_bytes=fs.used_bytes,
            grow_allowance=_allowance(reason, fs, move),
            move_bytes=move,
            over_percent=fs.over_usage_limit,
        )
        if previous is None or (previous.reason, previous.mode) != (reason, mode.mode):
            self.states[fs.mount] = fresh
            self._stuck(fs, fresh, now, heartbeat=False)
            return False
        if now - previous.logged >= self.heartbeat_s:
            state = replace(fresh, since=previous.since)
            self.states[fs.mount] = state
            self._stuck(fs, state, now, heartbeat=True)
            return False
        self.states[fs.mount] = replace(fresh, since=previous.since, logged=previous.logged)
        return True

    def observe_halted(self, mode: ModeDecision, plan: Plan, now: float) -> frozenset[str]:
        """After the cycle acted: where its deletions did not free their space the retention
        stopped (``fs.halted`` on a filesystem that chose deletions): stuck from now on, said
        once (with this cycle's own events), quiet in the cycles after. Returns the mounts
        to keep quiet (said already)."""
        quiet: set[str] = set()
        for fs in plan.filesystems:
            if fs.halted and fs.chosen_count:
                found = (TARGET_UNREACHABLE, fs.halted)
                if self._update(fs, found, mode, self.states.get(fs.mount), now):
                    quiet.add(fs.mount)
        return frozenset(quiet)

    def all_stuck(self, mounts: Iterable[str]) -> bool:
        """True when every one of ``mounts`` (those over their limit) is known stuck."""
        mounts = list(mounts)
        return bool(mounts) and all(m in self.states for m in mounts)

    def usage_moved(self, usages: Mapping[str, FilesystemUsage]) -> bool:
        """A stuck filesystem's usage grew past its allowance or moved meaningfully."""
        for mount, state in self.states.items():
            usage = usages.get(mount)
            if usage is None:
                return True
            delta = usage.used_bytes - state.used_bytes
            if delta > state.grow_allowance or abs(delta) >= state.move_bytes:
                return True
        return False

    def forget(self, mount: str) -> None:
        self.states.pop(mount, None)
        self._set_aside_only.discard(mount)

    # -- events ---------------------------------------------------------------
    def _stuck(self, fs: FilesystemPlan, state: StuckState, now: float, heartbeat: bool) -> None:
        # Waiting for the broker, or a dry run, is how those modes work: info, not a warning.
        expected = state.reason in (PENDING_RECLAIM, DRY_RUN_REASON)
        emit = log.info if expected else log.warning
        emit(
            "retention_stuck",
            mount=fs.mount,
            reason=state.reason,
            detail=state.detail,
            mode=state.mode,
            usage_percent=fs.usage_percent,
            limit_percent=fs.limit_percent,
            excess_bytes=fs.excess_bytes,
            pending_reclaim_bytes=fs.pending_reclaim_bytes,
            unreachable_bytes=fs.unreachable_bytes,
            heartbeat=heartbeat,
            stuck_for_s=round(now - state.since, 1),
        )

    def _cleared(self, mount: str, state: StuckState, now: float, usage: float | None) -> None:
        log.info(
            "retention_stuck_cleared",
            mount=mount,
            reason=state.reason,
            usage_percent=usage,
            stuck_for_s=round(now - state.since, 1),
        )
