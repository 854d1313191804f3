"""A PySpark Python Data Source that reads one Kafka topic as a bounded batch.

Why not Spark's own Kafka connector: it needs the ``spark-sql-kafka`` jar (a Maven download
at start-up, impossible on an air-gapped cluster and slow everywhere), while the daemon
already depends on confluent-kafka. Why not a consumer group: a batch job must not move a
group's committed offsets or join a rebalance with other readers, and it needs a fixed end.

So: one Spark partition per Kafka partition, each read with ``assign()`` from the low to the
high watermark measured once, on the driver, before any task starts (the plan travels to the
tasks as the ``offsets`` option, so every task reads the same snapshot of the topic). Reading
stops at the planned end, or at the end of the partition (``enable.partition.eof``), which
also covers ends that are never delivered (transaction markers, compacted-away offsets).

Broker quirk handled: some Kafka-protocol brokers (tansu) answer ListOffsets(latest) with the
base offset of the last batch + 1 instead of the log end offset. The task therefore extends
the planned end to the high watermark reported by its first fetch, which is authoritative.
On Apache Kafka the two agree unless records arrived in between (then a few more are read,
which a dedup-by-key aggregation does not mind).

Rows: ``key string, value string, topic string, partition int, offset long, timestamp long``.
Options: ``bootstrap.servers`` (required), ``topic`` (required), ``offsets`` (JSON plan from
:func:`plan_offsets`; computed by the reader when absent), ``poll.timeout.s`` (default 30),
and any ``kafka.<librdkafka property>`` passed through to the consumer (security settings:
``diskguard aggregate --kafka-config FILE``, :func:`read_client_settings`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from diskguard.errors import FailedError
from diskguard.properties import parse_properties

SOURCE_NAME = "diskguard_kafka"
ERROR_PREFIX = "diskguard-kafka: "

KAFKA_ROW_SCHEMA = StructType(
    [
        StructField("key", StringType()),
        StructField("value", StringType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", LongType()),
    ]
)


class KafkaSourceError(FailedError):
    """A problem with the Kafka source the user can act on (unreachable, no such topic)."""


@dataclass(frozen=True)
class KafkaUrl:
    bootstrap: str
    topic: str


def parse_kafka_url(url: str) -> KafkaUrl:
    """``kafka://host:port[,host:port]/topic`` -> bootstrap servers and topic."""
    parts = urlsplit(url)
    if parts.scheme != "kafka":
        raise KafkaSourceError(f"not a kafka:// URL: {url!r}")
    topic = parts.path.lstrip("/")
    if not parts.netloc or not topic or "/" in topic:
        raise KafkaSourceError(f"expected kafka://host:port/topic, got {url!r}")
    return KafkaUrl(bootstrap=parts.netloc, topic=topic)


@dataclass(frozen=True)
class PartitionRange:
    """Offsets ``[start, end)`` of one Kafka partition: one Spark input partition."""

    partition: int
    start: int
    end: int


class KafkaPartition(InputPartition):  # type: ignore[misc]
    def __init__(self, span: PartitionRange) -> None:
        super().__init__(span.partition)
        self.span = span


def consumer_config(options: Mapping[str, str]) -> dict[str, Any]:
    """librdkafka settings: a throwaway group id (never joined, never committed)."""
    config: dict[str, Any] = {
        "bootstrap.servers": options["bootstrap.servers"],
        "group.id": "diskguard-aggregate-unused",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "socket.timeout.ms": 10_000,
        # librdkafka would print a FAIL line every 50 ms while a broker is down; failures
        # reach the user once, as the exception this module raises.
        "log_level": 0,
        "reconnect.backoff.ms": 200,
        "reconnect.backoff.max.ms": 2_000,
    }
    for key, value in options.items():
        if key.startswith("kafka."):
            config[key[len("kafka.") :]] = value
    return config


#: What the source sets itself, so that a batch job never joins a group nor commits, and
#: the topic comes from the URL: a client settings file may not change them.
RESERVED_SETTINGS = frozenset(
    {
        "bootstrap.servers",
        "group.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "enable.partition.eof",
    }
)


