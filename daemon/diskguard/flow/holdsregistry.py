"""The cluster's record of holds: a compacted topic, one record per guard (edge).

Every guard of a cluster reads every record (``flow.holds.GuardHold``) and writes only its
own, keyed by its guard key (``broker-<id>``): a single writer per key, so no update is lost
to another guard's. The topic is created on first use (one partition, compacted, the
broker's ``LogAppendTime`` so that leases are dated by one clock, replicated on up to three
brokers). Reads keep one consumer assigned to the partition and read up to the high
watermark each time, so a pass sees every record acknowledged before it began. Writes wait
for ``acks=all``: a record a guard acts on is durable first.

The topic is internal to diskguard (``__`` prefix): retention never trims it, and the
actuators never hold it.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Mapping
from typing import Any, Final

from diskguard.broker.errors import describe_error, rdkafka_logger
from diskguard.flow.actuator import ActuatorError
from diskguard.flow.holds import GuardHold

__all__ = ["DEFAULT_TOPIC", "HoldsRegistry", "call_budget", "guard_key"]

DEFAULT_TOPIC: Final = "__diskguard_holds"


def call_budget(lease_s: float, broker_timeout_s: float = 10.0) -> float:
    """How long one call to the holds topic (a read, a write) may take in all: a sixth of
    the lease, at most the broker timeout, at least a second.

    A guard renews every lease / 3 with a pass of one read and one write. While the topic's
    leader changes every call fails; calls bounded so lets such a pass end within one
    renewal interval, so the next pass (and the actuators' events, ``hold_kept`` among
    them) comes on time, and a silence longer than the lease is reported while the lease
    still tells.
    """
    return max(1.0, min(broker_timeout_s, lease_s / 6))


def guard_key(broker_id: int | None, host: str) -> str:
    """A guard's record key: its broker's id (one guard per broker), else its host name."""
    return f"broker-{broker_id}" if broker_id is not None else f"host-{host}"


def _left(deadline: float) -> float:
    """The time to a call's deadline, for a client timeout (librdkafka takes 0 as "do not
    wait" and a negative one as "for ever": never less than a moment)."""
    return max(0.1, deadline - time.monotonic())


