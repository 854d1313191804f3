"""The broker calls of the lossless rungs (edge): how far tiered storage has uploaded, a
topic's local retention, a broker's log dirs, cordons and replica moves.

- ListOffsets ``LATEST_TIERED`` (KIP-1005, Kafka 3.9+): the highest offset of a partition in
  remote storage. A local segment whose last offset is at or below it is uploaded: the broker
  may drop it locally, and consumers still read it (from remote).
- IncrementalAlterConfigs on a topic's ``local.retention.ms`` (KIP-405): lowered, the broker
  drops uploaded local segments at its next retention check; restored, it keeps them again.
- DescribeLogDirs (KIP-113; ``is_cordoned`` since KIP-1066): each log dir's state as the
  broker sees it: online or failed (``KAFKA_STORAGE_ERROR``), cordoned, its replicas' sizes.
- AlterReplicaLogDirs (KIP-113): the broker copies a replica into ``<dir>/<tp>.<id>-future``,
  then swaps and renames the old one ``-delete``.
- IncrementalAlterConfigs APPEND / SUBTRACT on the broker's ``cordoned.log.dirs`` (KIP-1066,
  Kafka 4.3+): no new replica is placed in a cordoned dir (nor moved into one: measured on
  4.4, AlterReplicaLogDirs into it answers ``INVALID_REPLICA_ASSIGNMENT``).

confluent-kafka has none of the first four calls' needs (no ``LATEST_TIERED`` spec, no log-dir
API): those go through kafka-python (``kafkapython``); topic and broker configs through
confluent-kafka like every other config call. Every failure is ``LadderCallFailed`` with one
line saying what the broker answered.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from diskguard.broker.errors import describe_error
from diskguard.broker.kafkapython import KafkaPythonAdmin
from diskguard.broker.patience import BrokerHung, OneTimeout

__all__ = [
    "STORAGE_ERROR",
    "EarlyAnswer",
    "LadderApi",
    "LadderCallFailed",
    "LogDirInfo",
    "ReplicaInfo",
]

#: Kafka's KAFKA_STORAGE_ERROR: DescribeLogDirs says so for a log dir the broker took offline.
STORAGE_ERROR = 56
#: The dynamic broker config of KIP-1066 (Kafka 4.3+).
CORDONED = "cordoned.log.dirs"
LOCAL_RETENTION_MS = "local.retention.ms"


class LadderCallFailed(Exception):
    """A ladder call the broker refused or did not answer; the text is one line.
    ``unanswered``: False when the call never reached a broker that could answer (kafka-python
    could not bootstrap): not evidence that the broker hangs (``LadderApi._patiently``)."""

    unanswered = True


@dataclass(frozen=True)
class ReplicaInfo:
    """One replica in a log dir as DescribeLogDirs tells it."""

    topic: str
    partition: int
    bytes: int
    #: A ``-future`` replica: the copy of a move into this dir, still catching up.
    future: bool = False
    offset_lag: int = 0


@dataclass(frozen=True)
class LogDirInfo:
    """One of the broker's log dirs: its state and replicas."""

    path: str
    #: None when online; else the broker's error name (``KAFKA_STORAGE_ERROR``: it took the
    #: dir offline after an I/O error).
    error: str | None
    total_bytes: int
    usable_bytes: int
    #: None when the broker does not say (before KIP-1066).
    cordoned: bool | None
    replicas: tuple[ReplicaInfo, ...] = ()

    @property
    def online(self) -> bool:
        return self.error is None


def _error_name(code: int) -> str:
    import kafka.errors as kafka_errors

    name = str(kafka_errors.for_code(code).__name__)
    return {"KafkaStorageError": "KAFKA_STORAGE_ERROR"}.get(name, name)


def _unanswered(exc: BaseException) -> bool:
    """Did a kafka-python call fail because the broker took the request and did not answer
    it within the timeout (``RequestTimedOutError``)?"""
    return type(exc).__name__ == "RequestTimedOutError"


