"""Which topics this broker hosts and their size settings, for the reserved-size report (edge).

With a reachable broker the truth is the broker's: topics and partitions from metadata, and
``retention.bytes``, ``segment.bytes``, ``segment.index.bytes``, ``cleanup.policy`` from
``DescribeConfigs``. Any key the broker does not return (some Kafka-protocol brokers, tansu
among them, return only explicitly set topic configs) falls back to the broker defaults.

Without a broker (stopped, or the disk filled and it cannot start — exactly when this report
is wanted) the partition dirs in the log dirs say which partitions live here, and
``server.properties`` gives the broker-wide defaults: ``log.retention.bytes``,
``log.segment.bytes``, ``log.index.size.max.bytes`` (the broker key behind a topic's
``segment.index.bytes``) and ``log.cleanup.policy``. Per-topic overrides live only in the
cluster metadata, so they are unknown then; the report says so.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from diskguard.capacity.reserve import TopicSettings, policy_kind
from diskguard.config import BrokerConfig
from diskguard.errors import UsageError
from diskguard.kafkalog.model import PartitionDirKind, parse_partition_dir
from diskguard.kafkalog.serverprops import local_broker_id, read_properties
from diskguard.kafkalog.topicpolicy import ALWAYS_COMPACTED
from diskguard.logs import get_logger

__all__ = [
    "KAFKA_DEFAULTS",
    "BrokerDefaults",
    "BrokerUnavailable",
    "TopicConfigError",
    "TopicInventory",
    "broker_defaults",
    "load_topics",
    "local_broker_id",
    "topics_from_broker",
    "topics_from_log_dirs",
]

TOPIC_KEYS = ("retention.bytes", "segment.bytes", "segment.index.bytes", "cleanup.policy")


class TopicConfigError(UsageError, ValueError):
    """A setting that cannot be used (bad server.properties value); the message names it."""


class BrokerUnavailable(Exception):
    """The broker could not be asked (down, unreachable, not authorised)."""


@dataclass(frozen=True)
class BrokerDefaults:
    """Broker-wide topic defaults; ``source`` says where each came from, for the report."""

    retention_bytes: int
    segment_bytes: int
    segment_index_bytes: int
    cleanup_policy: str
    source: str


#: Apache Kafka's own defaults (log.retention.bytes=-1: no size limit).
KAFKA_DEFAULTS = BrokerDefaults(
    retention_bytes=-1,
    segment_bytes=1024**3,
    segment_index_bytes=10 * 1024**2,
    cleanup_policy="delete",
    source="kafka defaults",
)


@dataclass(frozen=True)
class TopicInventory:
    topics: tuple[TopicSettings, ...]
    #: "broker" or "log-dirs".
    source: str
    #: Caveats a reader of the report must see (fallbacks, unknown overrides).
    notes: tuple[str, ...] = ()


def _int_setting(value: str, where: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise TopicConfigError(f"{where}: expected an integer, got {value!r}") from None


def broker_defaults(broker: BrokerConfig) -> BrokerDefaults:
    """Kafka's defaults, overlaid with the diskguard config, overlaid with server.properties.

    ``broker.segment_bytes``/``segment_index_bytes`` already carry server.properties' values
    unless the TOML set them (config resolution does that); retention and cleanup policy are
    read here. Raises TopicConfigError naming ``FILE: key`` for a value Kafka would reject,
    OSError if the file cannot be read.
    """
    defaults = replace(
        KAFKA_DEFAULTS,
        segment_bytes=broker.segment_bytes,
        segment_index_bytes=broker.segment_index_bytes,
        source="diskguard config / kafka defaults",
    )
    path = broker.server_properties
    if path is None:
        return defaults
    props = read_properties(path)
    retention = defaults.retention_bytes
    if "log.retention.bytes" in props:
        retention = _int_setting(props["log.retention.bytes"], f"{path}: log.retention.bytes")
    policy = props.get("log.cleanup.policy", defaults.cleanup_policy)
    try:
        policy_kind(policy)
    except ValueError as exc:
        raise TopicConfigError(f"{path}: log.cleanup.policy: {exc}") from None
    return replace(defaults, retention_bytes=retention, cleanup_policy=policy, source=str(path))


def topics_from_log_dirs(
    log_dirs: Iterable[Path], defaults: BrokerDefaults
) -> tuple[TopicSettings, ...]:
    """One row per topic with a live partition dir here; settings are the broker defaults.

    A partition is counted once even if it appears in two log dirs (a ``-future`` copy being
    moved is not live and is skipped anyway). Unreadable log dirs raise OSError.
    """
    partitions: dict[str, set[int]] = {}
    for log_dir in log_dirs:
        for name in os.listdir(log_dir):
            parsed = parse_partition_dir(name)
            if parsed is None or parsed.kind is not PartitionDirKind.LIVE:
                continue
            if not os.path.isdir(os.path.join(log_dir, name)):
                continue
            partitions.setdefault(parsed.topic, set()).add(parsed.partition)
    return tuple(
        TopicSettings(
            topic=topic,
            partitions=len(numbers),
            cleanup_policy="compact" if topic in ALWAYS_COMPACTED else defaults.cleanup_policy,
            retention_bytes=defaults.retention_bytes,
            segment_bytes=defaults.segment_bytes,
            segment_index_bytes=defaults.segment_index_bytes,
            source="defaults",
        )
        for topic, numbers in sorted(partitions.items())
    )


def _merge(
    topic: str, partitions: int, values: Mapping[str, str | None], defaults: BrokerDefaults
) -> TopicSettings:
    got = {k: v for k, v in values.items() if k in TOPIC_KEYS and v is not None}

    def number(key: str, fallback: int) -> int:
        if key not in got:
            return fallback
        return _int_setting(str(got[key]), f"broker config of topic {topic!r}: {key}")

    return TopicSettings(
        topic=topic,
        partitions=partitions,
        cleanup_policy=str(got.get("cleanup.policy", defaults.cleanup_policy)),
        retention_bytes=number("retention.bytes", defaults.retention_bytes),
        segment_bytes=number("segment.bytes", defaults.segment_bytes),
        segment_index_bytes=number("segment.index.bytes", defaults.segment_index_bytes),
        source="broker" if len(got) == len(TOPIC_KEYS) else "broker+defaults",
    )


def topics_from_broker(
    bootstrap_servers: str,
    client: Mapping[str, Any],
    defaults: BrokerDefaults,
    local_id: int | None = None,
    timeout: float = 10.0,
) -> tuple[tuple[TopicSettings, ...], tuple[str, ...]]:
    """Topics and their settings as the broker has them, plus notes for the report.

    With ``local_id`` only partitions with a replica on that broker count (what this host's
    disks hold); without it every partition counts. Raises BrokerUnavailable.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported, untyped
        AdminClient,
        ConfigResource,
        ResourceType,
    )

    # librdkafka's own connect-retry chatter goes nowhere; failures arrive as exceptions.
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, "log_level": 0, **client}
    notes: list[str] = []
    try:
        admin = AdminClient(conf)
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnavailable(f"{bootstrap_servers}: {exc.args[0] if exc.args else exc}") from exc
    if local_id is not None and local_id not in metadata.brokers:
        notes.append(
            f"broker id {local_id} from meta.properties is not in the cluster metadata; "
            "counting every partition"
        )
        local_id = None
    if local_id is None:
        notes.append("partition counts are cluster-wide (this host's broker id is unknown)")
    counts: dict[str, int] = {}
    for name, topic in metadata.topics.items():
        if topic.error is not None:
            notes.append(f"topic {name!r}: metadata error {topic.error}; skipped")
            continue
        hosted = [
            p for p in topic.partitions.values() if local_id is None or local_id in p.replicas
        ]
        if hosted:
            counts[name] = len(hosted)
    if not counts:
        return (), tuple(notes)
    resources = [ConfigResource(ResourceType.TOPIC, name) for name in sorted(counts)]
    try:
        futures = admin.describe_configs(resources, request_timeout=timeout)
    except KafkaException as exc:
        raise BrokerUnavailable(f"{bootstrap_servers}: DescribeConfigs: {exc}") from exc
    rows: list[TopicSettings] = []
    for resource, future in futures.items():
        name = resource.name
        try:
            entries = future.result(timeout=timeout)
            values = {key: entry.value for key, entry in entries.items()}
        except Exception as exc:  # one topic's failure must not hide the rest
            notes.append(f"topic {name!r}: DescribeConfigs failed ({exc}); broker defaults used")
            values = {}
        rows.append(_merge(name, counts[name], values, defaults))
    if any(r.source != "broker" for r in rows):
        notes.append(
            "keys the broker did not return were taken from the broker defaults "
            f"({defaults.source})"
        )
    return tuple(sorted(rows, key=lambda r: r.topic)), tuple(notes)