def read_client_settings(path: str) -> dict[str, str]:
    """librdkafka consumer settings from a properties file, read as Kafka's own tools read
    ``--command-config`` (Java ``.properties``: ``diskguard.properties``; a line that is only
    a key is an error here): what a secured cluster needs (``security.protocol``, ``sasl.*``,
    ``ssl.*``). A file, not options, because it holds secrets that a command line would show
    to every user of the machine.

    Raises ``ValueError`` with ``path:line: what is wrong`` (or ``path: ...``)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"{path}: cannot read it: {reason}") from None
    settings: dict[str, str] = {}
    for number, key, value in parse_properties(text):
        if value is None:
            raise ValueError(f"{path}:{number}: expected key=value, got {key[:60]!r}")
        if key in RESERVED_SETTINGS:
            raise ValueError(f"{path}:{number}: {key} is set by diskguard aggregate itself")
        settings[key] = value
    try:
        from confluent_kafka import Consumer, KafkaException

        probe = {**settings, "bootstrap.servers": "localhost:9", "group.id": "x", "log_level": 0}
        Consumer(probe).close()
    except KafkaException as exc:
        raise ValueError(f"{path}: {exc.args[0].str()}") from None
    return settings


def plan_offsets(options: Mapping[str, str], timeout_s: float = 10.0) -> list[PartitionRange]:
    """The low..high watermark of every partition of the topic, measured now.

    Raises KafkaSourceError when the broker cannot be reached or the topic does not exist:
    the message names the bootstrap servers and topic so the user can fix the URL.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    topic = options["topic"]
    bootstrap = options["bootstrap.servers"]
    consumer = Consumer(consumer_config(options))
    try:
        try:
            metadata = consumer.list_topics(topic=topic, timeout=timeout_s)
        except KafkaException as exc:
            raise KafkaSourceError(f"cannot reach Kafka at {bootstrap}: {exc}") from exc
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            reason = f" ({info.error.str()})" if info is not None and info.error else ""
            raise KafkaSourceError(f"topic {topic!r} not found on {bootstrap}{reason}")
        spans = []
        for partition in sorted(info.partitions):
            try:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=timeout_s
                )
            except KafkaException as exc:
                raise KafkaSourceError(
                    f"cannot read watermarks of {topic}[{partition}] on {bootstrap}: {exc}"
                ) from exc
            spans.append(PartitionRange(partition, int(low), int(high)))
        return spans
    finally:
        consumer.close()


def fetched_high_watermark(
    options: Mapping[str, str], partition: int, start: int, timeout_s: float = 10.0
) -> int:
    """The high watermark a fetch from ``start`` reports: authoritative where ListOffsets
    undercounts (see the module's note on tansu). ``-1`` when nothing answered in time."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(consumer_config(options))
    try:
        tp = TopicPartition(options["topic"], partition, start)
        consumer.assign([tp])
        message = consumer.poll(timeout_s)
        if message is None:
            return -1
        _, high = consumer.get_watermark_offsets(tp, cached=True)
        return int(high)
    finally:
        consumer.close()


def encode_plan(spans: Sequence[PartitionRange]) -> str:
    return json.dumps([[s.partition, s.start, s.end] for s in spans])


def decode_plan(text: str) -> list[PartitionRange]:
    return [PartitionRange(int(p), int(s), int(e)) for p, s, e in json.loads(text)]


def read_partition(
    options: Mapping[str, str], span: PartitionRange
) -> Iterator[tuple[str | None, str | None, str, int, int, int]]:
    """Every record of ``span`` as a row tuple; runs inside a Spark task."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    topic = options["topic"]
    timeout_s = float(options.get("poll.timeout.s", "30"))
    consumer = Consumer(consumer_config(options))
    try:
        start = span.start if span.start >= 0 else OFFSET_BEGINNING
        consumer.assign([TopicPartition(topic, span.partition, start)])
        end = span.end
        first = True
        while True:
            message = consumer.poll(timeout_s)
            if message is None:
                raise RuntimeError(
                    f"{ERROR_PREFIX}no data from {topic}[{span.partition}] for {timeout_s:g} s"
                    f" (planned offsets {span.start}..{span.end})"
                )
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return
                raise RuntimeError(f"{ERROR_PREFIX}{topic}[{span.partition}]: {error.str()}")
            if first:
                _, fetched_high = consumer.get_watermark_offsets(
                    TopicPartition(topic, span.partition), cached=True
                )
                end = max(end, int(fetched_high))
                first = False
            raw_offset = message.offset()
            if raw_offset is None:
                continue
            offset = int(raw_offset)
            if offset >= end:
                return
            key = message.key()
            value = message.value()
            _, timestamp = message.timestamp()
            yield (
                key.decode("utf-8", "replace") if key is not None else None,
                value.decode("utf-8", "replace") if value is not None else None,
                topic,
                span.partition,
                offset,
                int(timestamp),
            )
            if offset >= end - 1:
                return
    finally:
        consumer.close()


class KafkaTopicReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = dict(options)

    def partitions(self) -> Sequence[InputPartition]:
        plan = self.options.get("offsets")
        spans = decode_plan(plan) if plan else plan_offsets(self.options)
        return [KafkaPartition(s) for s in spans if s.end > s.start]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, KafkaPartition)
        yield from read_partition(self.options, partition.span)


class KafkaTopicSource(DataSource):  # type: ignore[misc]
    """Registered as ``diskguard_kafka``; options ``bootstrap.servers`` and ``topic``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return KAFKA_ROW_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        for required in ("bootstrap.servers", "topic"):
            if required not in self.options:
                raise ValueError(f"{SOURCE_NAME}: option {required!r} is required")
        return KafkaTopicReader(self.options)
