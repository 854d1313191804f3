"""One KIP-61 retention cycle: scan, decide the mode, plan, act, account. Shared by
``plan`` (nothing acts), ``enforce --once`` and the daemon loop, so all three apply the same
safety rules.

The mode decision is where safety lives: with the broker running, files are deleted only
through the broker (DeleteRecords) because unlinking a segment the broker holds open frees
nothing and corrupts its view; direct deletion happens only while no other process holds
the log dir's ``.lock``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from diskguard.capacity import topicconfigs
from diskguard.config import Config
from diskguard.host.atomicfile import read_json, write_json_atomic
from diskguard.kafkalog.dating import AgeCache, SegmentFileReader
from diskguard.kafkalog.listing import ListingCache
from diskguard.kafkalog.model import Filesystem, FilesystemUsage
from diskguard.kafkalog.scan import ScanResult, scan
from diskguard.kafkalog.topicpolicy import ProtectionRule
from diskguard.retention.planner import (
    CommittedOffsets,
    Deletion,
    FilesystemPlan,
    Limits,
    Plan,
    plan,
)
from diskguard.retention.policystore import PolicyStore
from diskguard.retention.reclaim import Forecast

DRY_RUN = "dry-run"
BROKER = "broker"
OFFLINE = "offline"
REFUSED = "refused"


@dataclass(frozen=True)
class ModeDecision:
    mode: str
    reason: str


def decide_mode(
    configured: str, broker_reachable: bool | None, locked_log_dirs: Sequence[str]
) -> ModeDecision:
    """Pure: which executor may act now.

    ``broker_reachable`` is None when no bootstrap servers are configured.
    """
    if configured == DRY_RUN:
        return ModeDecision(DRY_RUN, "mode = dry-run")
    if configured == BROKER:
        if broker_reachable is None:
            return ModeDecision(REFUSED, "mode = broker but broker.bootstrap_servers is not set")
        return ModeDecision(BROKER, "mode = broker")
    if configured == OFFLINE:
        if locked_log_dirs:
            return ModeDecision(
                REFUSED,
                f"mode = offline but another process holds {locked_log_dirs[0]}/.lock "
                "(is the broker running?)",
            )
        return ModeDecision(OFFLINE, "mode = offline, no process holds the log dirs' .lock")
    # auto
    if broker_reachable:
        return ModeDecision(BROKER, "auto: broker reachable")
    if not locked_log_dirs:
        why = "broker not reachable" if broker_reachable is False else "no bootstrap servers"
        return ModeDecision(OFFLINE, f"auto: {why} and no process holds the log dirs' .lock")
    return ModeDecision(
        REFUSED,
        f"auto: {locked_log_dirs[0]}/.lock is held by another process but the broker is "
        "not reachable through bootstrap_servers; refusing to delete files under a live broker",
    )


def limits_for(config: Config, mode: str) -> Limits:
    retention = config.retention
    return Limits(
        limit_percent=retention.disk_usage_percent,
        target_percent=retention.effective_target_percent,
        max_bytes=retention.max_bytes,
        headroom_bytes=retention.offline_headroom if mode == OFFLINE else 0,
    )


def with_forecast(limits: Limits, forecast: Forecast | None) -> Limits:
    """``limits`` plus a broker-mode forecast (rate, reclaim latency, check period)."""
    if forecast is None:
        return limits
    return replace(
        limits,
        growth_bytes_per_s=forecast.growth_bytes_per_s,
        reclaim_latency_s=forecast.latency_s,
        reclaim_period_s=forecast.period_s,
        latency_source=forecast.latency_source,
        defer_forecast=forecast.near_check,
    )


class RequestedLogStart:
    """Log start offsets diskguard asked the broker for, until the broker has acted on them.

    The broker checkpoints its log start offsets only every minute and removes files only at
    its next retention check; without remembering our own requests the next cycle, a second
    later, would see the same bytes still in excess and delete more. Persisted so that
    ``enforce --once`` run from cron behaves the same as the daemon.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        raw: dict[str, dict[str, int]] = read_json(path, {})
        self._by_dir: dict[str, dict[tuple[str, int], int]] = {}
        for log_dir, parts in raw.items():
            for key, offset in parts.items():
                topic, _, partition = key.rpartition("-")
                self._by_dir.setdefault(log_dir, {})[(topic, int(partition))] = int(offset)

    def as_mapping(self) -> Mapping[str, Mapping[tuple[str, int], int]]:
        return self._by_dir

    def record(self, deletions: Sequence[Deletion]) -> None:
        for d in deletions:
            parts = self._by_dir.setdefault(d.log_dir, {})
            key = (d.topic, d.partition)
            parts[key] = max(parts.get(key, 0), d.next_offset)
        self._save()

    def prune(self, result: ScanResult) -> None:
        """Forget requests the broker has carried out (its first segment is past them)."""
        live: dict[str, dict[tuple[str, int], int]] = {}
        for fs in result.filesystems:
            for log_dir in fs.log_dirs:
                wanted = self._by_dir.get(log_dir.path, {})
                for part in log_dir.partitions:
                    offset = wanted.get((part.topic, part.partition))
                    if offset is not None and part.base_offsets and part.base_offsets[0] < offset:
                        live.setdefault(log_dir.path, {})[(part.topic, part.partition)] = offset
        if live != self._by_dir:
            self._by_dir = live
            self._save()

    def _save(self) -> None:
        data = {
            log_dir: {f"{t}-{p}": off for (t, p), off in sorted(parts.items())}
            for log_dir, parts in sorted(self._by_dir.items())
        }
        write_json_atomic(self.path, data)