class _AskedOnThread:
    """DescribeLogDirs asked on a thread of this process (``LadderApi.log_dirs_soon``)."""

    def __init__(self, ask: Any) -> None:
        self._box: dict[str, Any] = {}
        #: When it was asked (monotonic): how long its request has waited by its answer.
        self.started = time.monotonic()

        def run() -> None:
            try:
                self._box["answer"] = ask()
            except LadderCallFailed as exc:
                self._box["failed"] = exc

        self._thread = threading.Thread(target=run, name="diskguard-log-dirs", daemon=True)
        self._thread.start()

    def answer(self) -> list[LogDirInfo] | None:
        """The broker's log dirs; raises its ``LadderCallFailed``; None: no answer came."""
        self._thread.join()
        if "failed" in self._box:
            raise self._box["failed"]
        answer: list[LogDirInfo] | None = self._box.get("answer")
        return answer

    @property
    def waiting(self) -> bool:
        return self._thread.is_alive()


class EarlyAnswer(Protocol):
    """A DescribeLogDirs asked before it is needed (``LadderApi.log_dirs_soon``)."""

    def answer(self) -> list[LogDirInfo] | None:
        """The broker's log dirs (waiting for them); raises the call's ``LadderCallFailed``;
        None: no answer came (ask again)."""

    @property
    def waiting(self) -> bool:
        """Still waiting for the broker, in this process (a thread)."""