class HoldsRegistry:
    """Read all guards' records, write this guard's; every failure is an ``ActuatorError``.

    ``timeout_s`` bounds each call in all (``call_budget``): the topic's creation, the
    watermark and the records of a read share one deadline, as do the creation and the
    delivery of a write.
    Used from the actuators' worker thread only (not thread-safe).
    """

    def __init__(
        self,
        bootstrap: str,
        client_settings: Mapping[str, str | int | float | bool],
        topic: str = DEFAULT_TOPIC,
        timeout_s: float = 10.0,
    ) -> None:
        self.topic = topic
        self.timeout_s = timeout_s
        self._settings: dict[str, Any] = {
            **dict(client_settings),
            "bootstrap.servers": bootstrap,
        }
        self._consumer: Any = None
        self._producer: Any = None
        self._records: dict[str, GuardHold] = {}
        self._created = False

    # -- the topic --------------------------------------------------------------------------
    def _ensure_topic(self, deadline: float) -> None:
        if self._created:
            return
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import (  # type: ignore[attr-defined]  # re-exported
            AdminClient,
            NewTopic,
        )

        admin = AdminClient(
            {**self._settings, "client.id": "diskguard-holds"}, logger=rdkafka_logger()
        )
        try:
            metadata = admin.list_topics(timeout=_left(deadline))
            if self.topic in metadata.topics and metadata.topics[self.topic].error is None:
                self._created = True
                return
            replicas = max(1, min(3, len(metadata.brokers)))
            topic = NewTopic(
                self.topic,
                num_partitions=1,
                replication_factor=replicas,
                config={
                    "cleanup.policy": "compact",
                    "message.timestamp.type": "LogAppendTime",
                    "min.insync.replicas": "1",
                },
            )
            created = admin.create_topics([topic], request_timeout=_left(deadline))
            for future in created.values():
                try:
                    future.result(timeout=_left(deadline))
                except KafkaException as exc:
                    if exc.args[0].name() != "TOPIC_ALREADY_EXISTS":
                        raise
            self._wait_leader(admin, deadline)
        except Exception as exc:
            raise ActuatorError(
                f"holds topic {self.topic}: cannot create it: {describe_error(exc)}"
            ) from None
        self._created = True

    def _wait_leader(self, admin: Any, deadline: float) -> None:
        """A topic just created has no leader in every broker's metadata yet: the first read
        would fail with an unknown partition."""
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                meta = admin.list_topics(self.topic, timeout=_left(deadline)).topics[self.topic]
                if meta.error is None and meta.partitions and meta.partitions[0].leader >= 0:
                    return
            time.sleep(0.2)

    # -- reading ----------------------------------------------------------------------------
    def read(self) -> dict[str, GuardHold]:
        """Every guard's latest record (tombstoned and unreadable ones left out)."""
        deadline = time.monotonic() + self.timeout_s
        self._ensure_topic(deadline)
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        try:
            if self._consumer is None:
                self._consumer = Consumer(
                    {
                        **self._settings,
                        "client.id": "diskguard-holds",
                        "group.id": "diskguard-holds-reader",  # never joined nor committed
                        "enable.auto.commit": False,
                        "enable.partition.eof": False,
                        "fetch.wait.max.ms": 100,
                    },
                    logger=rdkafka_logger(),
                )
                self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
            # Paused between reads: an idle guard's consumer does not fetch at all.
            partition = [TopicPartition(self.topic, 0)]
            self._consumer.resume(partition)
            high = self._high_watermark(deadline)
            position = self._position()
            while position < high:
                if time.monotonic() > deadline:
                    raise ActuatorError(
                        f"holds topic {self.topic}: read to offset {position} of {high} "
                        f"within {self.timeout_s:g} s"
                    )
                message = self._consumer.poll(min(0.2, _left(deadline)))
                if message is None:
                    continue
                if message.error() is not None:
                    raise ActuatorError(f"holds topic {self.topic}: {message.error().str()}")
                self._take(message)
                position = message.offset() + 1
            self._consumer.pause(partition)
        except ActuatorError:
            self.reset()
            raise
        except Exception as exc:
            self.reset()
            raise ActuatorError(f"holds topic {self.topic}: {describe_error(exc)}") from None
        return dict(self._records)

    def _high_watermark(self, deadline: float) -> int:
        """The partition's end offset from its leader; a fresh consumer may not know the
        partition yet (``_UNKNOWN_PARTITION`` until its first metadata answer), a restarted
        leader drops its connection (``_DESTROY_BROKER``): asked again until the read's
        deadline, each ask given only the time left to it."""
        from confluent_kafka import KafkaException, TopicPartition

        while True:
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(self.topic, 0), timeout=_left(deadline), cached=False
                )
                return int(high)
            except KafkaException:
                # A partition its fresh consumer does not know yet, a leader restarting:
                # asked again until the deadline; then the error is the pass's.
                if time.monotonic() + 0.2 >= deadline:
                    raise
                time.sleep(0.2)

    def _position(self) -> int:
        from confluent_kafka import TopicPartition

        (tp,) = self._consumer.position([TopicPartition(self.topic, 0)])
        return int(tp.offset) if tp.offset >= 0 else 0

    def _take(self, message: Any) -> None:
        key = (message.key() or b"").decode("utf-8", "replace")
        value = message.value()
        if value is None:
            self._records.pop(key, None)
            return
        _kind, timestamp = message.timestamp()
        try:
            hold = GuardHold.from_json(json.loads(value), renewed_ms=int(timestamp))
        except (ValueError, KeyError, TypeError):
            # Another version's record (or garbage): it needs nothing we can read; what it
            # owns stays unknown, so nothing it may own is ever counted as the operator's.
            self._records.pop(key, None)
            return
        if hold.guard == key:
            self._records[key] = hold

    # -- writing ----------------------------------------------------------------------------
    def publish(self, hold: GuardHold) -> None:
        """Write ``hold`` under its guard key and wait for ``acks=all``."""
        self._send(hold.guard, json.dumps(hold.to_json(), sort_keys=True).encode())

    def remove(self, guard: str) -> None:
        """A tombstone for ``guard``: compaction drops the key."""
        self._send(guard, None)

    def _send(self, key: str, value: bytes | None) -> None:
        deadline = time.monotonic() + self.timeout_s
        self._ensure_topic(deadline)
        from confluent_kafka import Producer

        errors: list[str] = []
        delivered: list[bool] = []

        def report(err: Any, _msg: Any) -> None:
            delivered.append(err is None)
            if err is not None:
                errors.append(err.str())

        try:
            if self._producer is None:
                self._producer = Producer(
                    {
                        **self._settings,
                        "client.id": "diskguard-holds",
                        "acks": "all",
                        "enable.idempotence": True,
                        "linger.ms": 0,
                        "message.timeout.ms": int(self.timeout_s * 1000),
                    },
                    logger=rdkafka_logger(),
                )
            self._producer.produce(self.topic, value, key=key.encode(), on_delivery=report)
            # A moment past the deadline: the report of a message that timed out in it.
            self._producer.flush(_left(deadline) + 1.0)
        except Exception as exc:
            self.reset()
            raise ActuatorError(f"holds topic {self.topic}: {describe_error(exc)}") from None
        if not delivered or errors:
            self.reset()
            raise ActuatorError(
                f"holds topic {self.topic}: record of {key} not acknowledged: "
                f"{errors[0] if errors else 'no delivery report in time'}"
            )

    def reset(self) -> None:
        """Drop the clients after a failure: the retry reconnects and reads from the start."""
        consumer, producer = self._consumer, self._producer
        self._consumer = self._producer = None
        self._records.clear()
        self._created = False
        # Closing a broken client: nothing to report.
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close()
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.flush(0)

    close = reset