@dataclass(frozen=True)
class CycleOutcome:
    mode: ModeDecision
    scan: ScanResult
    plan: Plan
    results: tuple[Any, ...] = ()
    warnings: tuple[str, ...] = ()
    duration_s: float = 0.0
    #: mount -> df's view measured (statvfs) after the cycle acted; a None value means the
    #: measurement failed. None when the cycle did not act (``plan``): then the scan's usage
    #: is the latest there is.
    measured: Mapping[str, FilesystemUsage | None] | None = None

    @property
    def refused(self) -> bool:
        return self.mode.mode == REFUSED and bool(self.plan.deletions)

    @property
    def failed(self) -> tuple[Any, ...]:
        return tuple(r for r in self.results if not r.ok)

    @property
    def freed_bytes(self) -> int:
        return sum(r.freed_bytes for r in self.results if r.ok)

    def usage_after(self, fs: FilesystemPlan) -> FilesystemUsage | None:
        """``fs`` as measured after the cycle (None: the measurement failed)."""
        if self.measured is None:
            return FilesystemUsage(
                fs.mount, fs.device, fs.total_bytes, fs.used_bytes, fs.available_bytes
            )
        return self.measured.get(fs.mount)

    def pending_after(self, fs: FilesystemPlan) -> int:
        """Bytes of ``fs`` someone else will still remove after this cycle.

        Broker mode: what was pending at the scan plus what the broker accepted to delete now
        (it removes the files at its next retention check). Offline nobody else removes
        anything: what counts is what is gone.
        """
        if self.mode.mode == OFFLINE:
            return 0
        accepted: int = sum(
            r.freed_bytes for r in self.results if r.ok and r.deletion.mount == fs.mount
        )
        return fs.pending_reclaim_bytes + accepted

    def at_or_under_limit(self, fs: FilesystemPlan) -> bool:
        """Measured usage, net of ``pending_after``, at or under the usage limit.

        The measurement, not the plan, decides: a deletion can free less than planned (a file
        still open elsewhere, a hard link made since the scan) and the disk keeps filling
        while the cycle runs. A failed measurement is not "under".
        """
        usage = self.usage_after(fs)
        if usage is None:
            return False
        capacity = usage.used_bytes + usage.available_bytes
        if capacity <= 0:
            return True
        used = max(0, usage.used_bytes - self.pending_after(fs))
        return 100.0 * used / capacity <= fs.limit_percent

    def exit_code(self) -> int:
        """``enforce --once``: 0 at/under limit measured after the cycle (net of what the
        broker will remove), 1 limit unreachable / a deletion failed / still over, 3 refused.
        """
        if self.refused:
            return 3
        if not self.plan.reachable or self.failed:
            return 1
        if self.mode.mode == DRY_RUN and self.plan.deletions:
            return 1
        if not all(self.at_or_under_limit(fs) for fs in self.plan.filesystems):
            return 1
        return 0


