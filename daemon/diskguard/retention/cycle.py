"""The long-lived edge objects a retention cycle needs, wired once from the config.

``plan``, ``enforce --once`` and the daemon all run ``Runtime.cycle`` so they share one set of
safety rules; ``plan`` just never acts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from diskguard.broker.client import BrokerClient
from diskguard.capacity.topicconfigs import local_broker_id
from diskguard.config import Config
from diskguard.host import fsusage
from diskguard.host.atomicfile import read_json
from diskguard.kafkalog import lockfile
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.kafkalog.scan import ScanResult
from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog, AuditWriteFailed
from diskguard.retention.enforcement import (
    BROKER,
    DRY_RUN,
    OFFLINE,
    REFUSED,
    CycleOutcome,
    ModeDecision,
    Planner,
    RequestedLogStart,
    decide_mode,
)
from diskguard.retention.offline import OfflineExecutor
from diskguard.retention.planner import Deletion, Plan
from diskguard.retention.policystore import CACHE_FILE, PolicyStore
from diskguard.retention.reclaim import Forecast, GrowthEstimator
from diskguard.retention.reclaimwatch import ReclaimWatch, reclaim_settings
from diskguard.retention.stuck import StuckTracker

log = get_logger("diskguard.retention")


#: The daemon's state file (flow state, last deletion, growth rate, reclaim latency).
STATE_FILE = "state.json"


def daemon_state(config: Config) -> dict[str, Any] | None:
    """What a *running* daemon last wrote to ``state.json`` (None if none is running)."""
    try:
        state = read_json(Path(config.daemon.state_dir) / STATE_FILE, None)
    except (OSError, ValueError):
        return None
    if not isinstance(state, dict):
        return None
    pid = state.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return state


def daemon_rates(config: Config, max_age: float = 60.0) -> dict[str, float]:
    """mount -> write rate the running daemon measured, if it wrote one recently.

    ``plan`` and ``enforce --once`` have no usage history of their own; without this their
    broker-mode forecast would assume no growth at all.
    """
    state = daemon_state(config)
    if state is None or time.time() - float(state.get("updated", 0)) > max_age:
        return {}
    out: dict[str, float] = {}
    for mount, fs in (state.get("filesystems") or {}).items():
        rate = ((fs or {}).get("reclaim") or {}).get("growth_bytes_per_s")
        if isinstance(rate, int | float) and rate >= 0:
            out[str(mount)] = float(rate)
    return out


class Runtime:
    """Executors, audit log and broker client for one config."""

    def __init__(self, config: Config, read_only: bool = False) -> None:
        self.config = config
        self.read_only = read_only
        state_dir = Path(config.daemon.state_dir)
        if not read_only:
            state_dir.mkdir(parents=True, exist_ok=True)
        self.requested = RequestedLogStart(state_dir / "requested-log-start.json")
        self.broker: BrokerClient | None = None
        if config.broker.bootstrap_servers:
            self.broker = BrokerClient(
                config.broker.bootstrap_servers, dict(config.broker.client), timeout=5.0
            )
        self.audit = AuditLog(state_dir / "audit.jsonl")
        self.offline = OfflineExecutor(state_dir, self.audit)
        self.planner = Planner(
            config, self.requested, policies=PolicyStore(state_dir / CACHE_FILE, not read_only)
        )
        self.planner.forecast_for = self.forecast
        self._reachable_cache: tuple[float, bool] | None = None
        # Broker reclaim latency: settings now from server.properties/defaults, from the broker
        # itself at the first broker-mode cycle; growth rates from the daemon's usage samples.
        self.reclaim = ReclaimWatch(reclaim_settings(config))
        self._settings_from_broker_at: float | None = None
        self.growth: dict[str, GrowthEstimator] = {}
        #: mount -> rate a running daemon measured (one-shot commands have no history).
        self.daemon_rates: dict[str, float] = {}
        self.local_broker_id = local_broker_id(config.broker.log_dirs)
        #: Set by the daemon: says which filesystems are stuck over their limit, so their
        #: cycle events are logged when that begins or changes, not on every cycle.
        self.stuck: StuckTracker | None = None
        self._quiet: frozenset[str] = frozenset()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self.broker is not None:
            self.broker.close()

    # -- forecast (broker mode) ------------------------------------------------
    def observe_usage(self, mount: str, t: float, used_bytes: int) -> None:
        """One usage sample (the daemon's poll): feeds the filesystem's growth rate."""
        self.growth.setdefault(mount, GrowthEstimator()).observe(t, used_bytes)

    def growth_rate(self, mount: str) -> float | None:
        estimator = self.growth.get(mount)
        rate = estimator.rate() if estimator is not None else None
        return rate if rate is not None else self.daemon_rates.get(mount)

    def forecast(self, mount: str) -> Forecast:
        return self.reclaim.model.forecast(time.monotonic(), self.growth_rate(mount))

    def refresh_reclaim_settings(self, max_age: float = 600.0) -> None:
        """Ask the broker for its retention-check settings, at most every ``max_age`` s."""
        if self.broker is None:
            return
        now = time.monotonic()
        if self._settings_from_broker_at is not None and now - self._settings_from_broker_at < (
            max_age
        ):
            return
        self._settings_from_broker_at = now
        settings = reclaim_settings(
            self.config,
            lambda: self.broker.broker_configs(self.local_broker_id) if self.broker else None,
        )
        if settings != self.reclaim.settings:
            self.reclaim.set_settings(settings)
            log.info(
                "broker_reclaim_settings",
                check_interval_s=settings.check_interval_s,
                delete_delay_s=settings.delete_delay_s,
                source=settings.source,
            )

    def _led_here(self, topics: Sequence[str]) -> frozenset[tuple[str, int]] | None:
        if self.broker is None or self.local_broker_id is None:
            return None
        leaders = self.broker.leaders(topics)
        if not leaders:
            return None
        return frozenset(tp for tp, leader in leaders.items() if leader == self.local_broker_id)

    # -- mode -----------------------------------------------------------------
    def locked_log_dirs(self) -> list[str]:
        return [str(d) for d in self.config.broker.log_dirs if lockfile.held_by_other(d)]

    def broker_reachable(self, max_age: float = 10.0) -> bool | None:
        """Cached for ``max_age`` s: probing a dead broker costs its timeout every call."""
        if self.broker is None:
            return None
        now = time.monotonic()
        if self._reachable_cache and now - self._reachable_cache[0] < max_age:
            return self._reachable_cache[1]
        ok = bool(self.broker.reachable())
        self._reachable_cache = (now, ok)
        return ok

    def decide(self, need_broker: bool) -> ModeDecision:
        configured = self.config.retention.mode
        locked = self.locked_log_dirs()
        reachable: bool | None
        if configured == DRY_RUN:
            reachable = None
        elif need_broker or configured == BROKER:
            reachable = self.broker_reachable()
        else:
            # Nothing to delete: avoid a network round trip, assume what the lock says.
            reachable = (bool(locked) or None) if self.broker is not None else None
        return decide_mode(configured, reachable, locked)

    # -- cycle ----------------------------------------------------------------
    def cycle(self, act: bool = True, full: bool = False) -> CycleOutcome:
        started = time.monotonic()
        # The daemon skips the broker probe while nothing needs deleting; `plan` always asks.
        mode = self.decide(need_broker=self.read_only)
        self.reclaim.check(time.monotonic())
        if mode.mode == BROKER:
            self.refresh_reclaim_settings()
        if act and mode.mode == OFFLINE and self._may_need_space():
            self._sweep_offline()
        result = self._scan_with_policies(full, mode)
        if not self.read_only:
            self.requested.prune(result)
        chosen, warnings = self.planner.plan(result, mode.mode)
        if chosen.deletions and mode.mode != DRY_RUN:
            decided = self.decide(need_broker=True)
            if decided.mode == BROKER and self.broker:
                topics = sorted({d.topic for d in chosen.deletions})
                if self.config.retention.consumer_aware:
                    self.planner.committed = self.broker.committed_offsets(topics)
                self.planner.led_here = self._led_here(topics)
            if decided != mode or self.planner.committed or self.planner.led_here is not None:
                if (decided.mode == OFFLINE) != (mode.mode == OFFLINE):
                    if act and decided.mode == OFFLINE and self._may_need_space():
                        self._sweep_offline()
                    result = self._scan_with_policies(full, decided)
                mode = decided
                chosen, warnings = self.planner.plan(result, mode.mode)
        all_warnings = [*result.warnings, *warnings]
        self._quiet = frozenset()
        if act and self.stuck is not None:
            self._quiet = self.stuck.observe(mode, chosen, time.monotonic())
        if mode.mode == REFUSED:
            # Name a broken .lock (a FIFO...) rather than blame a broker that may not exist.
            for log_dir in self.config.broker.log_dirs:
                problem = lockfile.unprobeable(log_dir)
                if problem:
                    all_warnings.append(problem)
        results: tuple[Any, ...] = ()
        if act and chosen.deletions:
            results = self._act(mode, chosen, result)
        measured = self._measure(result) if act else None
        outcome = CycleOutcome(
            mode=mode,
            scan=result,
            plan=chosen,
            results=results,
            warnings=tuple(all_warnings),
            duration_s=time.monotonic() - started,
            measured=measured,
        )
        if act:
            self._log_cycle(outcome)
        return outcome

    def _measure(self, result: ScanResult) -> dict[str, FilesystemUsage | None]:
        """statvfs of every filesystem again, after acting: exit codes and events report
        what the disk says now, not what the plan hoped deleting would free."""
        out: dict[str, FilesystemUsage | None] = {}
        for fs in result.filesystems:
            out[fs.usage.mount] = None
            for log_dir in fs.log_dirs:
                try:
                    out[fs.usage.mount] = fsusage.usage_of(
                        log_dir.path, fs.usage.mount, fs.usage.device
                    )
                    break
                except OSError:
                    continue
        return out

    def _scan_with_policies(self, full: bool, mode: ModeDecision) -> ScanResult:
        """Scan; in broker mode first let the broker say which topics are compacted or tiered
        (DescribeConfigs, cached in the state dir) and rescan if that changed anything.

        Asked only for topics not known yet and, every few minutes, for all; a broker that
        does not answer leaves them unknown, hence protected.
        """
        kraft = mode.mode in (OFFLINE, DRY_RUN)
        result = self.planner.scan(full=full, offline=mode.mode == OFFLINE, kraft=kraft)
        store = self.planner.policies
        if mode.mode != BROKER or self.broker is None or store is None:
            return result
        topics = {p.topic for fs in result.filesystems for d in fs.log_dirs for p in d.partitions}
        if not store.due(topics)[0] or not self.broker_reachable():
            return result
        default, _node = self.planner.broker_facts()
        if store.refresh(self.broker, topics, default):
            result = self.planner.scan(full=full, offline=False, kraft=False)
        return result

    def _may_need_space(self) -> bool:
        """Cheap pre-check (one statvfs per log dir) before the offline sweep lists dirs.

        An open journal entry (a crash mid-deletion or mid-sweep) also says yes, whatever the
        usage now: recovery must give every audit intent its outcome and finish the sweep.
        """
        if self.config.retention.max_bytes is not None:
            return True
        if self.offline.has_open_entries():
            return True
        limit = self.config.retention.disk_usage_percent
        for log_dir in self.config.broker.log_dirs:
            try:
                if fsusage.filesystem_usage(str(log_dir)).usage_percent > limit:
                    return True
            except OSError:
                continue
        return False

    def _sweep_offline(self) -> None:
        """Offline, nobody else will reclaim what is "on its way out": finish it now.

        Half-done deletions from the journal, ``-delete`` dirs and leftover ``*.deleted``
        segment files are exactly what Kafka removes itself at start-up, so removing them
        first (audited, ``kind: swept``) frees space without choosing a single live segment;
        the scan that follows sees what is left.
        """
        try:
            done = self.offline.recover(
                [str(d) for d in self.config.broker.log_dirs], sweep_deleted=True
            )
        except OSError as exc:
            log.error("offline_recover_failed", error=exc.strerror or str(exc))
            return
        if done:
            log.info("offline_recovered", segments=len(done))

    def _act(self, mode: ModeDecision, chosen: Plan, result: ScanResult) -> tuple[Any, ...]:
        usage_before = {fs.mount: fs.usage_percent for fs in chosen.filesystems}
        if mode.mode == REFUSED:
            if {d.mount for d in chosen.deletions} <= self._quiet:
                return ()  # stuck, already said (retention_stuck)
            log.error(
                "retention_refused",
                reason=mode.reason,
                segments=len(chosen.deletions),
                bytes=sum(d.bytes for d in chosen.deletions),
            )
            return ()
        if mode.mode == DRY_RUN:
            return ()
        for d in chosen.deletions:
            if d.unconsumed_records:
                log.warning(
                    "unconsumed_data_deleted",
                    topic=d.topic,
                    partition=d.partition,
                    base_offset=d.base_offset,
                    unconsumed_records=dict(d.unconsumed_records),
                )
        if mode.mode == OFFLINE:
            return tuple(self.offline.execute(list(chosen.deletions), usage_before))
        return self._act_broker(chosen.deletions, usage_before)

    def _act_broker(
        self, deletions: Sequence[Deletion], usage_before: dict[str, float]
    ) -> tuple[Any, ...]:
        assert self.broker is not None
        ids = []
        try:
            for d in deletions:
                ids.append(self.audit.before(d, _why(d), usage_before.get(d.mount, 0.0), BROKER))
        except AuditWriteFailed as exc:
            log.error("retention_refused", reason=f"audit log not writable: {exc}")
            return ()
        results = self.broker.delete_records(list(deletions))
        self.reclaim.requested([r.deletion for r in results if r.ok], time.monotonic())
        for action_id, res in zip(ids, results, strict=True):
            try:
                self.audit.after(action_id, res.ok, res.freed_bytes, res.error)
            except AuditWriteFailed as exc:
                log.error("audit_write_failed", error=str(exc))
        self.requested.record([r.deletion for r in results if r.ok])
        return tuple(results)

    def _log_cycle(self, outcome: CycleOutcome) -> None:
        for res in outcome.results:
            d = res.deletion
            if res.ok:
                log.info(
                    "segment_deleted",
                    topic=d.topic,
                    partition=d.partition,
                    base_offset=d.base_offset,
                    next_offset=d.next_offset,
                    bytes=d.bytes,
                    mode=res.mode,
                    log_dir=d.log_dir,
                    mount=d.mount,
                )
            else:
                log.error(
                    "segment_delete_failed",
                    topic=d.topic,
                    partition=d.partition,
                    base_offset=d.base_offset,
                    mode=res.mode,
                    error=res.error,
                )
        for fs in outcome.plan.filesystems:
            if (not fs.over_limit and not fs.chosen_count) or fs.mount in self._quiet:
                continue
            measured = outcome.usage_after(fs)
            after = round(measured.usage_percent, 3) if measured is not None else None
            log.info(
                "retention_cycle",
                mount=fs.mount,
                mode=outcome.mode.mode,
                usage_before=fs.usage_percent,
                usage_after=after,
                limit_percent=fs.limit_percent,
                target_percent=fs.target_percent,
                pending_reclaim_bytes=fs.pending_reclaim_bytes,
                excess_bytes=fs.excess_bytes,
                chosen_count=fs.chosen_count,
                chosen_bytes=fs.chosen_bytes,
                duration_ms=round(outcome.duration_s * 1000, 1),
            )
            if not fs.reachable:
                log.error(
                    "retention_target_unreachable",
                    mount=fs.mount,
                    unreachable_bytes=fs.unreachable_bytes,
                    reason="only active, protected or hard-linked segments are left",
                )


def _why(d: Deletion) -> str:
    if d.reason == "max_bytes":
        return "log dir over retention.max_bytes; globally oldest closed segment"
    return "filesystem over retention.disk_usage_percent; globally oldest closed segment"
