"""Retention cycles from the loop: run one, keep what it did, or skip it while stuck.

``_retention`` runs the cycle (``retention.cycle``) and records its outcome for the rest of
the loop: deletions (``state.json``, snapshots, metrics), what is now pending reclaim, the
scan warnings (each once). While a filesystem is stuck over its limit and nothing a plan
reads has changed, ``_stuck_and_unchanged`` skips cycles and ``_rescan_interval`` backs
off. A mixin of ``Daemon`` (``loop``), split out only to keep the loop readable.
"""

from __future__ import annotations

import time

from diskguard.daemon.brokerprobe import BrokerProbe
from diskguard.daemon.forecast import ReclaimForecast
from diskguard.daemon.watch import HintSummary, Watcher
from diskguard.flow.limits import flow_limits
from diskguard.kafkalog import lockfile
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger
from diskguard.retention.daemonstate import LastDeletion, SetAsideEntry
from diskguard.retention.mode import BROKER
from diskguard.retention.outcome import CycleOutcome
from diskguard.retention.stuck import MAX_BACKOFF_S, StuckTracker
from diskguard.snapshots.record import DeletedBytesCounter

log = get_logger("diskguard.daemon")


class RetentionCycles(ReclaimForecast):
    """The retention side of the loop (the loop's state is declared on ``ReclaimForecast``)."""

    #: Stuck over a limit: what the last cycle saw (``retention.stuck``).
    stuck: StuckTracker
    #: Asks the broker from a thread while a filesystem is stuck and the broker does not answer.
    _probe: BrokerProbe
    #: Bytes deleted per mount since the last snapshot.
    deleted: DeletedBytesCounter
    #: Scan warnings already logged.
    _warned: set[str]
    #: log dir -> whether another process held its ``.lock`` at the last cycle.
    _locks_seen: dict[str, bool]
    #: The current rescan interval while stuck (seconds).
    _backoff: float
    #: The inotify hints (``complete``: every dir watched).
    _watch: Watcher

    def _stuck_and_unchanged(self, usages: dict[str, FilesystemUsage], hint: HintSummary) -> bool:
        """True while every filesystem over its limit is stuck (see ``stuck``) and nothing a
        plan reads changed since the cycle that found it so: skip the cycle.

        A plan reads usage, file names, checkpoints, ``.lock`` and the config. Appends
        (``modified`` hints) change only sizes, which the usage check sees; a ``.lock`` event
        counts only if a probe answers differently (our own offline sweep opens it for
        writing); a reload resets the full-rescan timer, which runs a cycle regardless.
        """
        if self._probe.take_back():
            # The broker answers again: run the cycle now, on the probe's answer (the cycle's
            # cached "not reachable" would refuse once more; no round trip from the loop).
            self.runtime.modes.broker_reachable(max_age=0)
            return False
        if not self.stuck.states or len(usages) < len(self.mounts):
            return False
        ceilings = self.runtime.ceilings
        over = {m for m, u in usages.items() if ceilings.over_usage(u)}
        if over != {m for m, s in self.stuck.states.items() if s.over_percent}:
            return False  # a filesystem crossed its limit either way since the last cycle
        if hint.structural or self.stuck.usage_moved(usages):
            return False
        return not any(
            d in self._locks_seen and lockfile.held_by_other(d) != self._locks_seen[d]
            for d in hint.lock_dirs
        )

    def _rescan_interval(self, usages: dict[str, FilesystemUsage], unchanged: bool) -> float:
        """``check_interval``, doubled after each periodic rescan that found the same stuck
        state (up to ``MAX_BACKOFF_S``); back to ``check_interval`` on any change. Never
        doubled while some dir is not watched (``Watcher.complete``): a change there sends
        no hint, so only the rescan sees it."""
        base = self.config.retention.check_interval
        over = [m for m, u in usages.items() if self.runtime.ceilings.over_usage(u)]
        if unchanged and self._watch.complete and self.stuck.all_stuck(over):
            self._backoff = min(max(base, MAX_BACKOFF_S), self._backoff * 2)
        else:
            self._backoff = base
        return self._backoff

    def _retention(self, full: bool = False) -> CycleOutcome | None:
        try:
            outcome = self.runtime.enforce(full=full)
        except Exception as exc:
            log.exception("cycle_failed", error=f"{type(exc).__name__}: {exc}")
            return None
        self._last_outcome = outcome
        self.metrics.observe_scan(outcome.duration_s)
        for fsp in outcome.plan.filesystems:
            self.metrics.observe_retention(fsp.mount, fsp.device, fsp.unreachable_bytes)
            capacity = fsp.used_bytes + fsp.available_bytes
            limits = flow_limits(self.config, fsp.total_bytes)
            self.metrics.observe_flow_limits(fsp.mount, fsp.device, limits, capacity)
        for warning in outcome.warnings:
            # Each distinct problem once (a damaged index would otherwise repeat every cycle).
            if warning not in self._warned:
                if len(self._warned) > 10_000:
                    self._warned.clear()
                self._warned.add(warning)
                log.warning("scan_warning", message=warning)
        by_mode: dict[str, tuple[int, int]] = {}
        for res in outcome.results:
            if not res.ok:
                continue
            d = res.deletion
            self.deleted.add(d.mount, res.freed_bytes)
            count, size = by_mode.get(res.mode, (0, 0))
            by_mode[res.mode] = (count + 1, size + res.freed_bytes)
            self.memory.last_deletion[d.mount] = LastDeletion(
                ts=time.time(),
                topic=d.topic,
                partition=d.partition,
                base_offset=d.base_offset,
                bytes=d.bytes,
                mode=res.mode,
            )
        for mode, (count, size) in by_mode.items():
            self.metrics.count_deleted(mode, count, size)
        asked: dict[str, int] = {}
        for res in outcome.results:
            if res.ok and res.mode == BROKER:
                asked[res.deletion.mount] = asked.get(res.deletion.mount, 0) + res.freed_bytes
        # What this cycle asked the broker for is pending from now on, not from the next
        # scan: the forecast and flow control must not count it as still to be freed.
        self.runtime.ceilings.scanned(outcome.scan.filesystems, asked)
        for fs in outcome.scan.filesystems:
            # The scan's usage is the baseline for the drops ``_account_reclaim`` counts next:
            # what was freed before the scan is already out of its pending.
            self.memory.usage[fs.usage.mount] = fs.usage
        self._last_poll_at = time.monotonic()
        self.memory.set_aside = [
            SetAsideEntry(**e)
            for e in self.runtime.inputs.set_aside.export(time.monotonic(), time.time())
        ]
        self.metrics.partitions_set_aside.set(len(self.memory.set_aside))
        if self.stuck.states:
            # What the .lock looked like to this cycle: a later .lock event is a change only
            # if a probe answers differently.
            self._locks_seen = {
                str(d): lockfile.held_by_other(d) for d in self.config.broker.log_dirs
            }
        # Stuck while the broker does not answer (auto mode refused under a held .lock, the
        # topics' cleanup policies unknown, DeleteRecords failing): its answering again may end
        # that, so it is asked in the background rather than at the backed-off rescans.
        broker = self.runtime.broker
        if broker is not None:
            broker.answer_from_probe = bool(self.stuck.states) and broker.last_reachable is False
            self._probe.want(broker.answer_from_probe)
        return outcome

    def _recover(self) -> None:
        """Finish half-done offline deletions from a previous run before anything else.

        ``recover`` skips (and records) entries of log dirs another process holds.
        """
        try:
            done = self.runtime.files.recover([str(d) for d in self.config.broker.log_dirs])
        except Exception as exc:
            log.exception("offline_recover_failed", error=str(exc))
            return
        if done:
            log.info("offline_recovered", segments=len(done))