class LadderApi:
    """The ladder's calls over one broker: ``admin`` is confluent-kafka's AdminClient (the
    ``BrokerClient``'s), ``kafka`` the lazily connected kafka-python client."""

    def __init__(
        self,
        admin: Any,
        kafka: KafkaPythonAdmin,
        timeout: float = 5.0,
        patience: OneTimeout | None = None,
    ) -> None:
        self._admin = admin
        self._kafka = kafka
        self.timeout = timeout
        #: The retention cycle's one timeout (the ``BrokerClient``'s): once a call of the
        #: cycle got no answer, these calls are not made either (``_patiently``).
        self._patience = patience
        #: ``log_dirs_soon``'s call: the broker asked, and where its answer comes.
        self._early: tuple[int, EarlyAnswer] | None = None
        #: One kafka-python call at a time: its client is not thread-safe, and
        #: ``log_dirs_soon``'s thread may still be asking when another call comes.
        self._kafka_lock = threading.Lock()

    def close(self) -> None:
        early, self._early = self._early, None
        if early is not None and early[1].waiting:
            return  # never asked for, still connecting: not waited for (a broker down)
        self._kafka.reset()

    @contextlib.contextmanager
    def _patiently(self, what: str, started: float | None = None) -> Iterator[None]:
        """One call of a retention cycle, under its one timeout: not made once an earlier
        call of the cycle got no answer within the timeout (a hung broker: this one would
        wait it out too, and a cycle would wait once per call), and marking the cycle so
        when this one did. ``started``: when its request was really sent, if earlier."""
        patience = self._patience
        if patience is not None:
            try:
                patience.check()
            except BrokerHung as exc:
                raise LadderCallFailed(f"{what}: {exc}") from None
        began = time.monotonic() if started is None else started
        try:
            yield
        except LadderCallFailed as exc:
            if patience is not None and exc.unanswered:
                patience.waited_out(began, str(exc))
            raise

    def _kafka_call(self, what: str, call: Any) -> Any:
        with self._patiently(what), self._kafka_lock:
            try:
                return call(self._kafka.admin())
            except LadderCallFailed:
                raise
            except Exception as exc:
                self._kafka.reset()
                failed = LadderCallFailed(f"{what}: {type(exc).__name__}: {exc}")
                # Only a request the broker took and never answered says it hangs (a stopped
                # process: connections accepted). kafka-python's own bootstrap failing is the
                # connection, its security settings or the address: the cycle's other
                # client may still be answered, and must still be asked.
                failed.unanswered = _unanswered(exc)
                raise failed from exc

    # -- tiered storage ---------------------------------------------------------------
    def tiered_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """``(topic, partition) -> highest offset in remote storage`` (-1: nothing uploaded
        yet). One ListOffsets per leader; raises ``LadderCallFailed`` (a broker before 3.9
        has no ``LATEST_TIERED``: ``UnsupportedVersionError``)."""
        wanted = sorted(set(partitions))
        if not wanted:
            return {}
        from kafka import TopicPartition
        from kafka.protocol.consumer.offsets import OffsetSpec

        def call(admin: Any) -> dict[tuple[str, int], int]:
            specs = {TopicPartition(t, p): OffsetSpec.LATEST_TIERED for t, p in wanted}
            answer = admin.list_partition_offsets(specs, timeout_ms=int(self.timeout * 1000))
            return {(tp.topic, tp.partition): int(found.offset) for tp, found in answer.items()}

        return dict(self._kafka_call("ListOffsets LATEST_TIERED", call))

    def topic_override(self, topic: str, key: str) -> str | None:
        """The topic's own value of ``key`` (a topic-level override), or None when the topic
        follows the broker default."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported
            ConfigResource,
            ConfigSource,
            ResourceType,
        )

        entries = self._describe(ConfigResource(ResourceType.TOPIC, topic), topic)
        entry = entries.get(key)
        # ``source`` is a plain int in what describe_configs returns (confluent-kafka 2.x).
        dynamic = ConfigSource.DYNAMIC_TOPIC_CONFIG.value
        if entry is None or getattr(entry.source, "value", entry.source) != dynamic:
            return None
        return None if entry.value is None else str(entry.value)

    def set_topic_config(self, topic: str, key: str, value: str | None) -> None:
        """SET ``key`` on the topic, or DELETE its override (``value`` None: back to the
        broker default)."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
            ResourceType,
        )

        op = AlterConfigOpType.DELETE if value is None else AlterConfigOpType.SET
        entry = ConfigEntry(key, value, incremental_operation=op)
        self._alter(ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[entry]))

    def _describe(self, resource: Any, name: str) -> dict[str, Any]:
        """DescribeConfigs of one resource: its entries by key."""
        what = f"DescribeConfigs {name}"
        with self._patiently(what):
            try:
                futures = self._admin.describe_configs([resource], request_timeout=self.timeout)
                return dict(next(iter(futures.values())).result(timeout=self.timeout + 2.0))
            except Exception as exc:
                raise LadderCallFailed(f"{what}: {describe_error(exc)}") from exc

    def _alter(self, resource: Any) -> None:
        what = f"IncrementalAlterConfigs {resource.restype.name.lower()} {resource.name}"
        with self._patiently(what):
            try:
                futures = self._admin.incremental_alter_configs(
                    [resource], request_timeout=self.timeout
                )
                for future in futures.values():
                    future.result(timeout=self.timeout + 2.0)
            except Exception as exc:
                raise LadderCallFailed(f"{what}: {describe_error(exc)}") from exc

    # -- log dirs -----------------------------------------------------------------------
    def log_dirs_soon(self, broker_id: int, asked: EarlyAnswer | None = None) -> None:
        """Ask DescribeLogDirs now (the dirs' state, no replica); the next
        ``log_dirs(broker_id)`` that wants no replica takes its answer (or raises its
        failure) instead of asking again.

        A one-shot ``plan`` asks after its scan and the policies' round trips, and the call
        then paid kafka-python's import (~0.14 s), its connection and the round trip on the
        command's critical path. The answer is as fresh as the daemon's (cached for a check
        interval). ``asked``: the call made elsewhere already (a forked child); else it is
        asked on a thread (only where no fork follows: the thread would make one unsafe)."""
        if asked is None:
            asked = _AskedOnThread(lambda: self._log_dirs(broker_id, {}))
        self._early = (broker_id, asked)

    @property
    def kafka(self) -> KafkaPythonAdmin:
        """The kafka-python client (its settings, for a child that asks the same)."""
        return self._kafka

    def log_dirs(
        self, broker_id: int, replicas: Mapping[str, Sequence[int]] | None = None
    ) -> list[LogDirInfo]:
        """The broker's log dirs (DescribeLogDirs to that broker): each dir's state, and the
        sizes of the ``replicas`` asked for (topic -> partitions; None: none).

        Never "all replicas": kafka-python turns that into a Metadata request for every
        topic of the cluster and a DescribeLogDirs naming each partition, both sized by the
        cluster; the dirs' state alone is a few bytes, and the replicas a caller needs are
        the ones its scan found."""
        wanted = {topic: sorted(set(parts)) for topic, parts in (replicas or {}).items()}
        early, self._early = self._early, None
        if early is not None and early[0] == broker_id and not wanted:
            # Asked on a thread since ``started``: under the cycle's one timeout from then.
            with self._patiently("DescribeLogDirs", getattr(early[1], "started", None)):
                answer = early[1].answer()
            if answer is not None:
                return list(answer)
        return self._log_dirs(broker_id, wanted)

    def _log_dirs(self, broker_id: int, wanted: Mapping[str, list[int]]) -> list[LogDirInfo]:

        def call(admin: Any) -> list[Any]:
            return list(admin.describe_log_dirs(topic_partitions=wanted, brokers=[broker_id]))

        answer = self._kafka_call("DescribeLogDirs", call)
        out: list[LogDirInfo] = []
        for broker in answer:
            if broker.get("broker") not in (None, broker_id):
                continue
            for entry in broker.get("log_dirs", ()):
                code = int(entry.get("error_code", 0))
                found = tuple(
                    ReplicaInfo(
                        topic=str(topic["name"]),
                        partition=int(part["partition_index"]),
                        bytes=int(part.get("partition_size", 0)),
                        future=bool(part.get("is_future_key", False)),
                        offset_lag=int(part.get("offset_lag", 0)),
                    )
                    for topic in entry.get("topics", ())
                    for part in topic.get("partitions", ())
                )
                cordoned = entry.get("is_cordoned")
                out.append(
                    LogDirInfo(
                        path=str(entry["log_dir"]),
                        error=None if code == 0 else _error_name(code),
                        total_bytes=int(entry.get("total_bytes", -1)),
                        usable_bytes=int(entry.get("usable_bytes", -1)),
                        cordoned=None if cordoned is None else bool(cordoned),
                        replicas=found,
                    )
                )
        return out

    def move_replicas(
        self, broker_id: int, moves: Mapping[tuple[str, int], str]
    ) -> dict[tuple[str, int], str | None]:
        """AlterReplicaLogDirs: each ``(topic, partition)`` of ``broker_id`` into the log dir
        named; ``None`` per accepted move, else the broker's error name."""
        if not moves:
            return {}

        def call(admin: Any) -> dict[Any, Any]:
            request = {(t, p, broker_id): path for (t, p), path in moves.items()}
            return dict(admin.alter_replica_log_dirs(request))

        answer = self._kafka_call("AlterReplicaLogDirs", call)
        out: dict[tuple[str, int], str | None] = {}
        for replica, error in answer.items():
            name = getattr(error, "__name__", str(error))
            out[(replica.topic, replica.partition)] = None if name == "NoError" else name
        for key in moves:
            out.setdefault(key, "no answer for this replica from the broker")
        return out

    # -- cordons --------------------------------------------------------------------------
    def cordoned(self, broker_id: int) -> list[str] | None:
        """The broker's ``cordoned.log.dirs``, or None when it has no such setting (before
        Kafka 4.3: cordoning is not available)."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported
            ConfigResource,
            ResourceType,
        )

        resource = ConfigResource(ResourceType.BROKER, str(broker_id))
        entry = self._describe(resource, f"broker {broker_id}").get(CORDONED)
        if entry is None:
            return None
        return [p for p in str(entry.value or "").split(",") if p.strip()]

    def cordon(self, broker_id: int, dirs: Sequence[str], add: bool) -> None:
        """APPEND (``add``) or SUBTRACT ``dirs`` to/from ``cordoned.log.dirs`` (one entry:
        the list comma-joined; two entries for one key are refused)."""
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported
            AlterConfigOpType,
            ConfigEntry,
            ConfigResource,
            ResourceType,
        )

        op = AlterConfigOpType.APPEND if add else AlterConfigOpType.SUBTRACT
        entry = ConfigEntry(CORDONED, ",".join(dirs), incremental_operation=op)
        self._alter(
            ConfigResource(ResourceType.BROKER, str(broker_id), incremental_configs=[entry])
        )