def plan_json(outcome_plan: Plan) -> dict[str, Any]:
    """The ``plan --json`` contract."""
    return {
        "filesystems": [
            {
                "mount": fs.mount,
                "device": fs.device,
                "log_dirs": list(fs.log_dirs),
                "total_bytes": fs.total_bytes,
                "used_bytes": fs.used_bytes,
                "available_bytes": fs.available_bytes,
                "usage_percent": fs.usage_percent,
                "limit_percent": fs.limit_percent,
                "target_percent": fs.target_percent,
                "pending_reclaim_bytes": fs.pending_reclaim_bytes,
                "excess_bytes": fs.excess_bytes,
                "chosen_bytes": fs.chosen_bytes,
                "unreachable_bytes": fs.unreachable_bytes,
                "trigger": _trigger(fs),
                "predicted_used_bytes": fs.predicted_used_bytes,
                "predicted_usage_percent": round(fs.predicted_usage_percent, 3),
                "growth_bytes_per_s": round(fs.growth_bytes_per_s, 1),
                "reclaim_latency_s": round(fs.reclaim_latency_s, 3),
                "reclaim_period_s": fs.reclaim_period_s,
                "latency_source": fs.latency_source,
            }
            for fs in outcome_plan.filesystems
        ],
        "deletions": [
            {
                "log_dir": d.log_dir,
                "topic": d.topic,
                "partition": d.partition,
                "base_offset": d.base_offset,
                "next_offset": d.next_offset,
                "max_timestamp_ms": d.max_timestamp_ms,
                "bytes": d.bytes,
                "files": list(d.files),
                "mount": d.mount,
                "reason": d.reason,
                "timestamp_source": d.timestamp_source,
                "unconsumed_records": dict(d.unconsumed_records),
                "groups_without_offset": list(d.groups_without_offset),
            }
            for d in outcome_plan.deletions
        ],
        "protected": [{"topic": t.topic, "reason": t.reason} for t in outcome_plan.protected],
    }


def _trigger(fs: FilesystemPlan) -> str | None:
    """Why this filesystem needs space: today's usage, the broker-mode forecast, or nothing."""
    if not fs.over_limit and not fs.chosen_count:
        return None
    return "predicted" if fs.predicted_trigger else "usage"


def dumps(value: Any, pretty: bool | None = None) -> str:
    """JSON for ``--json`` output: indented for a person at a terminal, compact otherwise.

    The contract is the JSON shape, not its whitespace. Indenting forces the json module's
    pure-Python encoder (0.5 s for a 10,000-deletion plan); compact output uses the C one.
    ``pretty=None`` decides from whether stdout is a terminal.
    """
    if pretty is None:
        pretty = sys.stdout.isatty()
    if pretty:
        return json.dumps(value, indent=2)
    return json.dumps(value, separators=(",", ":"))


