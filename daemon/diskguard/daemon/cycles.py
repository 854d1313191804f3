"""Retention in the daemon: cycles run beside the loop, and what the loop keeps of them.

A cycle (``retention.cycle.RetentionCycle.enforce``) runs on the ``CycleWorker`` thread, so
what it waits for (a hung broker: one client timeout per cycle at most) holds up neither flow
control nor a stop. Its outcome comes back to the loop, which alone applies it (``take``):
deletions (``state.json``, snapshots, metrics), what is pending reclaim now, the scan
warnings (each once). While a filesystem is stuck over its limit and nothing a plan reads has
changed, ``facts`` says so and the schedule skips cycles and backs off.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

from diskguard.config import Config
from diskguard.daemon.brokerprobe import BrokerProbe
from diskguard.daemon.cycleworker import CycleWorker
from diskguard.daemon.watch import HintSummary
from diskguard.kafkalog import lockfile
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger
from diskguard.metrics import Metrics
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.daemonstate import LastDeletion, SetAsideEntry
from diskguard.retention.ladder import BALANCE
from diskguard.retention.limits import quiet_margin_bytes
from diskguard.retention.mode import BROKER
from diskguard.retention.outcome import CycleOutcome
from diskguard.retention.rungaudit import asked_by_mount
from diskguard.retention.stuck import StuckTracker
from diskguard.snapshots.record import DeletedBytesCounter

log = get_logger("diskguard.daemon")

#: CPU time a quiet retention cycle may spend dating partition heads ahead of need
#: (``dating.warm_heads``), so the first cycle over a limit finds them dated.
WARM_HEADS_S = 0.1
#: Scan warnings remembered (each is logged once); past this, the memory starts afresh.
_WARNED_MAX = 10_000
#: The last cycles whose longest wall time a quiet daemon's margin covers (``quiet_margins``).
REACH_CYCLES = 8


class Retention:
    """The daemon's retention cycles and their memory (which outlives a reload): the stuck
    tracker, the bytes deleted since the last snapshot, the newest deletion per filesystem,
    the partitions set aside, the last outcome. The cycle itself is the config's
    (``build``)."""

    def __init__(
        self,
        config: Config,
        metrics: Metrics,
        probe: BrokerProbe,
        wake: Callable[[], None],
    ) -> None:
        self._metrics = metrics
        self._probe = probe
        self._worker: CycleWorker[CycleOutcome] = CycleWorker(wake)
        self.stuck = StuckTracker()
        self.deleted = DeletedBytesCounter()
        self.last_deletion: dict[str, LastDeletion] = {}
        self.set_aside: list[SetAsideEntry] = []
        #: The last cycle's outcome (None before the first, or after one that failed).
        self.last: CycleOutcome | None = None
        #: Scan warnings already logged.
        self._warned: set[str] = set()
        #: log dir -> whether another process held its ``.lock`` at the last cycle.
        self._locks_seen: dict[str, bool] = {}
        #: The CPU time of the last cycle (its thread's), set before its outcome is taken.
        self.cycle_cpu_s = 0.0
        #: The wall time of the last ``REACH_CYCLES`` cycles (the worker appends).
        self._walls: deque[float] = deque(maxlen=REACH_CYCLES)
        self.build(config)

    def build(self, config: Config) -> None:
        """The config's cycle; only while ``idle`` (a reload waits for the cycle under way)."""
        self._config = config
        previous: RetentionCycle | None = getattr(self, "runtime", None)
        self.runtime = RetentionCycle(
            config,
            stuck=self.stuck,
            warm_heads_s=WARM_HEADS_S,
            reachability=self._probe.answer,
        )
        if previous is not None:  # a reload: the disks' growth goes on
            self.runtime.forecaster.adopt_history(previous.forecaster)

    @property
    def idle(self) -> bool:
        return self._worker.idle

    def start(self, full: bool, trust: frozenset[str] | None = None) -> None:
        """A cycle beside the loop (``full``: stat every file, for the usage snapshot).
        ``trust``: its scan takes every partition dir whose name is not in it as the last
        full scan left it (``ListingCache.trust``: the hints saw no event there)."""
        runtime = self.runtime

        def cycle() -> CycleOutcome:
            started, wall = time.thread_time(), time.monotonic()
            runtime.inputs.cache.trust(trust)
            try:
                return runtime.enforce(full=full)
            finally:
                runtime.inputs.cache.trust(None)  # this cycle's first scan only
                self.cycle_cpu_s = time.thread_time() - started
                self._walls.append(time.monotonic() - wall)

        self._worker.submit(cycle)

    def take(self) -> bool:
        """Did the cycle under way finish? Then apply its outcome (None if it failed)."""
        done = self._worker.take()
        if done is None:
            return False
        (outcome,) = done
        if outcome is not None:
            self._apply(outcome)
        return True

    def recover(self) -> None:
        """Finish half-done offline deletions from a previous run before anything else.

        ``recover`` skips (and records) entries of log dirs another process holds.
        """
        try:
            done = self.runtime.files.recover([str(d) for d in self._config.broker.log_dirs])
        except Exception as exc:
            log.exception("offline_recover_failed", error=str(exc))
            return
        if done:
            log.info("offline_recovered", segments=len(done))

    def log_dir_listing(self, log_dir: str) -> list[os.DirEntry[str]] | None:
        """The log dir's entries as the last cycle's scan listed them (the watcher's count)."""
        return self.runtime.inputs.cache.last_log_dir_entries(log_dir)

    def topics_by_mount(self) -> dict[str, list[str]]:
        """The topics with a partition on each filesystem, as the last cycle saw them."""
        out: dict[str, list[str]] = {}
        if self.last is not None:
            for fs in self.last.scan.filesystems:
                topics = {p.topic for d in fs.log_dirs for p in d.partitions}
                out[fs.usage.mount] = sorted(topics)
        return out

    # -- what the schedule needs to know -----------------------------------------------
    def unchanged(
        self, usages: Mapping[str, FilesystemUsage], hint: HintSummary, mounts: int
    ) -> bool:
        """True while every filesystem over its limit is stuck (see ``retention.stuck``) and
        nothing a plan reads changed since the cycle that found it so: skip the cycle. Only
        while ``idle`` (the cycle owns the stuck tracker while it runs).

        A plan reads usage, file names, checkpoints, ``.lock`` and the config. Appends
        (``modified`` hints) change only sizes, which the usage check sees; a ``.lock`` event
        counts only if a probe answers differently (our own offline sweep opens it for
        writing); a reload resets the full-rescan timer, which runs a cycle regardless.
        """
        if self._probe.take_back():
            # The broker answers again: the next cycle asks it afresh rather than trust the
            # "not reachable" it remembers.
            self.runtime.modes.forget_reachable()
            return False
        if not self.stuck.states or len(usages) < mounts:
            return False
        over = set(self.over_usage(usages))
        if over != {m for m, s in self.stuck.states.items() if s.over_percent}:
            return False  # a filesystem crossed its limit either way since the last cycle
        if hint.structural or self.stuck.usage_moved(usages):
            return False
        return not any(
            d in self._locks_seen and lockfile.held_by_other(d) != self._locks_seen[d]
            for d in hint.lock_dirs
        )

    def quiet_margins(self, usages: Mapping[str, FilesystemUsage], poll_s: float) -> dict[str, int]:
        """Per filesystem, the room a quiet daemon keeps below every limit
        (``quiet_margin_bytes``): what the fastest growth seen lately writes before a
        crossing could be seen (the quiet poll ``poll_s``, and the longest of the last
        cycles: one started while quiet keeps a reacting one waiting), never less than
        ``QUIET_MARGIN_FRACTION`` of the disk."""
        reach_s = poll_s + max(tuple(self._walls), default=0.0)
        forecaster = self.runtime.forecaster
        return {
            mount: quiet_margin_bytes(usage, forecaster.peak_rate(mount), reach_s)
            for mount, usage in usages.items()
        }

    def quiet(
        self,
        usages: Mapping[str, FilesystemUsage],
        mounts: int,
        span_s: float,
        margins: Mapping[str, int],
    ) -> bool:
        """May the periodic cycle be skipped, as far as retention goes? The last cycle ran
        and acted on nothing, nothing it left is under way (pending reclaim, DeleteRecords
        the broker has not carried out, deletions that did not free their space, the
        ladder's changes), nothing is stuck, and every filesystem is well under its limits
        for ``span_s``, ``margins`` (mount -> bytes, ``quiet_margin_bytes``) left on top
        (``Ceilings.well_under``). Whether the log dirs changed is the hints' to say (the
        loop). Only while ``idle``."""
        last = self.last
        if last is None or last.results or last.rungs or self.stuck.states:
            return False
        if len(usages) < mounts:
            return False  # a filesystem that could not be measured
        runtime = self.runtime
        ceilings = runtime.ceilings
        if ceilings.all_unfreed() or runtime.requested.as_mapping() or runtime.ladder.in_flight():
            return False
        return all(
            ceilings.pending(mount) == 0 and ceilings.well_under(usage, span_s, margins.get(mount))
            for mount, usage in usages.items()
        )

    def over_usage(self, usages: Mapping[str, FilesystemUsage]) -> list[str]:
        """The filesystems whose usage is over the ceiling now."""
        return [m for m, u in usages.items() if self.runtime.ceilings.over_usage(u)]

    # -- stopping ---------------------------------------------------------------------
    def stop(self, timeout: float) -> bool:
        """No more cycles; wait up to ``timeout`` s for the one under way. True if one was
        still under way when the time was up: it is abandoned (a broker call that does not
        answer), which the offline journal and the audit log are made to survive."""
        self._worker.close()
        return not self._worker.wait(timeout)

    def close(self) -> None:
        self.runtime.close()

    # -- applying an outcome ----------------------------------------------------------
    def _apply(self, outcome: CycleOutcome) -> None:
        self.last = outcome
        self._metrics.observe_scan(outcome.duration_s)
        for fsp in outcome.plan.filesystems:
            self._metrics.observe_retention(fsp.mount, fsp.device, fsp.unreachable_bytes)
        self._warn_once(outcome.warnings)
        self._count_deleted(outcome)
        # The ladder's evictions (its moves in flight Ceilings counts itself, until done).
        asked = asked_by_mount(r for r in outcome.rungs if r.rung != BALANCE)
        for res in outcome.results:
            if res.ok and res.mode == BROKER:
                asked[res.deletion.mount] = asked.get(res.deletion.mount, 0) + res.freed_bytes
        # What this cycle asked the broker for is pending from now on, not from the next
        # scan: the forecast and flow control must not count it as still to be freed.
        self.runtime.ceilings.scanned(outcome.scan.filesystems, asked)
        self.set_aside = [
            SetAsideEntry(**e)
            for e in self.runtime.inputs.set_aside.export(time.monotonic(), time.time())
        ]
        self._metrics.partitions_set_aside.set(len(self.set_aside))
        if self.stuck.states:
            # What the .lock looked like to this cycle: a later .lock event is a change only
            # if a probe answers differently.
            self._locks_seen = {
                str(d): lockfile.held_by_other(d) for d in self._config.broker.log_dirs
            }
        # Stuck while the broker does not answer (auto mode refused under a held .lock, the
        # topics' cleanup policies unknown, DeleteRecords failing): its answering again may
        # end that, so it is asked in the background rather than at the backed-off rescans.
        self._probe.want(bool(self.stuck.states) and self.runtime.modes.last_reachable is False)

    def _warn_once(self, warnings: Sequence[str]) -> None:
        for warning in warnings:
            # Each distinct problem once (a damaged index would otherwise repeat every cycle).
            if warning not in self._warned:
                if len(self._warned) > _WARNED_MAX:
                    self._warned.clear()
                self._warned.add(warning)
                log.warning("scan_warning", message=warning)

    def _count_deleted(self, outcome: CycleOutcome) -> None:
        by_mode: dict[str, tuple[int, int]] = {}
        for res in outcome.results:
            if not res.ok:
                continue
            d = res.deletion
            self.deleted.add(d.mount, res.freed_bytes)
            count, size = by_mode.get(res.mode, (0, 0))
            by_mode[res.mode] = (count + 1, size + res.freed_bytes)
            self.last_deletion[d.mount] = LastDeletion(
                ts=time.time(),
                topic=d.topic,
                partition=d.partition,
                base_offset=d.base_offset,
                bytes=d.bytes,
                mode=res.mode,
            )
        for mode, (count, size) in by_mode.items():
            self._metrics.count_deleted(mode, count, size)
