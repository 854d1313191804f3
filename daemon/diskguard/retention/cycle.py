"""One KIP-61 retention cycle: decide the mode, scan, climb the ladder, plan, act, account.

Size: over 400 lines: the cycle's steps in the order they happen, each a few lines that call
the module doing the work (``modechoice``, ``ceilings``, ``forecaster``, ``ladderrun``,
``unfreed``, ``outcome``); splitting the sequence itself would hide the order that makes it
safe.

``plan`` runs ``RetentionCycle.plan`` (never acts); ``enforce --once`` and the daemon run
``RetentionCycle.enforce``; both share the mode decision, the scan and the planner, so they
share one set of safety rules. An enforcing cycle: decide the mode (asking the broker only
when a cheap usage check says this cycle may delete), let the mode's executor finish what an
earlier run left half done, scan, plan with the pure planner, act through the mode's
``Executor`` (broker: DeleteRecords; offline: files, then wait until the filesystem shows
them freed), measure again, log.

What differs between the daemon and a one-shot command is given at construction, not set
afterwards: the daemon's ``StuckTracker`` (quiets repeating events while stuck), the time a
quiet cycle may spend dating heads ahead of need, and what a one-shot command takes over
from a running daemon (its write rates and the partitions it set aside).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from diskguard.config import Config
from diskguard.kafkalog import lockfile
from diskguard.kafkalog.dating import Dated, SegmentFileReader
from diskguard.kafkalog.listing import ListingCache
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.kafkalog.scan import ScanResult, still_listed
from diskguard.kafkalog.serverprops import local_broker_id
from diskguard.kafkalog.warming import date_ahead, warm_heads
from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog
from diskguard.retention.ceilings import Ceilings, has_byte_budget
from diskguard.retention.daemonstate import TakenOver
from diskguard.retention.earlylogdirs import CLIENT_TIMEOUT_S
from diskguard.retention.forecaster import Forecaster
from diskguard.retention.inputs import PlanInputs
from diskguard.retention.ladder import LadderPlan, without_evicted
from diskguard.retention.ladderrun import Ladder
from diskguard.retention.mode import BROKER, DRY_RUN, OFFLINE, REFUSED, ModeDecision
from diskguard.retention.modechoice import ModeChooser
from diskguard.retention.offline.sweeptargets import preview_sweep
from diskguard.retention.outcome import CycleOutcome, log_cycle, measure_after
from diskguard.retention.parallelheads import (
    OWN_SHARE_AT_LEAST,
    OWN_SHARE_WORKER_LISTED,
    parallel_heads,
)
from diskguard.retention.planner import (
    CommittedOffsets,
    LocalHeads,
    Plan,
    WalkTrace,
    placed,
    plan,
    with_facts,
)
from diskguard.retention.policystore import CACHE_FILE, PolicyStore
from diskguard.retention.requested import RequestedLogStart
from diskguard.retention.rungaudit import RungResult, asked_by_mount
from diskguard.retention.stuck import DELETE_FAILED, StuckTracker
from diskguard.retention.unfreed import UnfreedSpace

if TYPE_CHECKING:
    from diskguard.broker.client import AskedLogStart, AskedOffsets, BrokerClient
    from diskguard.broker.ladderapi import EarlyAnswer
    from diskguard.broker.placement import Placement
    from diskguard.host.forked import Worker
    from diskguard.retention.executor import Executor
    from diskguard.retention.offline.fileexecutor import FileExecutor

log = get_logger("diskguard.retention")

#: The topics asked about, the leaders' answer to come and the groups' offsets (None where
#: ``consumer_aware`` is off): ``RetentionCycle._broker_facts_soon``.
FactsAsked = tuple[frozenset[str], Callable[..., "Placement"], "AskedOffsets | None"]


class RetentionCycle:
    """One config's retention cycle, with the long-lived edge objects it needs (executors,
    audit log, broker client, caches), wired once from the config."""

    def __init__(
        self,
        config: Config,
        *,
        read_only: bool = False,
        stuck: StuckTracker | None = None,
        warm_heads_s: float = 0.0,
        taken_over: TakenOver | None = None,
        on_partition: Callable[[float], None] | None = None,
        worker: Worker | None = None,
        broker: BrokerClient | None = None,
        reachability: Callable[[], bool | None] | None = None,
        listings: ListingCache | None = None,
        log_dirs: tuple[int, EarlyAnswer] | None = None,
    ) -> None:
        """``read_only``: a dry run's cycle (``plan``), which writes nothing to the state dir.
        ``stuck``: the daemon's tracker; its cycle events are then logged when a filesystem
        becomes stuck or that changes, not on every cycle. ``warm_heads_s``: CPU time a quiet
        cycle may spend dating partition heads ahead of need (the daemon's; a one-shot command
        has no later cycle to prepare for). ``taken_over``: what a running daemon knows that a
        one-shot command does not (its write rates, the partitions it set aside).
        ``on_partition``: called per partition dir scanned (a progress bar);
        ``worker``: a child forked before any thread existed (a one-shot ``plan``): large
        log dirs are listed and their heads dated on two cores, and it starts listing at
        once, while the broker is asked what comes first.
        ``broker``: the broker's client (default: one for ``broker.bootstrap_servers``).
        ``reachability``: whether the broker answers, when known without asking it (the
        daemon's background probe while it probes).
        ``listings``: a listing cache whose worker has started listing already (a one-shot
        ``plan`` starts it before loading this module).
        ``log_dirs``: the broker's log dirs asked already, for that broker id (a one-shot
        plan's second child, ``earlylogdirs``)."""
        self.config = config
        self.read_only = read_only
        self.warm_heads_s = warm_heads_s
        self.stuck = stuck
        state_dir = Path(config.daemon.state_dir)
        self.audit = AuditLog(state_dir / "audit.jsonl")
        if not read_only:
            state_dir.mkdir(parents=True, exist_ok=True)
            self.audit.prepare()  # the audit reserve, whenever the state dir exists
        self.requested = RequestedLogStart(state_dir / "requested-log-start.json")
        self.worker = worker
        #: A one-shot broker-mode plan's reads, for its second walk (``_plan``).
        self._dated: Dated = {}
        #: A one-shot broker-mode plan's last walk knowing no broker facts, and its warnings:
        #: what ``with_facts`` needs to spare it the second walk.
        self._traced: tuple[WalkTrace, list[str]] | None = None
        #: A one-shot broker-mode plan's leaders and offsets, asked before its scan.
        self._facts_soon: FactsAsked | None = None
        # Before the Kafka client: its module's import and the broker's answers overlap it.
        cache = listings
        if cache is None:
            cache = ListingCache.started(config.broker.log_dirs, has_byte_budget(config), worker)
        if broker is None and config.broker.bootstrap_servers:
            from diskguard.broker.client import BrokerClient  # only where a broker is set

            broker = BrokerClient(
                config.broker.bootstrap_servers,
                dict(config.broker.client),
                timeout=CLIENT_TIMEOUT_S,
            )
        self.broker = broker
        self.inputs = PlanInputs(
            config,
            self.requested,
            on_partition=on_partition,
            cache=cache,
            policies=PolicyStore(state_dir / CACHE_FILE, not read_only),
        )
        self._files: FileExecutor | None = None
        #: The broker-mode forecast: growth rates (from the daemon's usage samples, or what a
        #: running daemon measured) and the broker's reclaim latency.
        self.forecaster = Forecaster(config, taken_over.rates if taken_over else None)
        if taken_over is not None:
            self.inputs.set_aside.load(taken_over.set_aside, time.monotonic(), time.time())
        self.local_broker_id = local_broker_id(config.broker.log_dirs)
        #: The lossless rungs climbed before deletion (broker mode): evict, cordon, move.
        self.ladder = Ladder.for_broker(
            config, broker, self.audit, self.requested, read_only, self.local_broker_id, log_dirs
        )
        #: Over, by how much, what is pending: the limits of each filesystem in each mode.
        self.ceilings = Ceilings(config, self.forecaster.forecast, self.ladder.moving_bytes)
        self.ladder.bind(self.ceilings, self.forecaster, self.inputs)
        #: Which executor may act, decided once per cycle.
        self.modes = ModeChooser(
            config, self.broker, self.ceilings, ask_broker=read_only, reachability=reachability
        )
        self._quiet: frozenset[str] = frozenset()
        #: What offline deletions did not give back (and the wait for what they did).
        self.unfreed = UnfreedSpace(config, self.ceilings, self.audit.make_room)
        self._covered: Mapping[str, int] = {}

    @property
    def files(self) -> FileExecutor:
        """The offline executor, built at first use: ``plan`` (a dry run) never deletes,
        and need not load the journal, recovery and removal code (its start-up time).
        The sweep before each offline plan reads the scan's listings: only partition dirs
        that hold ``*.deleted`` files (or changed since) are listed again."""
        if self._files is None:
            from diskguard.retention.offline.fileexecutor import FileExecutor

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
        self.ladder.close()
        if self.broker is not None:
            self.broker.close()

    def refresh_reclaim_settings(self) -> None:
        """The broker's retention-check settings, asked at most every few minutes."""
        broker = self.broker
        if broker is not None:
            self.forecaster.refresh_settings(lambda: broker.broker_configs(self.local_broker_id))

    def _led_here(self, placement: Placement) -> frozenset[tuple[str, int]] | None:
        if self.local_broker_id is None or not placement:
            return None
        return frozenset(
            tp for tp, (leader, _replicas) in placement.items() if leader == self.local_broker_id
        )

    def _executor(self, mode: str) -> Executor | None:
        """The executor of ``mode`` (built per cycle for the broker: its client may change)."""
        if mode == OFFLINE:
            return self.files
        if mode == BROKER and self.broker is not None:
            from diskguard.retention.brokerexecutor import BrokerExecutor

            return BrokerExecutor(self.broker, self.audit, self.requested, self.forecaster.reclaim)
        return None

    # -- cycle ----------------------------------------------------------------
    def plan(self) -> CycleOutcome:
        """What a cycle would delete now, and why (``diskguard plan``): the mode (always asking
        the broker), the scan and the plan. Acts on nothing, logs no cycle event; an offline
        plan shows the sweep an offline cycle runs first as already done."""
        with self._one_timeout():
            started = time.monotonic()
            mode = self.modes.choose()
            result = self._scan(mode, full=False)
            if mode.mode == OFFLINE:
                result = preview_sweep(result, self.inputs.cache)
            ladder = self.ladder.plan(result, mode.mode)
            result, chosen, warnings = self._plan_mode(result, mode, ladder, full=False)
            outcome = self._outcome(mode, result, chosen, warnings, (), None, started)
            return replace(outcome, ladder=ladder)

    def enforce(self, full: bool = False) -> CycleOutcome:
        """One cycle that acts (``enforce --once``, the daemon): finish what an earlier run
        left half done, scan (``full``: stat every file, for a snapshot), plan, delete through
        the mode's executor, measure the disk again, log the cycle's events. A broker that
        does not answer costs the cycle one client timeout, not one per request."""
        with self._one_timeout():
            return self._enforce(full)

    def _one_timeout(self) -> AbstractContextManager[None]:
        return self.broker.one_timeout() if self.broker is not None else nullcontext()

    def _enforce(self, full: bool) -> CycleOutcome:
        started = time.monotonic()
        mode = self.modes.choose()
        executor = self._executor(mode.mode)
        if executor is not None:
            self._finish_interrupted(executor)
        if mode.mode == OFFLINE:
            self.unfreed.recheck(lambda: self.modes.may_delete(OFFLINE))
        trusted = self.inputs.cache.trusting
        result, ladder, chosen, warnings = self._scan_and_plan(mode, full)
        if trusted and (chosen.deletions or ladder.evictions or ladder.moves):
            # That scan took the hints' word (a quiet daemon's snapshot): a dir changed after
            # they were taken (a roll, a topic made again) is as last listed. Good enough to
            # count bytes, never to choose what goes: what acts is planned from a scan of now
            # (the trust ended with that scan).
            result, ladder, chosen, warnings = self._scan_and_plan(mode, full)
        if self.warm_heads_s > 0 and not chosen.deletions:
            warnings = [*warnings, *self._warm(result)]
        self._quiet = frozenset()
        if self.stuck is not None:
            self._set_quiet(self.stuck.observe(mode, chosen, time.monotonic()), chosen)
        usage_before = {fs.mount: fs.usage_percent for fs in chosen.filesystems}
        rungs = tuple(self.ladder.act(ladder, usage_before))
        results: tuple[Any, ...] = ()
        measured: dict[str, FilesystemUsage | None] = {}
        if chosen.deletions:
            before = self.unfreed.before(chosen) if mode.mode == OFFLINE else None
            results = self._act(mode, chosen, executor)
            self.inputs.set_aside_failed(results, result.filesystems)
            if self.stuck is not None and results:
                now = time.monotonic()
                self._set_quiet(
                    self._quiet | self.stuck.observe_results(mode, chosen, results, now), chosen
                )
            if before is not None:  # offline: wait for the space, stop where it did not come
                measured, chosen = self.unfreed.settle(chosen, results, before, self.forecaster)
                if self.stuck is not None:
                    self._quiet |= self.stuck.observe_halted(mode, chosen, time.monotonic())
            if self.warm_heads_s > 0:
                warnings = [*warnings, *self._date_ahead(result, results)]
        self.ladder.settle(result, mode.mode)
        measured = measured or measure_after(result)  # else: after the wait (offline)
        outcome = self._outcome(mode, result, chosen, warnings, results, measured, started, rungs)
        outcome = replace(outcome, ladder=ladder, rungs=rungs)
        if mode.mode == BROKER:  # how early a forecast's requests must start (send lead)
            self.forecaster.reclaim.model.observe_cycle(outcome.duration_s)
        log_cycle(outcome, self._quiet)
        return outcome

    def _scan_and_plan(
        self, mode: ModeDecision, full: bool
    ) -> tuple[ScanResult, LadderPlan, Plan, list[str]]:
        """An enforcing cycle's scan, the ladder's plan and the deletion plan."""
        result = self._scan(mode, full)
        ladder = self.ladder.plan(result, mode.mode)
        result, chosen, warnings = self._plan_mode(result, mode, ladder, full)
        return result, ladder, chosen, warnings

    def _scan(self, mode: ModeDecision, full: bool) -> ScanResult:
        """What a dry run and an enforcing cycle share before planning: the broker's reclaim
        timing and the scan (with the broker's topic policies)."""
        self.forecaster.reclaim.check(time.monotonic())
        if mode.mode == BROKER:
            policies = self._policies_soon() if self.read_only else None
            if self.read_only:
                self._facts_soon = self._broker_facts_soon()
            self.refresh_reclaim_settings()
            if policies is not None:
                policies()
        result = self._scan_with_policies(full, mode)
        if not self.read_only:
            self.requested.prune(result)
        if mode.mode == BROKER:
            # The broker's own view of its log dirs: offline ones, moves in flight.
            result = self.ladder.observe(result, self.config.retention.check_interval)
        return result

    def _plan_mode(
        self, result: ScanResult, mode: ModeDecision, ladder: LadderPlan, full: bool
    ) -> tuple[ScanResult, Plan, list[str]]:
        """The scan and plan of ``mode`` for what the ladder's lossless rungs leave; in broker
        mode with deletions chosen, first with what other brokers' guards trimmed
        (``_with_cluster_log_start``: then the scan returned is the new one), then with the
        broker's facts (``_plan_with_broker_facts``)."""
        self._covered = ladder.covered
        asked = None
        if mode.mode == BROKER and self.read_only and self.broker is not None:
            # A one-shot plan asks where its partitions start before it walks, so that the
            # answer has come when ``_with_cluster_log_start`` needs it.
            asked = self.broker.log_start_offsets_soon(
                (p.topic, p.partition)
                for fs in result.filesystems
                for d in fs.log_dirs
                for p in d.partitions
            )
            if self._facts_soon is not None and self._facts_soon[2] is not None:
                self._facts_soon[2].advance()  # each group's OffsetFetch, if ListGroups answered
        chosen, warnings = self._plan(_uncovered(result, ladder), mode.mode)
        if chosen.deletions and mode.mode == BROKER:
            rescanned = self._with_cluster_log_start(result, chosen, full, asked)
            if rescanned is not None:
                result = rescanned
                chosen, more = self._plan(_uncovered(result, ladder), BROKER)
                warnings = [*warnings, *more]
        if chosen.deletions and mode.mode == BROKER:
            chosen, warnings = self._plan_with_broker_facts(
                _uncovered(result, ladder), chosen, warnings
            )
        return result, chosen, warnings

    def _with_cluster_log_start(
        self, result: ScanResult, chosen: Plan, full: bool, asked: AskedLogStart | None = None
    ) -> ScanResult | None:
        """Before trimming, ask the leaders where the partitions of the filesystems about to
        be trimmed start now. Another broker's guard may have trimmed them (DeleteRecords is
        cluster-wide): this broker removes those segments at its next retention check, but
        its own checkpoint says so up to a minute later. Counted as pending reclaim, they are
        not a reason to trim again: the scan again with them (None: nothing moved)."""
        assert self.broker is not None
        mounts = {d.mount for d in chosen.deletions}
        parts = [
            p
            for fs in result.filesystems
            if fs.usage.mount in mounts
            for d in fs.log_dirs
            for p in d.partitions
        ]
        reported = self.broker.log_start_offsets(((p.topic, p.partition) for p in parts), asked)
        moved = {
            (p.topic, p.partition): reported[(p.topic, p.partition)]
            for p in parts
            if (p.topic, p.partition) in reported
            and reported[(p.topic, p.partition)] > (p.log_start_offset or 0)
            and p.base_offsets
            and p.base_offsets[0] < reported[(p.topic, p.partition)]
        }
        if not moved:
            return None
        before = {fs.usage.mount: fs.pending_reclaim_bytes for fs in result.filesystems}
        result = self.inputs.scan(full=full or self.ceilings.byte_budget, cluster_log_start=moved)
        if not self.read_only:
            self.requested.prune(result)
        # What no deletion may take (the broker's log dirs, as _scan marks them).
        result = self.ladder.observe(result, self.config.retention.check_interval)
        for fs in result.filesystems:
            gained = fs.pending_reclaim_bytes - before.get(fs.usage.mount, 0)
            if gained > 0:
                log.info(
                    "cluster_trims_pending",
                    mount=fs.usage.mount,
                    partitions=sorted(f"{t}-{p}" for t, p in moved)[:20],
                    partition_count=len(moved),
                    pending_reclaim_bytes=gained,
                    message="the leaders report log start offsets past this disk's segments "
                    "(another broker's trim): on their way out here too, not trimmed again",
                )
        return result

    def _warm(self, result: ScanResult) -> list[str]:
        """A quiet cycle dates partition heads ahead of need (``warm_heads``), so the first
        cycle over a limit finds them dated; returns the warnings of the files it read."""
        warmer = SegmentFileReader(self.inputs.ages)
        warm_heads(
            (p for fs in result.filesystems for d in fs.log_dirs for p in d.partitions),
            warmer,
            self.warm_heads_s,
        )
        return warmer.warnings

    def _date_ahead(self, result: ScanResult, results: tuple[Any, ...]) -> list[str]:
        """Once an acting cycle's space is back, date the segments the next crossing will
        reach (``date_ahead``), so that its plan does not; returns the reads' warnings."""
        taken: dict[tuple[str, str, int], int] = {}
        for res in results:
            if res.ok:
                d = res.deletion
                key = (d.log_dir, d.topic, d.partition)
                taken[key] = taken.get(key, 0) + 1
        reader = SegmentFileReader(self.inputs.ages)
        date_ahead(
            (p for fs in result.filesystems for d in fs.log_dirs for p in d.partitions),
            taken,
            reader,
            self.warm_heads_s,
        )
        return reader.warnings

    def _outcome(
        self,
        mode: ModeDecision,
        result: ScanResult,
        chosen: Plan,
        warnings: list[str],
        results: tuple[Any, ...],
        measured: dict[str, FilesystemUsage | None] | None,
        started: float,
        rungs: tuple[RungResult, ...] = (),
    ) -> CycleOutcome:
        """The cycle's outcome, with each filesystem's standing once it is over: the usage
        measured after acting (the scan's when nothing acted), net of what someone else will
        still remove, against the ceiling."""
        all_warnings = [*result.warnings, *warnings]
        if mode.mode == REFUSED:
            # Name a broken .lock (a FIFO...) rather than blame a broker that may not exist.
            for log_dir in self.config.broker.log_dirs:
                problem = lockfile.unprobeable(log_dir)
                if problem:
                    all_warnings.append(problem)
        asked = asked_by_mount(rungs)
        pending_left, settled = self.ceilings.settle(mode.mode, chosen, results, measured, asked)
        return CycleOutcome(
            mode=mode,
            scan=result,
            plan=chosen,
            results=results,
            warnings=tuple(all_warnings),
            duration_s=time.monotonic() - started,
            measured=measured,
            pending_left=pending_left,
            settled=settled,
        )

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
        """The pure planner over the scan; the daemon reads segment ages through its age cache.

        A one-shot dry run (``plan``) dates heads on two cores where it has a worker
        (``parallelheads``), each head once: broker mode plans twice
        (``_plan_with_broker_facts``) and its second walk takes what the first read
        (``self._dated``) rather than reading the files again."""
        if self.read_only:
            reader = SegmentFileReader(None, self._dated if mode == BROKER else None)
        else:
            reader = SegmentFileReader(self.inputs.ages)
        heads = (
            parallel_heads(
                reader,
                self.worker,
                dated_ahead=self.inputs.cache.listed_by_worker,
                at_least=OWN_SHARE_AT_LEAST if mode == BROKER else OWN_SHARE_WORKER_LISTED,
            )
            if self.read_only
            else LocalHeads
        )
        standing_of = self.ceilings.standing_of(mode)
        covered = self._covered  # what the ladder's lossless rungs free first
        # Traced where a second walk would read nothing new (``dated``): a one-shot plan's
        # walk knowing no broker facts yet.
        first = committed is None and led_here is None
        trace = WalkTrace() if self.read_only and mode == BROKER and first else None
        chosen = plan(
            result.filesystems,
            standing_of,
            reader,
            committed or {},
            led_here,
            heads,
            covered,
            trace,
        )
        if trace is not None:
            self._traced = (trace, reader.warnings)
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

        A one-shot plan walks once only where the facts cannot reorder its walk
        (``with_facts``: no head they mark was as old as another): the same plan.
        """
        assert self.broker is not None
        topics = sorted({d.topic for d in chosen.deletions})
        soon, self._facts_soon = self._facts_soon, None
        if soon is not None and soon[0].issuperset(topics):
            # A one-shot plan asked for every topic on its disks before its scan: the answers
            # for these (``_broker_facts_soon``).
            _asked, leaders_of, offsets_of = soon
            committed: CommittedOffsets = offsets_of(topics) if offsets_of is not None else {}
            placement = leaders_of(topics)
        else:
            # A one-shot plan sends the leaders' request first: both round trips overlap.
            placement_of = self.broker.placement_soon(topics) if self.read_only else None
            committed = {}
            if self.config.retention.consumer_aware:
                committed = self.broker.committed_offsets(topics)
            placement = placement_of() if placement_of else self.broker.placement(topics)
        led_here = self._led_here(placement)
        traced, self._traced = self._traced, None
        if committed or led_here is not None:
            standing_of = self.ceilings.standing_of(BROKER)
            same = None
            if traced is not None:
                trace, traced_warnings = traced
                same = with_facts(chosen, trace, standing_of, committed, led_here, self._covered)
            if same is not None:
                chosen, warnings = same, list(traced_warnings)
            else:
                chosen, warnings = self._plan(result, BROKER, committed, led_here)
        return self._placed(chosen, placement), warnings

    def _placed(self, chosen: Plan, placement: Placement) -> Plan:
        """Each deletion with the partition's leader and replicas, and the other brokers whose
        replicas its DeleteRecords shortens (plan, audit)."""
        if not placement:
            return chosen
        here = self.local_broker_id
        with_placement = []
        # Per partition, not per deletion: a plan deletes ~10 segments of each.
        facts: dict[tuple[str, int], tuple[int | None, tuple[int, ...], tuple[int, ...]]] = {}
        for d in chosen.deletions:
            known = facts.get((d.topic, d.partition))
            if known is None:
                leader, replicas = placement.get((d.topic, d.partition), (-1, ()))
                also = tuple(r for r in replicas if r != here)
                known = facts[(d.topic, d.partition)] = (
                    leader if leader >= 0 else None,
                    replicas,
                    also,
                )
            with_placement.append(placed(d, *known))
        return replace(chosen, deletions=tuple(with_placement))

    def _broker_facts_soon(self) -> FactsAsked | None:
        """A one-shot plan asks the leaders (DescribeTopics) and the consumer groups' offsets
        (ListGroups, then OffsetFetch per group) for every topic of the live partition dirs
        the scan will list, before it scans: only the plan says which topics it needs
        (``_plan_with_broker_facts``), and asked after its walk they were two round trips it
        waited for. Each answer is taken for the chosen topics only, as if only they had been
        asked (a topic only the scan finds: they are asked after the walk, as before)."""
        broker = self.broker
        if broker is None:
            return None
        topics = self.inputs.topics_on_disk()
        if not topics:
            return None
        offsets = broker.committed_offsets_soon() if self.config.retention.consumer_aware else None
        return frozenset(topics), broker.placement_soon(topics), offsets

    def _policies_soon(self) -> Callable[[], bool] | None:
        """A one-shot plan asks the topics' policies before it scans (DescribeConfigs, sent
        now, beside the broker's settings), for the topics of the live partition dirs the scan
        will list; calling the function returned takes the answer into the store. The scan
        then knows them and runs once (learnt after it, they cost a rescan); a topic only
        the scan finds is asked after it as before. None: nothing to ask."""
        store, broker = self.inputs.policies, self.broker
        if broker is None or store is None:
            return None
        topics = self.inputs.topics_on_disk()
        asked = store.due(topics)[0]
        if not asked or not self.modes.broker_reachable():
            return None
        answer = broker.describe_topic_configs_soon(asked)
        default, _node = self.inputs.broker_facts()
        return lambda: store.refresh(_Answered(broker, asked, answer), topics, default)

    def _scan_with_policies(self, full: bool, mode: ModeDecision) -> ScanResult:
        """Scan; in broker mode first let the broker say which topics are compacted or tiered
        (DescribeConfigs, cached in the state dir) and rescan if that changed anything.

        Asked only for topics not known yet and, every few minutes, for all; a broker that
        does not answer leaves them unknown, hence protected.
        """
        kraft = mode.mode in (OFFLINE, DRY_RUN)
        # A byte budget is checked on every file's size: only a full scan has them.
        full = full or self.ceilings.byte_budget
        result = self.inputs.scan(full=full, offline=mode.mode == OFFLINE, kraft=kraft)
        store = self.inputs.policies
        if mode.mode != BROKER or self.broker is None or store is None:
            return result
        topics = {p.topic for fs in result.filesystems for d in fs.log_dirs for p in d.partitions}
        if not store.due(topics)[0] or not self.modes.broker_reachable():
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
        (``ModeChooser.may_delete``) or the journal has open entries (recovery must give every audit
        intent its outcome and finish the sweep)."""
        try:
            done = executor.finish_interrupted(
                [str(d) for d in self.config.broker.log_dirs],
                lambda: self.modes.may_delete(executor.mode),
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


class _Answered:
    """The broker as a policy source whose answer for ``asked`` came already (sent by
    ``_policies_soon``); any other question is asked of ``broker``."""

    def __init__(
        self,
        broker: BrokerClient,
        asked: list[str],
        answer: Callable[[], dict[str, dict[str, str | None]]],
    ) -> None:
        self._broker = broker
        self._asked = asked
        self._answer = answer

    def describe_topic_configs(self, topics: Sequence[str]) -> dict[str, dict[str, str | None]]:
        if list(topics) == self._asked:
            return self._answer()
        return self._broker.describe_topic_configs(topics)


def _uncovered(result: ScanResult, ladder: LadderPlan) -> ScanResult:
    """``result`` without what the ladder's tiered rung evicts (no deletion candidate)."""
    if not ladder.evictions:
        return result
    return replace(result, filesystems=without_evicted(result.filesystems, ladder))
