"""Ships spooled snapshots to a Kafka topic, at least once and in order.

The spool is the source of truth; this module only moves its cursor. A record counts as
shipped when its delivery report succeeded AND every record before it did too, so the cursor
only ever advances over a contiguous delivered prefix. When anything fails (broker down,
message timeout, topic missing) the sink waits for all in-flight reports, then replays from
the cursor. Replays can duplicate records; the Spark job deduplicates by
``(host, mount, ts_ms)``. Nothing is lost while the spool holds it.

``ship`` never blocks for long (a poll with a small timeout), so the daemon loop calls it
every cycle; ``close`` flushes what it can before exit.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from diskguard.broker.errors import rdkafka_logger
from diskguard.logs import get_logger
from diskguard.snapshots.record import encode_record
from diskguard.snapshots.spool import Spool, SpoolPosition

log = get_logger("diskguard.kafkasink")

#: Defaults the operator may override through ``[broker.client]``; the safety settings
#: (acks, idempotence) may not be overridden.
DEFAULT_CLIENT_SETTINGS: dict[str, str | int | float | bool] = {
    # Failed deliveries must come back as errors (then replayed from the spool) rather than
    # sit in librdkafka's queue for the default five minutes.
    "message.timeout.ms": 60_000,
    # Reconnect quickly when the broker returns; the default backs off to 10 s.
    "reconnect.backoff.max.ms": 2_000,
    "linger.ms": 50,
}


#: Errors no replay can fix; the record is logged and stepped over.
_UNSHIPPABLE = frozenset({KafkaError.MSG_SIZE_TOO_LARGE})


@dataclass
class _InFlight:
    position: SpoolPosition
    #: None = no report yet; True = delivered; False = failed.
    delivered: bool | None = None


class KafkaSink:
    """At-least-once, in-order shipping from a :class:`Spool` to one topic.

    ``max_in_flight`` bounds how many records are produced but not yet reported, so a long
    outage costs at most that many records of librdkafka memory; the rest wait in the spool.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        client_settings: Mapping[str, str | int | float | bool],
        spool: Spool,
        *,
        max_in_flight: int = 1000,
        retry_backoff_s: float = 1.0,
    ) -> None:
        self.topic = topic
        self.spool = spool
        self.max_in_flight = max(1, max_in_flight)
        self.retry_backoff_s = retry_backoff_s
        settings: dict[str, str | int | float | bool] = {
            **DEFAULT_CLIENT_SETTINGS,
            **client_settings,
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
        }
        settings.setdefault("client.id", "diskguard-snapshots")
        self._settings = settings
        try:
            self._producer = self._new_producer()
        except KafkaException as exc:
            raise ValueError(f"kafka producer settings: {exc.args[0]}") from None
        self._in_flight: deque[_InFlight] = deque()
        #: Last record handed to the producer; None = resume from the spool's cursor.
        self._sent_upto: SpoolPosition | None = None
        #: A delivery failed: stop producing, wait for in-flight reports, replay.
        self._failed = False
        self._retry_at = 0.0
        #: Records delivered (cursor advanced over) since this sink was created.
        self.shipped_total = 0
        #: Delivery reports that came back as errors.
        self.failed_total = 0
        #: Records stepped over because no broker would ever accept them (too large).
        self.skipped_total = 0

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def ship(self, max_records: int = 500, timeout: float = 0.05) -> int:
        """Hand up to ``max_records`` spooled records to the producer; records newly shipped.

        Waits at most about ``timeout`` seconds for delivery reports.
        """
        if self.spool.queued_in_memory:
            self.spool.flush_queue()  # records waiting for disk space only ship once durable
        self._producer.poll(0)
        shipped = self._advance()
        if self._failed and not self._in_flight and time.monotonic() >= self._retry_at:
            # Every report is in: replay everything after the cursor, in order, from a fresh
            # producer. After in-flight timeouts the idempotent producer bumps its epoch, and
            # brokers that do not implement KIP-360 (tansu) answer PRODUCER_FENCED forever; a
            # new producer id is the one recovery that works against every broker.
            self._failed = False
            self._sent_upto = None
            self._producer = self._new_producer()
        if not self._failed:
            self._produce(max_records)
        self._producer.poll(timeout if self._in_flight else 0)
        return shipped + self._advance()

    def close(self, timeout: float = 10.0) -> int:
        """Flush for up to ``timeout`` seconds, record what was delivered; records shipped."""
        deadline = time.monotonic() + timeout
        shipped = self._advance()
        while self._in_flight and time.monotonic() < deadline:
            self._producer.flush(min(0.2, max(0.0, deadline - time.monotonic())))
            shipped += self._advance()
        remaining = self._producer.flush(0)
        if remaining:
            log.warning("snapshot_ship_unfinished", in_flight=remaining)
        return shipped

    def _new_producer(self) -> Producer:
        return Producer({**self._settings, "error_cb": self._on_error}, logger=rdkafka_logger())

    def _on_error(self, err: KafkaError) -> None:
        """Client-level errors (all brokers down, fatal idempotence errors)."""
        if err.fatal():
            # The producer is unusable; fail everything so ship() builds a new one.
            log.error("snapshot_ship_failed", topic=self.topic, error=err.str(), fatal=True)
            self._failed = True
            for entry in self._in_flight:
                if entry.delivered is None:
                    entry.delivered = False

    def _produce(self, max_records: int) -> None:
        room = min(max_records, self.max_in_flight - len(self._in_flight))
        if room <= 0:
            return
        for position, record in self.spool.pending(after=self._sent_upto):
            entry = _InFlight(position)
            key = str(record.get("host", "")).encode("utf-8")
            try:
                self._producer.produce(
                    self.topic,
                    value=encode_record(record),
                    key=key,
                    on_delivery=self._reporter(entry),
                )
            except BufferError:
                break  # librdkafka's own queue is full; the rest goes next cycle
            except KafkaException as exc:
                error = exc.args[0] if exc.args else None
                if isinstance(error, KafkaError) and error.code() in _UNSHIPPABLE:
                    self._skip(entry, error)  # done as far as the cursor is concerned
                else:
                    self._fail(entry, str(error))
                    break
            self._in_flight.append(entry)
            self._sent_upto = position
            room -= 1
            if room <= 0:
                break

    def _reporter(self, entry: _InFlight) -> Callable[[KafkaError | None, Message], None]:
        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                entry.delivered = True
            elif err.code() in _UNSHIPPABLE:
                self._skip(entry, err)
            else:
                entry.delivered = False
                self._fail(entry, err.str())

        return on_delivery

    def _skip(self, entry: _InFlight, error: KafkaError) -> None:
        """A record no retry can deliver (bigger than the broker accepts): step over it,
        or it would block every later snapshot forever."""
        self.skipped_total += 1
        log.error(
            "snapshot_ship_failed",
            topic=self.topic,
            error=error.str(),
            skipped=True,
            seq=entry.position.seq,
            offset=entry.position.offset,
            hint="raise message.max.bytes in [broker.client] and on the topic",
        )
        entry.delivered = True

    def _fail(self, entry: _InFlight, error: str) -> None:
        self.failed_total += 1
        if not self._failed:
            # One line per outage, not one per record.
            log.warning(
                "snapshot_ship_failed",
                topic=self.topic,
                error=error,
                seq=entry.position.seq,
                offset=entry.position.offset,
                in_flight=len(self._in_flight),
            )
        self._failed = True
        self._retry_at = time.monotonic() + self.retry_backoff_s

    def _advance(self) -> int:
        """Move the cursor over the contiguous delivered prefix; how many records that was."""
        count = 0
        last: SpoolPosition | None = None
        while self._in_flight and self._in_flight[0].delivered:
            last = self._in_flight.popleft().position
            count += 1
        if self._failed and all(e.delivered is not None for e in self._in_flight):
            # Every report after the failure is in: all of it gets replayed from the cursor.
            self._in_flight.clear()
        if last is not None:
            self.spool.mark_shipped(last)
            self.shipped_total += count
            log.info("snapshot_shipped", topic=self.topic, count=count, seq=last.seq)
        return count


def producer_settings_problem(settings: Mapping[str, Any]) -> str | None:
    """A one-line reason the extra client settings are unusable, or None (for check-config)."""
    try:
        Producer({**settings, "bootstrap.servers": "localhost:9092"})
    except KafkaException as exc:
        return str(exc.args[0])
    return None