@dataclass
class Planner:
    """Scan + plan with the config's rules; the I/O half of a cycle that never deletes."""

    config: Config
    requested: RequestedLogStart | None = None
    committed: CommittedOffsets = field(default_factory=dict)
    #: Called once per partition dir scanned: drives a progress bar on a terminal.
    on_partition: Callable[[float], None] | None = None
    #: Listings of unchanged partition dirs, reused across the daemon's cycles.
    cache: ListingCache = field(default_factory=ListingCache)
    #: Ages of segments already dated, reused while their files are unchanged.
    ages: AgeCache = field(default_factory=AgeCache)
    #: Broker mode: the write rate and reclaim latency per filesystem (mount -> forecast).
    forecast_for: Callable[[str], Forecast | None] | None = None
    #: Broker mode: partitions this broker leads (preferred among equally old candidates).
    led_here: Collection[tuple[str, int]] | None = None
    #: Known topic policies (cache, broker answers, KRaft metadata); None: none known, so
    #: every topic not internal, not compacted by evidence, is "policy unknown".
    policies: PolicyStore | None = None
    _broker_facts: tuple[str | None, int | None, list[str]] | None = field(
        default=None, init=False, repr=False
    )

    def broker_facts(self) -> tuple[str | None, int | None]:
        """``log.cleanup.policy`` from server.properties (None unless the config names the
        file) and this broker's node id (meta.properties): read once per config."""
        if self._broker_facts is None:
            broker = self.config.broker
            default: str | None = None
            problems: list[str] = []
            if broker.server_properties is not None:
                try:
                    default = topicconfigs.broker_defaults(broker).cleanup_policy
                except (OSError, ValueError) as exc:
                    problems.append(f"broker default cleanup.policy unknown: {exc}")
            node_id = topicconfigs.local_broker_id(broker.log_dirs)
            self._broker_facts = (default, node_id, problems)
        return self._broker_facts[0], self._broker_facts[1]

    def rule(self, offline: bool, kraft: bool | None = None) -> tuple[ProtectionRule, list[str]]:
        """The protection rule for a scan now, and warnings not reported yet.

        ``kraft``: read the KRaft metadata log too (default: when ``offline``).
        """
        retention = self.config.retention
        if self.policies is None:
            return ProtectionRule(
                tuple(retention.protect_topics), tuple(retention.assume_delete_policy)
            ), []
        default, node_id = self.broker_facts()
        assert self._broker_facts is not None
        warnings = list(self._broker_facts[2])
        self._broker_facts[2].clear()
        rule = self.policies.rule(
            retention.protect_topics,
            retention.assume_delete_policy,
            [str(d) for d in self.config.broker.log_dirs],
            offline=offline,
            static_default=default,
            node_id=node_id,
            read_kraft=offline if kraft is None else kraft,
        )
        return rule, warnings + self.policies.take_warnings()

    def scan(
        self, full: bool = False, offline: bool = False, kraft: bool | None = None
    ) -> ScanResult:
        """``offline``: no broker will remove segments below the log start offset, so they are
        candidates (the oldest of all) instead of pending reclaim. ``kraft``: also read the
        KRaft metadata log for topic policies (default: when ``offline``)."""
        cfg = self.config
        rule, rule_warnings = self.rule(offline, kraft)
        result = scan(
            [str(d) for d in cfg.broker.log_dirs],
            rule,
            full=full or cfg.retention.max_bytes is not None,
            requested_log_start=(
                self.requested.as_mapping() if self.requested and not offline else None
            ),
            use_log_start=not offline,
            on_partition=self.on_partition,
            cache=self.cache,
        )
        if rule_warnings:
            result = replace(result, warnings=(*rule_warnings, *result.warnings))
        return result

    def plan(self, result: ScanResult, mode: str) -> tuple[Plan, list[str]]:
        reader = SegmentFileReader(self.ages)
        limits = limits_for(self.config, mode)
        forecast_for = self.forecast_for if mode == BROKER else None

        def _limits(fs: Filesystem) -> Limits:
            forecast = forecast_for(fs.usage.mount) if forecast_for is not None else None
            return with_forecast(limits, forecast)

        led = self.led_here if mode == BROKER else None
        chosen = plan(result.filesystems, _limits, reader, self.committed, led)
        self.ages.prune()
        return chosen, reader.warnings


def monotonic() -> float:
    return time.monotonic()
