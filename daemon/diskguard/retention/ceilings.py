"""The one owner of "over, and by how much": a filesystem and a mode in, its standing out.

Every place that asks whether a filesystem is over its retention limit, how many bytes must
go or what is already on its way out asks a ``Ceilings``: the cycle's cheap pre-check, the
planner (through ``standing_of``), the daemon's trigger, back-off and flow-control forecast,
``enforce``'s exit code, ``status`` and ``check-config --connect``. It alone turns the
config's ``retention`` keys into the planner's ``Limits`` (with the broker-mode forecast of
the filesystem in broker mode), and it alone sums what is pending reclaim; the rule itself is
``limits.stand`` (pure). A test holds that no other module reads those keys or calls the rule.

What is pending, per filesystem, is the sum of ``PendingReclaim``'s parts, in one place:

- ``scanned``: what the last scan saw on its way out (segments below the log start offset the
  broker has not removed yet, ``*.deleted`` files, ``-delete`` dirs);
- ``requested``: what the broker accepted to delete since that scan (DeleteRecords), which no
  scan has seen yet; it shrinks as usage drops between scans (``freed``).

Bytes diskguard unlinked itself but the filesystem does not show freed yet (btrfs frees at
its next commit, XFS inactivates unlinked inodes in the background) are on their way out too,
for as long as the offline cycle that unlinked them waits for them (``retention.unfreed``:
``syncfs``, a bounded wait); its ``usage_after`` and exit code are measured after that wait.
What has still not come back then is not counted as pending: nothing says it ever will (a
snapshot, a reflinked copy, a process holding the files open). It is ``unfreed`` here, and the
filesystem's standing is ``halted``: the planner chooses nothing more on it and says why,
until the space comes back. Subtracting it from the excess instead would let the disk's
growth walk the retention through the history one "pending" chunk at a time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from diskguard.config import Config
from diskguard.kafkalog.model import Filesystem, FilesystemUsage
from diskguard.retention.limits import (
    Limits,
    Standing,
    quiet_margin_bytes,
    room_above_ceiling,
    stand,
    with_forecast,
)
from diskguard.retention.mode import BROKER, OFFLINE

if TYPE_CHECKING:
    # Types only: status asks for the limits without importing the planner or the reclaim
    # model (start-up).
    from diskguard.retention.planner import DeletionResult, Plan
    from diskguard.retention.reclaim import Forecast
    from diskguard.retention.unfreed import Unfreed


@dataclass(frozen=True)
class PendingReclaim:
    """Bytes of one filesystem on their way out, by where diskguard learnt of them."""

    scanned: int = 0
    requested: int = 0

    @property
    def total(self) -> int:
        return self.scanned + self.requested

    def less(self, freed: int) -> PendingReclaim:
        """After ``freed`` bytes of it were seen freed: the newest part goes first."""
        from_requested = min(self.requested, max(0, freed))
        from_scanned = min(self.scanned, max(0, freed) - from_requested)
        return PendingReclaim(self.scanned - from_scanned, self.requested - from_requested)


def has_byte_budget(config: Config) -> bool:
    """Is a per-log-dir byte budget (``retention.max_bytes``) set? Only a full scan (a stat of
    every file) can check it; asked before the owner exists too (a plan's early listing)."""
    return config.retention.max_bytes is not None


class Ceilings:
    """A config's retention limits per filesystem and mode, and what is pending on each.

    ``forecast_for``: the broker-mode forecast of a filesystem (its write rate and the broker's
    reclaim latency), folded into its limits in broker mode; None: no forecast (one-shot
    commands without a daemon's rates, ``status``). Thread-safe: the daemon's loop and its
    retention worker both ask.
    """

    def __init__(
        self,
        config: Config,
        forecast_for: Callable[[str], Forecast | None] | None = None,
        moving: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        retention = config.retention
        self._plain = Limits(
            limit_percent=retention.disk_usage_percent,
            target_percent=retention.effective_target_percent,
            max_bytes=retention.max_bytes,
        )
        self._headroom = retention.offline_headroom
        self._forecast_for = forecast_for
        #: mount -> bytes of replicas being moved off it (the ladder's moves in flight).
        self._moving = moving
        self._lock = threading.Lock()
        self._pending: dict[str, PendingReclaim] = {}
        #: mount -> space earlier deletions did not give back (``retention.unfreed``).
        self._unfreed: dict[str, Unfreed] = {}

    # -- the limits -------------------------------------------------------------------
    @property
    def limit_percent(self) -> float:
        """``retention.disk_usage_percent``: the ceiling (displays, metrics)."""
        return self._plain.limit_percent

    @property
    def target_percent(self) -> float:
        """``retention.target_percent`` (the ceiling when unset)."""
        return self._plain.target_percent

    @property
    def byte_budget(self) -> bool:
        """Is a per-log-dir byte budget (``retention.max_bytes``) set? (``has_byte_budget``)"""
        return self._plain.max_bytes is not None

    def limits(self, mode: str, mount: str, forecast: bool = True) -> Limits:
        """The limits of the filesystem labelled ``mount`` in ``mode``: offline leaves the
        recovery headroom free; broker mode looks ahead by the filesystem's forecast unless
        ``forecast`` is False (or none is known)."""
        if mode == OFFLINE:
            return replace(self._plain, headroom_bytes=self._headroom)
        if mode != BROKER or not forecast or self._forecast_for is None:
            return self._plain
        found = self._forecast_for(mount)
        return self._plain if found is None else with_forecast(self._plain, found)

    # -- the answers ------------------------------------------------------------------
    def standing(
        self,
        usage: FilesystemUsage,
        mode: str,
        pending: int | None = None,
        forecast: bool = True,
    ) -> Standing:
        """``usage`` against its limits in ``mode``, net of ``pending`` (default: what is
        pending on it now, ``pending``)."""
        if pending is None:
            pending = self.pending(usage.mount)
        return stand(usage, self.limits(mode, usage.mount, forecast), pending)

    def standing_of(self, mode: str) -> Callable[[Filesystem], Standing]:
        """For the planner: each scanned filesystem net of what is pending on it
        (``pending_of``), ``halted`` where earlier deletions did not free their space."""

        def standing(fs: Filesystem) -> Standing:
            found = stand(fs.usage, self.limits(mode, fs.usage.mount), self.pending_of(fs))
            unfreed = self.unfreed(fs.usage.mount)
            return replace(found, halted=unfreed.reason) if unfreed is not None else found

        return standing

    def standing_at(self, mode: str) -> Callable[[Filesystem, float], Standing]:
        """For the ladder: a scanned filesystem's standing if space asked now came back only
        after ``latency`` seconds (a replica move's horizon), net of what is pending."""

        def at(fs: Filesystem, latency: float) -> Standing:
            limits = replace(self.limits(mode, fs.usage.mount), reclaim_latency_s=latency)
            return stand(fs.usage, limits, self.pending_of(fs))

        return at

    def above_target(self, usage: FilesystemUsage) -> bool:
        """Today's usage above ``target_percent`` (exact bytes): not yet back where a
        retention cycle leaves it (the ladder undoes its changes only once it is not)."""
        at_target = replace(self._plain, limit_percent=self._plain.target_percent)
        return stand(usage, at_target, 0).over_usage

    def over_usage(self, usage: FilesystemUsage) -> bool:
        """Today's usage above the ceiling (exact bytes; no forecast, nothing pending)."""
        return stand(usage, self._plain, 0).over_usage

    def may_need_space(self, usage: FilesystemUsage, mode: str) -> bool:
        """A cheap "may a plan choose deletions?" before any scan: pending, which only a
        scan measures, counts as none (errs towards yes)."""
        return self.standing(usage, mode, pending=0).over

    def well_under(
        self, usage: FilesystemUsage, span_s: float, margin_bytes: int | None = None
    ) -> bool:
        """Is ``usage`` so far under the ceiling that no cycle within ``span_s`` seconds could
        choose anything, even at the forecast's growth? Errs towards no: nothing counts as
        pending, the growth runs over the broker's reclaim latency plus ``span_s`` plus a
        check period with no horizon and no deferral, and ``margin_bytes`` are left on top
        (default ``quiet_margin_bytes``' floor; the daemon's covers the fastest growth seen
        lately too). A byte budget (``max_bytes``) is never well under: only a full scan
        measures it. Nor is a disk the margin would fill, whatever the ceiling."""
        if self.byte_budget:
            return False
        if margin_bytes is None:
            margin_bytes = quiet_margin_bytes(usage)
        if usage.fills_with(margin_bytes):
            return False
        limits = self.limits(BROKER, usage.mount)
        ahead = replace(
            limits,
            growth_bytes_per_s=max(0.0, limits.growth_bytes_per_s),
            reclaim_latency_s=limits.reclaim_latency_s + span_s,
            forecast_horizon_s=math.inf,
            defer_forecast=False,
        )
        return not stand(usage.after_writing(margin_bytes), ahead, 0).over

    def room_above_ceiling(self, usage: FilesystemUsage) -> int:
        """Bytes between the ceiling and a full disk."""
        return room_above_ceiling(usage, self._plain)

    def predicted(self, usage: FilesystemUsage, mode: str) -> FilesystemUsage | None:
        """Broker mode: the usage expected when space asked for now is freed (today's plus
        the growth until then, less what is pending), if above today's."""
        if mode != BROKER:
            return None
        grown = self.limits(mode, usage.mount).growth_bytes - self.pending(usage.mount)
        if grown <= 0:
            return None
        return usage.after_writing(grown)

    def settle(
        self,
        mode: str,
        plan: Plan,
        results: Iterable[DeletionResult],
        measured: Mapping[str, FilesystemUsage | None] | None,
        asked: Mapping[str, int] | None = None,
    ) -> tuple[dict[str, int], dict[str, Standing | None]]:
        """After a cycle in ``mode`` acted: per filesystem of ``plan``, the bytes someone else
        will still remove (``pending_after``), and the usage ``measured`` after acting (the
        scan's when nothing acted; None: the measurement failed) net of them, against the
        ceiling: what the disk will be, not what it may grow to (no forecast). ``asked``:
        mount -> bytes the ladder's actions asked the broker to free."""
        # The ladder's accepted evictions and moves (``asked``) count like DeleteRecords.
        accepted: dict[str, int] = dict(asked or {})
        for res in results:
            if res.ok:
                mount = res.deletion.mount
                accepted[mount] = accepted.get(mount, 0) + res.freed_bytes
        pending_left: dict[str, int] = {}
        settled: dict[str, Standing | None] = {}
        for fs in plan.filesystems:
            left = self.pending_after(mode, fs.pending_reclaim_bytes, accepted.get(fs.mount, 0))
            pending_left[fs.mount] = left
            usage = fs.usage if measured is None else measured.get(fs.mount)
            if usage is None:
                settled[fs.mount] = None
                continue
            capacity = usage.used_bytes + usage.available_bytes
            used = max(0, usage.used_bytes - left)
            net = replace(usage, used_bytes=used, available_bytes=capacity - used)
            settled[fs.mount] = stand(net, self._plain, 0)
        return pending_left, settled

    # -- what is pending --------------------------------------------------------------
    def pending_of(self, fs: Filesystem) -> int:
        """What a plan of the scanned ``fs`` counts as on its way out: the scan's own count
        (it includes what the broker was asked for before it: ``requested-log-start.json``)
        and the replicas being moved off it (the scan still sees them in place)."""
        return fs.pending_reclaim_bytes + self._moving_off(fs.usage.mount)

    def _moving_off(self, mount: str) -> int:
        return self._moving().get(mount, 0) if self._moving is not None else 0

    def pending(self, mount: str) -> int:
        """What is on its way out of ``mount`` now, between scans."""
        with self._lock:
            scanned = self._pending.get(mount, PendingReclaim()).total
        return scanned + self._moving_off(mount)

    def pending_after(self, mode: str, fs_pending: int, accepted: int) -> int:
        """After a cycle in ``mode`` acted: bytes someone else will still remove. Broker mode:
        what was pending at the scan plus what the broker accepted to delete now. Offline
        nobody else removes anything: what counts is what is gone."""
        if mode == OFFLINE:
            return 0
        return fs_pending + accepted

    def scanned(self, filesystems: Iterable[Filesystem], requested: Mapping[str, int]) -> None:
        """After a cycle: each filesystem's pending is its scan's, plus what this cycle asked
        the broker for (pending from now on, not from the next scan)."""
        with self._lock:
            for fs in filesystems:
                mount = fs.usage.mount
                # The scan's own count: moves in flight are added when asked (``pending``).
                scanned = fs.pending_reclaim_bytes
                self._pending[mount] = PendingReclaim(scanned, requested.get(mount, 0))

    def freed(self, mount: str, freed_bytes: int) -> None:
        """Between scans: ``freed_bytes`` of ``mount``'s pending were seen freed."""
        with self._lock:
            current = self._pending.get(mount)
            if current is not None and freed_bytes > 0:
                self._pending[mount] = current.less(freed_bytes)

    def forget(self, mount: str) -> None:
        with self._lock:
            self._pending.pop(mount, None)
            self._unfreed.pop(mount, None)

    # -- what did not come back ------------------------------------------------------
    def unfreed(self, mount: str) -> Unfreed | None:
        """What earlier deletions on ``mount`` did not give back (None: nothing)."""
        with self._lock:
            return self._unfreed.get(mount)

    def all_unfreed(self) -> dict[str, Unfreed]:
        with self._lock:
            return dict(self._unfreed)

    def set_unfreed(self, records: Mapping[str, Unfreed]) -> None:
        """Replace what is known not to have come back (``retention.unfreed``)."""
        with self._lock:
            self._unfreed = dict(records)
