"""Stand-ins injected at the confluent-kafka boundary, for what a test broker cannot do."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import DeletedRecords


class AcceptingAdmin:
    """Answers DeleteRecords like a broker that accepted every request, except on the topics
    in ``denied`` (``TOPIC_AUTHORIZATION_FAILED``, as an ACL denying DELETE makes a real
    broker answer); records each call."""

    def __init__(self, denied: frozenset[str] = frozenset()) -> None:
        self.calls: list[list[tuple[str, int, int]]] = []
        self.denied = denied

    def list_topics(self, *args: Any, **kwargs: Any) -> object:
        return object()

    def delete_records(
        self, tps: list[TopicPartition], **kwargs: Any
    ) -> Mapping[TopicPartition, concurrent.futures.Future[Any]]:
        self.calls.append([(tp.topic, tp.partition, tp.offset) for tp in tps])
        out = {}
        for tp in tps:
            fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
            if tp.topic in self.denied:
                fut.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)))
            else:
                fut.set_result(DeletedRecords(tp.offset))
            out[TopicPartition(tp.topic, tp.partition, tp.offset)] = fut
        return out

    def list_consumer_groups(self, **kwargs: Any) -> concurrent.futures.Future[Any]:
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        fut.set_result(type("R", (), {"valid": [], "errors": []})())
        return fut
