"""The ladder against a running broker (edge): the facts its rungs need, and the rungs'
actions (``tieredrung``: evict and restore; ``moverung``: move; ``cordon``) in plan order.

Broker mode only: every rung but deletion is something the broker does (drop uploaded
segments, move a replica, keep new replicas off a dir). What the pure planner (``ladder``)
climbs with comes from here: the tiered topics (their policies, learned for protection
already) and how far each partition is uploaded (ListOffsets ``LATEST_TIERED``, which also
feeds the upload-stall alert), the broker's log dirs (DescribeLogDirs: online, cordoned,
replica sizes), the copy rate measured on earlier moves. Each cycle the scan is first marked
with what no deletion may take now (``protect``): replicas moving, and every partition of a
log dir the broker took offline.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from diskguard.broker.kafkapython import KafkaPythonAdmin
from diskguard.broker.ladderapi import LadderApi, LadderCallFailed, LogDirInfo
from diskguard.config import Config
from diskguard.kafkalog.dating import SegmentFileReader
from diskguard.kafkalog.model import Filesystem, Partition, segment_file_name
from diskguard.kafkalog.scan import ScanResult
from diskguard.logs import get_logger
from diskguard.retention.audit import AuditLog
from diskguard.retention.ceilings import Ceilings
from diskguard.retention.cordon import Cordon
from diskguard.retention.ladder import (
    HOT_S,
    BalanceFacts,
    LadderPlan,
    MoveCandidate,
    TargetDir,
    TieredFacts,
    climb,
)
from diskguard.retention.ladderstate import LADDER_FILE, LadderState, move_key
from diskguard.retention.logdirwatch import MetadataWatch, OfflineDirs
from diskguard.retention.mode import BROKER
from diskguard.retention.moverung import MoveRung, moving_bytes, real, replicas_wanted
from diskguard.retention.requested import RequestedLogStart
from diskguard.retention.rungaudit import RungResult
from diskguard.retention.tieredrung import TieredRung
from diskguard.retention.uploads import Lag, UploadWatch, lags

if TYPE_CHECKING:
    from diskguard.broker.client import BrokerClient
    from diskguard.broker.ladderapi import EarlyAnswer
    from diskguard.retention.forecaster import Forecaster
    from diskguard.retention.inputs import PlanInputs

log = get_logger("diskguard.ladder")

#: Upload offsets are asked at most this often while no filesystem needs space.
UPLOADS_EVERY_S = 10.0
#: The metadata log's topic: never moved, never a candidate (a full ``metadata.log.dir``
#: halts the broker).
METADATA_TOPIC = "__cluster_metadata"


class Ladder:
    """One config's lossless rungs against its broker (``api`` None: no broker configured)."""

    def __init__(
        self,
        config: Config,
        api: LadderApi | None,
        audit: AuditLog,
        requested: RequestedLogStart,
        *,
        read_only: bool,
        broker_id: int | None,
    ) -> None:
        self.config = config
        self.cfg = config.ladder
        self.api = api
        self.read_only = read_only
        self.broker_id = broker_id
        self.state = LadderState(Path(config.daemon.state_dir) / LADDER_FILE, not read_only)
        if self.state.problem:
            log.warning("ladder_state_unreadable", problem=self.state.problem)
        self._tiered = TieredRung(api, self.state, audit, requested) if api else None
        self._moves = (
            MoveRung(api, broker_id, self.state, audit)
            if api is not None and broker_id is not None
            else None
        )
        self._cordon = (
            Cordon(api, broker_id, self.state)
            if api is not None and broker_id is not None and self.cfg.cordon
            else None
        )
        self._metadata = MetadataWatch()
        #: mount -> alert level, as the daemon's flow state last saw it (None: no daemon, so
        #: no cordon is set or lifted).
        self.alert_levels: dict[str, int] | None = None
        self.uploads = UploadWatch(self.cfg.upload_stall_after)
        self._uploaded: tuple[float, dict[tuple[str, int], int]] | None = None
        self._dirs_at = 0.0
        #: The broker's log dirs as the last ``observe`` found them (None: not known).
        self.dirs: list[LogDirInfo] | None = None
        self._offline = OfflineDirs()
        self._failing: set[str] = set()
        self._bound: tuple[Ceilings, Forecaster, PlanInputs] | None = None
        #: The latest upload lags, for ``plan`` and ``status``.
        self.lags: list[Lag] = []

    @classmethod
    def for_broker(
        cls,
        config: Config,
        broker: BrokerClient | None,
        audit: AuditLog,
        requested: RequestedLogStart,
        read_only: bool,
        broker_id: int | None,
        log_dirs: tuple[int, EarlyAnswer] | None = None,
    ) -> Ladder:
        """``log_dirs``: the broker's log dirs asked already (a one-shot plan's child,
        ``earlylogdirs``), for that broker id."""
        api = None
        if broker is not None and config.broker.bootstrap_servers:
            kafka = KafkaPythonAdmin(
                config.broker.bootstrap_servers, config.broker.client, broker.timeout, "the ladder"
            )
            api = LadderApi(broker.admin, kafka, broker.timeout, broker.patience)
            if read_only and broker_id is not None:
                # A one-shot plan observes the broker's log dirs after its scan: asked now.
                asked = log_dirs[1] if log_dirs is not None and log_dirs[0] == broker_id else None
                api.log_dirs_soon(broker_id, asked)
        return cls(config, api, audit, requested, read_only=read_only, broker_id=broker_id)

    def bind(self, ceilings: Ceilings, forecaster: Forecaster, inputs: PlanInputs) -> None:
        """What the cycle owns that a plan reads: the limits, the broker's reclaim settings,
        the known topic policies and segment ages."""
        self._bound = (ceilings, forecaster, inputs)

    def in_flight(self) -> bool:
        """Something the ladder started is not finished: a topic's local retention lowered,
        a replica move, a cordon of ours. Each cycle's ``settle`` carries it on."""
        return bool(self.state.lowered() or self.state.moves() or self.state.cordoned())

    def moving_bytes(self) -> dict[str, int]:
        """Per source mount: bytes of replicas being moved off it (on their way out)."""
        return moving_bytes(self.state)

    def close(self) -> None:
        if self.api is not None:
            self.api.close()

    # -- saying things once ----------------------------------------------------------
    def _first_failure(self, call: str) -> bool:
        """A call failing: said when it starts failing, not every cycle."""
        first = call not in self._failing
        self._failing.add(call)
        return first

    def _ok(self, event: str) -> None:
        self._failing.discard(event)

    # -- facts ------------------------------------------------------------------------
    def observe(self, scan: ScanResult, max_age: float) -> ScanResult:
        """Each broker-mode scan: the broker's log dirs (DescribeLogDirs to this broker, at
        most every ``max_age`` s), and the scan marked with what no deletion may take."""
        if self.api is None or self.broker_id is None:
            return scan
        now = time.monotonic()
        if self.state.moves():
            max_age = 0.0  # a move in flight: see it finish at the next cycle, and time it
        if self.dirs is None or now - self._dirs_at >= max_age:
            self._dirs_at = now
            try:
                wanted = replicas_wanted(scan, self.cfg.balance_log_dirs, self.state.moves())
                self.dirs = self.api.log_dirs(self.broker_id, wanted)
                self._ok("log_dirs")
            except LadderCallFailed as exc:
                if self._first_failure("log_dirs"):
                    log.warning("log_dirs_unavailable", broker_id=self.broker_id, error=str(exc))
                self.dirs = None
        return self.protect(scan, self.dirs)

    def tiered_topics(self, policies: Mapping[str, object]) -> frozenset[str]:
        return frozenset(
            t for t, p in policies.items() if getattr(p, "remote_storage_enable", False)
        )

    def tiered_facts(
        self, scan: ScanResult, topics: frozenset[str], fresh: bool
    ) -> TieredFacts | None:
        """How far each tiered partition on the guarded disks is uploaded; asked at most
        every ``UPLOADS_EVERY_S`` unless ``fresh`` (a filesystem needs space now)."""
        if self.api is None or not topics:
            return None
        parts = [p for p in _partitions(scan) if p.topic in topics]
        if not parts:
            return None
        now = time.monotonic()
        cached = self._uploaded
        if cached is not None and not fresh and now - cached[0] < UPLOADS_EVERY_S:
            uploaded = cached[1]
        else:
            try:
                uploaded = self.api.tiered_offsets({(p.topic, p.partition) for p in parts})
                self._ok("tiered_offsets")
            except LadderCallFailed as exc:
                if self._first_failure("tiered_offsets"):
                    log.warning(
                        "tiered_offsets_unavailable",
                        error=str(exc),
                        consequence="nothing is evicted from tiered topics (what is uploaded "
                        "is unknown); they stay protected",
                    )
                return None
            self._uploaded = (now, uploaded)
            self._watch_uploads(parts, uploaded, now)
        return TieredFacts(topics, uploaded, int(time.time() * 1000))

    def _watch_uploads(
        self, parts: list[Partition], uploaded: Mapping[tuple[str, int], int], now: float
    ) -> None:
        self.lags = lags(parts, uploaded)
        stalled, resumed = self.uploads.observe(self.lags, now)
        for stall in stalled:
            log.warning(
                "tiered_upload_stalled",
                topic=stall.lag.topic,
                partition=stall.lag.partition,
                uploaded_offset=stall.lag.uploaded_offset,
                segments_waiting=stall.lag.segments,
                stalled_for_s=round(stall.for_s, 1),
                consequence="closed segments not uploaded cannot be evicted: the disk fills "
                "with them (check the broker's remote storage and RemoteLogManager logs)",
            )
        for lag in resumed:
            log.info(
                "tiered_upload_resumed",
                topic=lag.topic,
                partition=lag.partition,
                uploaded_offset=lag.uploaded_offset,
            )

    def balance_facts(
        self,
        scan: ScanResult,
        ceilings: Ceilings,
        mode: str,
        dirs: list[LogDirInfo] | None,
        delete_delay_s: float,
    ) -> BalanceFacts | None:
        """Replicas that could move and the log dirs that could take them (online, not
        cordoned, known to the scan)."""
        if not self.cfg.balance_log_dirs or not dirs:
            return None
        scanned = {real(d.path): (fs, d) for fs in scan.filesystems for d in fs.log_dirs}
        if len({fs.usage.device for fs, _d in scanned.values()}) < 2:
            return None
        moving = self.state.moves()
        incoming: dict[str, int] = {}
        for move in moving.values():
            incoming[real(move.target_dir)] = incoming.get(real(move.target_dir), 0) + move.bytes
        for info in dirs:
            for rep in info.replicas:
                if rep.future and move_key(rep.topic, rep.partition) in moving:
                    key = real(info.path)
                    incoming[key] = max(0, incoming.get(key, 0) - rep.bytes)
        busy = {(m.topic, m.partition) for m in moving.values()}
        candidates: list[MoveCandidate] = []
        targets: list[TargetDir] = []
        for info in dirs:
            found = scanned.get(real(info.path))
            if found is None or not info.online:
                continue
            fs, log_dir = found
            if not info.cordoned:
                limits = ceilings.limits(mode, fs.usage.mount)
                targets.append(
                    TargetDir(log_dir.path, fs.usage, limits, incoming.get(real(info.path), 0))
                )
            growing = ceilings.limits(mode, fs.usage.mount).growth_bytes_per_s > 0
            if not growing and not ceilings.above_target(fs.usage):
                continue  # nothing will move off this disk: no stat for it
            by_key = {(p.topic, p.partition): p for p in log_dir.partitions}
            for rep in info.replicas:
                part = by_key.get((rep.topic, rep.partition))
                if rep.future or part is None or (rep.topic, rep.partition) in busy:
                    continue
                if rep.topic == METADATA_TOPIC or rep.bytes <= 0:
                    continue
                candidates.append(
                    MoveCandidate(rep.topic, rep.partition, log_dir.path, rep.bytes, _hot(part))
                )
        rate = self.state.move_rate() or float(self.cfg.assumed_move_rate)
        return BalanceFacts(tuple(candidates), tuple(targets), rate, delete_delay_s)

    def protect(self, scan: ScanResult, dirs: list[LogDirInfo] | None) -> ScanResult:
        """The scan with what no deletion may take this cycle marked protected: replicas
        moving (their bytes are on their way out of this disk already) and every partition
        of a log dir the broker took offline (DeleteRecords cannot reach them)."""
        moving = {
            (real(m.source_dir), m.topic, m.partition): m.target_dir
            for m in self.state.moves().values()
        }
        offline = {real(d.path): d.error for d in dirs or () if not d.online}
        if not moving and not offline:
            return scan
        out: list[Filesystem] = []
        for fs in scan.filesystems:
            log_dirs = []
            for log_dir in fs.log_dirs:
                key = real(log_dir.path)
                parts = []
                for part in log_dir.partitions:
                    target = moving.get((key, part.topic, part.partition))
                    why = None
                    if key in offline:
                        why = f"log dir offline in the broker ({offline[key]}): not served"
                    elif target is not None:
                        why = f"moving to {target}: its space comes back when the copy is done"
                    if why is not None and not part.protected:
                        part = replace(part, protected=True, protected_reason=why)
                    parts.append(part)
                log_dirs.append(replace(log_dir, partitions=tuple(parts)))
            out.append(replace(fs, log_dirs=tuple(log_dirs)))
        return replace(scan, filesystems=tuple(out))

    # -- the plan, acting, undoing ----------------------------------------------------------
    def plan(self, scan: ScanResult, mode: str) -> LadderPlan:
        """What the lossless rungs would do now (broker mode only; ``observe`` first)."""
        if mode != BROKER or self.api is None or self._bound is None:
            return LadderPlan()
        ceilings, forecaster, inputs = self._bound
        standing_of = ceilings.standing_of(mode)
        need = any(standing_of(fs).over for fs in scan.filesystems)
        tiered = None
        if self.cfg.tiered_eviction:
            policies = inputs.policies.policies if inputs.policies is not None else {}
            tiered = self.tiered_facts(scan, self.tiered_topics(policies), fresh=need)
        delay = forecaster.reclaim.settings.delete_delay_s
        balance = self.balance_facts(scan, ceilings, mode, self.dirs, delay)
        if not need and balance is None:
            return LadderPlan()
        read = SegmentFileReader(None if self.read_only else inputs.ages)
        return climb(
            scan.filesystems, standing_of, read, tiered, balance, ceilings.standing_at(mode)
        )

    def act(self, ladder: LadderPlan, usage_before: Mapping[str, float]) -> list[RungResult]:
        """Carry out the plan's evictions and moves, each audited and recorded first."""
        results: list[RungResult] = []
        if self._tiered is not None:
            for ev in ladder.evictions:
                result = self._tiered.evict(ev, usage_before)
                results.append(result)
                if result.ok and self._bound is not None:
                    # The broker drops them at its retention check, like DeleteRecords'd
                    # segments: timing them teaches the forecast that check's phase too.
                    self._bound[1].reclaim.requested(ev.segments, time.monotonic())
        if self._moves is not None and ladder.moves:
            results.extend(self._moves.move(ladder.moves, usage_before))
        return results

    def settle(self, scan: ScanResult, mode: str) -> None:
        """After each broker-mode cycle: restore lowered topics whose disks are back under
        their target, finish the moves the broker completed, say which dirs it took
        offline."""
        if self.read_only or self._bound is None:
            return
        ceilings, forecaster, _inputs = self._bound
        self._watch_metadata(scan, ceilings)
        if mode != BROKER:
            return
        self._offline.observe(self.dirs)
        if self._cordon is not None and self.alert_levels is not None:
            by_mount = {fs.usage.mount: [d.path for d in fs.log_dirs] for fs in scan.filesystems}
            self._cordon.converge(self.alert_levels, by_mount, self.dirs)
        if self._tiered is not None:
            over = {fs.usage.mount for fs in scan.filesystems if ceilings.above_target(fs.usage)}
            # Two of the broker's worst reclaim latencies, and at least a minute.
            late = max(60.0, 2 * forecaster.reclaim.settings.worst_latency_s)
            self._tiered.settle(over, late)
        if self._moves is not None and self.dirs is not None:
            self._moves.settle(self.dirs)

    def _watch_metadata(self, scan: ScanResult, ceilings: Ceilings) -> None:
        """The KRaft metadata log's filesystem at alert level >= 1 or over its ceiling."""
        for fs in scan.filesystems:
            for log_dir in fs.log_dirs:
                if any(p.topic == METADATA_TOPIC for p in log_dir.partitions):
                    mount = fs.usage.mount
                    level = (self.alert_levels or {}).get(mount, 0)
                    where = os.path.join(log_dir.path, f"{METADATA_TOPIC}-0")
                    over = ceilings.over_usage(fs.usage)
                    self._metadata.observe(where, mount, level, over, fs.usage.usage_percent)
                    return


def _partitions(scan: ScanResult) -> list[Partition]:
    return [p for fs in scan.filesystems for d in fs.log_dirs for p in d.partitions]


def _hot(part: Partition, now: Callable[[], float] = time.time) -> bool:
    """Written to within ``HOT_S``: its active segment's ``.log`` changed recently."""
    active = part.active_base_offset
    if active is None:
        return False
    try:
        mtime = os.stat(os.path.join(part.path, segment_file_name(active, ".log"))).st_mtime
    except OSError:
        return False
    return now() - mtime < HOT_S
