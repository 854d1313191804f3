"""The demo's producers: a real Kafka client (confluent-kafka) writing several topics.

One thread, one ``Producer``, a rate the story sets: a steady trickle, as fast as the broker
takes it (a burst, or filling the disk), or nothing. Records are incompressible bytes of each
topic's size; the compacted topic's are keyed. ``backfill`` first writes history with
timestamps spread over each topic's past (a topic's segments are dated by their records'
timestamps, which is what "globally oldest" compares), so the order in which diskguard
deletes is visible: a day-old ``payments`` segment goes before a two-hour-old ``clickstream``
one, and the two-day-old compacted ``customers`` never goes.

Producers behave as an application should when the broker refuses writes: a delivery report
``TOPIC_AUTHORIZATION_FAILED`` (the ``acl`` actuator's DENY WRITE) makes them stop sending and
probe with one record a second until a write is accepted again. What they notice is put on
``notices`` for the story to tell.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

MiB = 1024 * 1024
SEGMENT_BYTES = 1 * MiB
#: Records of the compacted topic are kept for at least this long (the cleaner leaves them
#: alone during the demo, as a young compacted topic on a real cluster).
COMPACTION_LAG_MS = 7 * 24 * 3600 * 1000
_PROBE_EVERY_S = 1.0
_TICK_S = 0.02


@dataclass(frozen=True)
class Topic:
    """One topic: its share of the traffic, its record size, how far back its history goes."""

    name: str
    partitions: int
    weight: float
    record_bytes: int
    history_hours: float
    compacted: bool = False

    def configs(self) -> dict[str, str]:
        """Topic configs at creation: 1 MiB segments (Kafka 4.x's smallest ``segment.bytes``),
        and for the compacted topic its policy and a lag that keeps the cleaner away."""
        out = {"segment.bytes": str(SEGMENT_BYTES)}
        if self.compacted:
            out |= {"cleanup.policy": "compact", "min.compaction.lag.ms": str(COMPACTION_LAG_MS)}
        return out


TOPICS: tuple[Topic, ...] = (
    Topic("payments", 1, 1.0, 1200, 24.0),
    Topic("orders", 3, 3.0, 1800, 6.0),
    Topic("clickstream", 2, 5.0, 900, 2.0),
    Topic("customers", 1, 0.6, 900, 48.0, compacted=True),
)


class Traffic:
    """Producers writing ``topics`` at the rate last set (``None``: as fast as it goes)."""

    def __init__(self, bootstrap: str, topics: tuple[Topic, ...] = TOPICS) -> None:
        from confluent_kafka import Producer

        self.topics = topics
        self.notices: queue.Queue[str] = queue.Queue()
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "client.id": "demo-producers",
                "linger.ms": 20,
                "batch.size": 512 * 1024,
                "queue.buffering.max.kbytes": 32 * 1024,
                "message.timeout.ms": 15_000,
                # After a TOPIC_AUTHORIZATION_FAILED the client may refuse the topic itself
                # (produce() raises) until its next metadata refresh, by default 5 min away:
                # once a second here, so the producers notice soon that the hold is gone.
                "topic.metadata.refresh.interval.ms": 1000,
                "acks": "all",
                "log_level": 0,
            }
        )
        self._noise = os.urandom(1 << 16)
        self._credit = dict.fromkeys((t.name for t in topics), 0.0)
        self._total_weight = sum(t.weight for t in topics)
        self._seq = 0
        self._lock = threading.Lock()
        self._rate: float | None = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Records the broker accepted, their bytes, those it refused for authorization, and
        #: those that failed otherwise (a broker that died, a full disk).
        self.delivered = 0
        self.delivered_bytes = 0
        self.refused = 0
        self.failed = 0
        self.held = False
        #: Seconds the broker refused writes, from the first refusal to the accepted probe.
        self.held_seconds = 0.0
        self._held_since = 0.0
        self._held_reported = False
        self._next_probe = 0.0

    # -- records ---------------------------------------------------------------------------
    def _record(self, topic: Topic) -> tuple[bytes, bytes | None]:
        self._seq += 1
        start = (self._seq * 7919) % (len(self._noise) - topic.record_bytes)
        value = self._noise[start : start + topic.record_bytes]
        key = f"customer-{self._seq % 5000}".encode() if topic.compacted else None
        return value, key

    def _produce(self, topic: Topic, timestamp_ms: int = 0, callback: Any = None) -> None:
        from confluent_kafka import KafkaException

        value, key = self._record(topic)
        while True:
            try:
                self._producer.produce(
                    topic.name,
                    value,
                    key=key,
                    timestamp=timestamp_ms,
                    on_delivery=callback or self._on_delivery,
                )
                return
            except BufferError:
                if self._stop.is_set():
                    return  # a broker that died leaves the queue full: nothing more goes
                self._producer.poll(0.05)
            except KafkaException as exc:
                # Refused before it is sent: the client's own view of the topic (above).
                self._on_delivery(exc.args[0], None)
                return

    def _on_delivery(self, err: Any, msg: Any) -> None:
        from confluent_kafka import KafkaError

        if err is None:
            self.delivered += 1
            self.delivered_bytes += len(msg.value() or b"")
        elif err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            self.refused += 1
            if not self.held:
                self.held = True
                self._held_since = time.monotonic()
                self._next_probe = self._held_since + _PROBE_EVERY_S
        else:
            self.failed += 1

    def _on_probe(self, err: Any, msg: Any) -> None:
        if err is None and self.held:
            self._on_delivery(err, msg)
            self.held = False
            self.held_seconds += time.monotonic() - self._held_since
            self._held_reported = False
            self.notices.put("producers: a probe record was accepted: writing again")
        else:
            self._on_delivery(err, msg)

    # -- history ---------------------------------------------------------------------------
    def backfill(self, total_bytes: int, now_ms: int) -> int:
        """Write ``total_bytes`` of history, each topic's share spread over its last
        ``history_hours`` (oldest first), and wait for every delivery; the bytes accepted."""
        before = self.delivered_bytes
        for topic in self.topics:
            share = total_bytes * topic.weight / self._total_weight
            count = max(1, int(share // topic.record_bytes))
            start = now_ms - int(topic.history_hours * 3600_000)
            span = now_ms - 60_000 - start
            for i in range(count):
                self._produce(topic, start + span * i // count)
                if i % 2000 == 0:
                    self._producer.poll(0)
        self._producer.flush(120)
        return self.delivered_bytes - before

    # -- live traffic ----------------------------------------------------------------------
    def set_rate(self, bytes_per_s: float | None) -> None:
        """``None``: as fast as the broker takes it; 0: nothing."""
        with self._lock:
            self._rate = bytes_per_s

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="demo-producers", daemon=True)
        self._thread.start()

    def stop(self, flush_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._producer.flush(flush_s)

    def _run(self) -> None:
        try:
            self._loop()
        except Exception as exc:  # the story must hear of it, not a traceback on stderr
            self.notices.put(f"producers: stopped by {type(exc).__name__}: {exc}")

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            with self._lock:
                rate = self._rate
            if self.held:
                if not self._held_reported:
                    self._held_reported = True
                    self.notices.put(
                        "producers: the broker refuses their writes (TOPIC_AUTHORIZATION_FAILED):"
                        " held back, probing once a second"
                    )
                if now >= self._next_probe:
                    self._next_probe = now + _PROBE_EVERY_S
                    self._produce(self.topics[0], callback=self._on_probe)
            elif rate is None:
                self._flood(now + _TICK_S)
            elif rate > 0:
                self._write_bytes(rate * (now - last))
            last = now
            self._producer.poll(_TICK_S)

    def _flood(self, until: float) -> None:
        """As much as the client's queue takes until ``until`` (each record waits for room)."""
        while time.monotonic() < until and not self.held and not self._stop.is_set():
            for _ in range(200):
                self._write_bytes(self._average_record_bytes())
            self._producer.poll(0)

    def _average_record_bytes(self) -> float:
        return sum(t.weight * t.record_bytes for t in self.topics) / self._total_weight

    def _write_bytes(self, nbytes: float) -> None:
        """About ``nbytes`` of records, shared between the topics by weight (remainders
        carried to the next call)."""
        for topic in self.topics:
            self._credit[topic.name] += nbytes * topic.weight / self._total_weight
            while self._credit[topic.name] >= topic.record_bytes:
                self._credit[topic.name] -= topic.record_bytes
                self._produce(topic)
