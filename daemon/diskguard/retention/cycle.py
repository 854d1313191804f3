"""One KIP-61 retention cycle: decide the mode, scan, plan, act, account.

``plan`` (never acts), ``enforce --once`` and the daemon all run ``RetentionCycle.run``, so
they share one set of safety rules. The flow, once per cycle: decide the mode (asking the
broker only when a cheap usage check says this cycle may delete), let the mode's executor
finish what an earlier run left half done, scan, plan with the pure planner, act through the
mode's ``Executor`` (broker: DeleteRecords; offline: files), measure again, log.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from diskguard.config import Config
from diskguard.host import fsusage
from diskguard.kafkalog import lockfile
from diskguard.kafkalog.dating import SegmentFileReader, warm_heads
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.kafkalog.scan import ScanResult, still_listed
from diskguard.kafkalog.serverprops import local_broker_id
from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog
from diskguard.retention.inputs import PlanInputs
from diskguard.retention.mode import BROKER, DRY_RUN, OFFLINE, REFUSED, ModeDecision, decide_mode
from diskguard.retention.outcome import CycleOutcome, log_cycle
from diskguard.retention.parallelheads import parallel_heads
from diskguard.retention.planner import CommittedOffsets, LocalHeads, Plan, over_ceiling, plan
from diskguard.retention.policystore import CACHE_FILE, PolicyStore
from diskguard.retention.reclaim import Forecast, GrowthEstimator
from diskguard.retention.reclaimwatch import ReclaimWatch, reclaim_settings
from diskguard.retention.requested import RequestedLogStart
from diskguard.retention.stuck import DELETE_FAILED, StuckTracker
from diskguard.retention.sweeptargets import preview_sweep

if TYPE_CHECKING:
    from diskguard.broker.client import BrokerClient
    from diskguard.retention.executor import Executor
    from diskguard.retention.fileexecutor import FileExecutor

log = get_logger("diskguard.retention")


class RetentionCycle:
    """One config's retention cycle, with the long-lived edge objects it needs (executors,
    audit log, broker client, caches), wired once from the config."""

    def __init__(self, config: Config, read_only: bool = False) -> None:
        self.config = config
        self.read_only = read_only
        #: Seconds per quiet cycle spent dating partition heads ahead of need (``warm_heads``);
        #: the daemon sets it, one-shot commands have no later cycle to prepare for.
        self.warm_heads_s = 0.0
        state_dir = Path(config.daemon.state_dir)
        if not read_only:
            state_dir.mkdir(parents=True, exist_ok=True)
        self.requested = RequestedLogStart(state_dir / "requested-log-start.json")
        self.broker: BrokerClient | None = None
        if config.broker.bootstrap_servers:
            from diskguard.broker.client import BrokerClient  # only where a broker is set

            self.broker = BrokerClient(
                config.broker.bootstrap_servers, dict(config.broker.client), timeout=5.0
            )
        self.audit = AuditLog(state_dir / "audit.jsonl")
        self.inputs = PlanInputs(
            config, self.requested, policies=PolicyStore(state_dir / CACHE_FILE, not read_only)
        )
        self._files: FileExecutor | None = None
        self.inputs.forecast_for = self.forecast
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

    @property
    def files(self) -> FileExecutor:
        """The offline executor, built at first use: ``plan`` (a dry run) never deletes,
        and need not load the journal, recovery and removal code (issue 15: start-up).
        The sweep before each offline plan reads the scan's listings: only partition dirs
        that hold ``*.deleted`` files (or changed since) are listed again."""
        if self._files is None:
            from diskguard.retention.fileexecutor import FileExecutor

            state_dir = Path(self.config.daemon.state_dir)
            self._files = FileExecutor(state_dir, self.audit, listings=self.inputs.cache)
        return self._files

    def __enter__(self) -> RetentionCycle:
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
        now, last = time.monotonic(), self._settings_from_broker_at
        if last is not None and now - last < max_age:
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

    def _decide_mode(self) -> ModeDecision:
        """The cycle's one mode decision, before the scan.

        ``plan`` always asks the broker. The daemon and ``enforce`` first take what the
        ``.lock`` says (no network round trip: probing a dead broker costs its timeout) and
        ask the broker only if a plan in that mode may choose deletions (``_may_delete``).
        """
        mode = self.decide(need_broker=self.read_only)
        if self.read_only or self.broker is None or mode.mode == DRY_RUN:
            return mode
        return self.decide(need_broker=True) if self._may_delete(mode.mode) else mode

    def _may_delete(self, mode: str) -> bool:
        """Cheap pre-check (one statvfs per filesystem, no listing): may a plan in ``mode``
        choose deletions? It errs towards yes: pending reclaim, which only the scan
        measures, counts as none; a filesystem that cannot be measured does not count."""
        if self.config.retention.max_bytes is not None:
            return True
        try:
            groups = fsusage.group_by_device([str(d) for d in self.config.broker.log_dirs])
        except OSError:
            return True
        for group in groups:
            try:
                usage = fsusage.usage_of(group.paths[0], group.mount, group.device)
            except OSError:
                continue
            if over_ceiling(usage, self.inputs.limits_of(mode, group.mount), 0)[0]:
                return True
        return False

    def _executor(self, mode: str) -> Executor | None:
        """The executor of ``mode`` (built per cycle for the broker: its client may change)."""
        if mode == OFFLINE:
            return self.files
        if mode == BROKER and self.broker is not None:
            from diskguard.retention.brokerexecutor import BrokerExecutor

            return BrokerExecutor(self.broker, self.audit, self.requested, self.reclaim)
        return None

    # -- cycle ----------------------------------------------------------------
    def run(self, act: bool = True, full: bool = False) -> CycleOutcome:
        started = time.monotonic()
        mode = self._decide_mode()
        self.reclaim.check(time.monotonic())
        if mode.mode == BROKER:
            self.refresh_reclaim_settings()
        executor = self._executor(mode.mode) if act else None
        if executor is not None:
            self._finish_interrupted(executor)
        result = self._scan_with_policies(full, mode)
        if self.read_only and mode.mode == OFFLINE:  # plan: the sweep an offline cycle runs first
            result = preview_sweep(result, self.inputs.cache)
        if not self.read_only:
            self.requested.prune(result)
        chosen, warnings = self._plan(result, mode.mode)
        if chosen.deletions and mode.mode == BROKER:
            chosen, warnings = self._plan_with_broker_facts(result, chosen, warnings)
        if act and self.warm_heads_s > 0 and not chosen.deletions:
            warmer = SegmentFileReader(self.inputs.ages)
            warm_heads(
                (p for fs in result.filesystems for d in fs.log_dirs for p in d.partitions),
                warmer,
                self.warm_heads_s,
            )
            warnings = [*warnings, *warmer.warnings]
        all_warnings = [*result.warnings, *warnings]
        self._quiet = frozenset()
        if act and self.stuck is not None:
            self._set_quiet(self.stuck.observe(mode, chosen, time.monotonic()), chosen)
        if mode.mode == REFUSED:
            # Name a broken .lock (a FIFO...) rather than blame a broker that may not exist.
            for log_dir in self.config.broker.log_dirs:
                problem = lockfile.unprobeable(log_dir)
                if problem:
                    all_warnings.append(problem)
        results: tuple[Any, ...] = ()
        if act and chosen.deletions:
            results = self._act(mode, chosen, executor)
            self.inputs.set_aside_failed(results, result.filesystems)
            if self.stuck is not None and results:
                now = time.monotonic()
                self._set_quiet(
                    self._quiet | self.stuck.observe_results(mode, chosen, results, now), chosen
                )
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
            log_cycle(outcome, self._quiet)
        return outcome

    def _set_quiet(self, quiet: frozenset[str], chosen: Plan) -> None:
        """The mounts whose repeating events stay quiet (stuck, said already); the offline
        executor's refusals too wherever the state is ``delete_failed`` (``retention_stuck``
        said so with the error; the next cycle's sweep included: it runs before its plan)."""
        self._quiet = quiet
        states = self.stuck.states if self.stuck is not None else {}
        failing = {m for m, state in states.items() if state.reason == DELETE_FAILED}
        if self._files is not None:  # else no offline cycle yet: nothing to quiet
            self._files.quiet(
                frozenset(
                    d for fs in chosen.filesystems if fs.mount in failing for d in fs.log_dirs
                )
            )

    def _plan(
        self,
        result: ScanResult,
        mode: str,
        committed: CommittedOffsets | None = None,
        led_here: frozenset[tuple[str, int]] | None = None,
    ) -> tuple[Plan, list[str]]:
        """The pure planner over the scan, reading segment ages through the age cache.

        A one-shot dry run (``plan``) dates each head once, on two cores (``parallelheads``),
        except in broker mode (planned twice: ``_plan_with_broker_facts``)."""
        once = self.read_only and mode != BROKER
        reader = SegmentFileReader(None if once else self.inputs.ages)
        heads = parallel_heads(reader) if once else LocalHeads
        limits = self.inputs.limits(mode)
        chosen = plan(result.filesystems, limits, reader, committed or {}, led_here, heads)
        if not self.read_only:  # a one-shot dry run (plan) has no next plan to keep ages for
            self.inputs.ages.prune(still_listed(result) if self.warm_heads_s > 0 else None)
        return chosen, reader.warnings

    def _plan_with_broker_facts(
        self, result: ScanResult, chosen: Plan, warnings: list[str]
    ) -> tuple[Plan, list[str]]:
        """Broker mode, deletions chosen: plan the same scan once more, knowing for the
        chosen topics the consumer groups' committed offsets (``consumer_aware``) and which
        partitions this broker leads; both reorder equally old candidates.

        Why a second plan rather than these facts before the first: they are asked per
        topic, and only a plan says which topics matter. Asking for every topic on the disks
        would cost an OffsetFetch and a Metadata request sized by all of them on every cycle,
        most of which delete nothing. The mode and the scan stay as they are.
        """
        assert self.broker is not None
        topics = sorted({d.topic for d in chosen.deletions})
        committed: CommittedOffsets = {}
        if self.config.retention.consumer_aware:
            committed = self.broker.committed_offsets(topics)
        led_here = self._led_here(topics)
        if not committed and led_here is None:
            return chosen, warnings
        return self._plan(result, BROKER, committed, led_here)

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
        result = self.inputs.scan(full=full, offline=mode.mode == OFFLINE, kraft=kraft)
        store = self.inputs.policies
        if mode.mode != BROKER or self.broker is None or store is None:
            return result
        topics = {p.topic for fs in result.filesystems for d in fs.log_dirs for p in d.partitions}
        if not store.due(topics)[0] or not self.broker_reachable():
            return result
        default, _node = self.inputs.broker_facts()
        if store.refresh(self.broker, topics, default):
            result = self.inputs.scan(full=full, offline=False, kraft=False)
        return result

    def _finish_interrupted(self, executor: Executor) -> None:
        """Before the scan, the executor finishes what is on its way out. Offline, nobody
        else will: half-done deletions from the journal, ``-delete`` dirs and leftover
        ``*.deleted`` segment files are exactly what Kafka removes itself at start-up, so
        removing them first (audited, ``kind: swept``) frees space without choosing a single
        live segment; the scan that follows sees what is left. Only when space may be needed
        (``_may_delete``) or the journal has open entries (recovery must give every audit
        intent its outcome and finish the sweep)."""
        try:
            done = executor.finish_interrupted(
                [str(d) for d in self.config.broker.log_dirs],
                lambda: self._may_delete(executor.mode),
            )
        except OSError as exc:
            log.error("offline_recover_failed", error=exc.strerror or str(exc))
            return
        if done:
            log.info("offline_recovered", segments=len(done))

    def _act(self, mode: ModeDecision, chosen: Plan, executor: Executor | None) -> tuple[Any, ...]:
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
        if executor is None:  # dry-run
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
        return tuple(executor.execute(list(chosen.deletions), usage_before))
