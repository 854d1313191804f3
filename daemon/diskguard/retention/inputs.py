"""What the pure planner is fed from the config and the disk: the scan, with the topic
protection rules (each filesystem's limits are ``ceilings``').

The I/O half of planning; ``planner`` itself never sees the config or the disk.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from diskguard.config import Config
from diskguard.kafkalog.dating import AgeCache
from diskguard.kafkalog.listing import ListingCache, live_partition_dirs
from diskguard.kafkalog.model import Filesystem, parse_partition_dir
from diskguard.kafkalog.scan import ScanResult, scan
from diskguard.kafkalog.serverprops import local_broker_id
from diskguard.kafkalog.topicpolicy import ProtectionRule
from diskguard.logs import get_logger
from diskguard.retention.planner import DeletionResult
from diskguard.retention.policystore import PolicyStore
from diskguard.retention.requested import RequestedLogStart
from diskguard.retention.setaside import SetAside

log = get_logger("diskguard.retention")


@dataclass
class PlanInputs:
    """Scans the log dirs with the config's protection rules; keeps the caches that make the
    daemon's next scan cheap."""

    config: Config
    requested: RequestedLogStart | None = None
    #: Called once per partition dir scanned: drives a progress bar on a terminal.
    on_partition: Callable[[float], None] | None = None
    #: Listings of unchanged partition dirs, reused across the daemon's cycles.
    cache: ListingCache = field(default_factory=ListingCache)
    #: Ages of segments already dated, reused while their files are unchanged.
    ages: AgeCache = field(default_factory=AgeCache)
    #: Known topic policies (cache, broker answers, KRaft metadata); None: none known, so
    #: every topic not internal, not compacted by evidence, is "policy unknown".
    policies: PolicyStore | None = None
    #: Partitions whose deletion failed in a way that recurs: protected for a while.
    set_aside: SetAside = field(default_factory=SetAside)
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
                # Only here: the reserve report's module costs every plan its import.
                from diskguard.capacity.topicconfigs import broker_defaults

                try:
                    default = broker_defaults(broker).cleanup_policy
                except (OSError, ValueError) as exc:
                    problems.append(f"broker default cleanup.policy unknown: {exc}")
            node_id = local_broker_id(broker.log_dirs)
            self._broker_facts = (default, node_id, problems)
        return self._broker_facts[0], self._broker_facts[1]

    def topics_on_disk(self) -> set[str]:
        """The topics of the live partition dirs a scan lists now (``live_partition_dirs``),
        from the log dirs' entries alone: what to ask the broker about before scanning."""
        topics: set[str] = set()
        for log_dir in self.config.broker.log_dirs:
            try:
                entries = self.cache.log_dir_entries(str(log_dir))
            except OSError:
                continue  # the scan says why
            for path in live_partition_dirs(entries):
                name = parse_partition_dir(os.path.basename(path))
                if name is not None:
                    topics.add(name.topic)
        return topics

    def rule(self, offline: bool, kraft: bool | None = None) -> tuple[ProtectionRule, list[str]]:
        """The protection rule for a scan now, and warnings not reported yet.

        ``kraft``: read the KRaft metadata log too (default: when ``offline``).
        """
        retention = self.config.retention
        delete_tiered = tuple(self.config.ladder.delete_tiered_topics)
        if self.policies is None:
            return ProtectionRule(
                tuple(retention.protect_topics),
                tuple(retention.assume_delete_policy),
                delete_tiered=delete_tiered,
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
            delete_tiered=delete_tiered,
        )
        return rule, warnings + self.policies.take_warnings()

    def scan(
        self,
        full: bool = False,
        offline: bool = False,
        kraft: bool | None = None,
        cluster_log_start: Mapping[tuple[str, int], int] | None = None,
    ) -> ScanResult:
        """``full``: stat every file (a snapshot, a byte budget to check). ``offline``: no
        broker will remove segments below the log start offset, so they are
        candidates (the oldest of all) instead of pending reclaim. ``kraft``: also read the
        KRaft metadata log for topic policies (default: when ``offline``).
        ``cluster_log_start``: log start offsets the partitions' leaders reported (another
        guard's DeleteRecords): below them is pending reclaim here too."""
        cfg = self.config
        rule, rule_warnings = self.rule(offline, kraft)
        requested: Mapping[str, Mapping[tuple[str, int], int]] | None = None
        if not offline:
            requested = self.requested.as_mapping() if self.requested else {}
            if cluster_log_start:
                requested = {
                    str(d): _highest(cluster_log_start, requested.get(str(d), {}))
                    for d in cfg.broker.log_dirs
                }
        result = scan(
            [str(d) for d in cfg.broker.log_dirs],
            rule,
            full=full,
            requested_log_start=requested,
            use_log_start=not offline,
            on_partition=self.on_partition,
            cache=self.cache,
        )
        if rule_warnings:
            result = replace(result, warnings=(*rule_warnings, *result.warnings))
        aside = self.set_aside.apply(result.filesystems, time.monotonic())
        if aside is not result.filesystems:
            result = replace(result, filesystems=aside)
        return result

    def set_aside_failed(
        self, results: Iterable[DeletionResult], filesystems: Sequence[Filesystem] = ()
    ) -> None:
        """After acting: set aside the partitions whose deletion failed for a lasting reason
        (``setaside``) — for a topic's refusal, every partition of the topic in the scanned
        ``filesystems`` (looked up only then: most cycles have no such failure) — and say so
        once each time."""

        def partitions_of(topic: str) -> list[int]:
            return [
                part.partition
                for fs in filesystems
                for log_dir in fs.log_dirs
                for part in log_dir.partitions
                if part.topic == topic
            ]

        for entry in self.set_aside.record(results, time.monotonic(), partitions_of):
            log.warning(
                "partition_set_aside",
                topic=entry.topic,
                partition=entry.partition,
                error=entry.error,
                retry_in_s=self.set_aside.hold_s,
            )


def _highest(
    a: Mapping[tuple[str, int], int], b: Mapping[tuple[str, int], int]
) -> dict[tuple[str, int], int]:
    """Per partition the higher of two known log start offsets."""
    out = dict(a)
    for key, offset in b.items():
        out[key] = max(out.get(key, offset), offset)
    return out