def load_topics(broker: BrokerConfig, timeout: float = 10.0) -> TopicInventory:
    """From the broker when one is configured and answers, else from the log dirs.

    Raises TopicConfigError for bad server.properties values and OSError for unreadable
    files/dirs; an unreachable broker is a logged fallback, not an error.
    """
    defaults = broker_defaults(broker)
    notes: list[str] = []
    if broker.bootstrap_servers:
        local_id = local_broker_id(broker.log_dirs)
        try:
            topics, broker_notes = topics_from_broker(
                broker.bootstrap_servers, broker.client, defaults, local_id, timeout
            )
        except BrokerUnavailable as exc:
            # Looked up now, not at import: a module-level structlog logger would keep the
            # configuration of import time and ignore configure_logging (stderr, JSON).
            get_logger("diskguard.topicconfigs").warning(
                "reserve_broker_unavailable",
                error=str(exc),
                fallback="log dirs + broker defaults",
            )
            notes.append(f"broker unavailable ({exc}); fell back to the log dirs")
        else:
            return TopicInventory(topics, "broker", broker_notes)
    notes.append(
        f"settings are broker defaults from {defaults.source}; per-topic overrides are "
        "unknown without a broker"
    )
    return TopicInventory(topics_from_log_dirs(broker.log_dirs, defaults), "log-dirs", tuple(notes))
