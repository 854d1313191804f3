"""Stand-ins injected at the confluent-kafka boundary, for what a test broker cannot do."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Node, TopicPartition, TopicPartitionInfo
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    DeletedRecords,
    DescribeClusterResult,
    ResourcePatternType,
    ResourceType,
    TopicDescription,
)
from kafka.protocol.admin import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from diskguard.flow.holds import QuotaEntity


def described_cluster(*node_ids: int) -> Future[Any]:
    """``describe_cluster``'s answer as confluent-kafka gives it: the brokers (default one,
    id 1)."""
    nodes = [Node(i, "127.0.0.1", 9092) for i in node_ids or (1,)]
    return _done(DescribeClusterResult(nodes[0], nodes))


def described_topics(
    topics: Any, leaders: Mapping[tuple[str, int], int] | None = None
) -> dict[str, Future[Any]]:
    """``describe_topics``'s answer: one future per asked topic, a ``TopicDescription``
    whose partitions are those of ``leaders`` for that topic (each led by the given broker
    id), ``UNKNOWN_TOPIC_OR_PART`` for a topic with none."""
    out: dict[str, Future[Any]] = {}
    for name in topics.topic_names:
        parts = sorted((p, b) for (t, p), b in (leaders or {}).items() if t == name)
        if not parts:
            error = KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))
            out[name] = _done(error=error)
            continue
        infos = [TopicPartitionInfo(p, Node(b, "127.0.0.1", 9092), [], []) for p, b in parts]
        out[name] = _done(TopicDescription(name, None, False, infos))  # type: ignore[arg-type]
    return out


class AcceptingAdmin:
    """Answers DeleteRecords like a broker that accepted every request, except on the topics
    in ``denied`` (``TOPIC_AUTHORIZATION_FAILED``, as an ACL denying DELETE makes a real
    broker answer); records each call."""

    def __init__(self, denied: frozenset[str] = frozenset()) -> None:
        self.calls: list[list[tuple[str, int, int]]] = []
        self.denied = denied

    def list_topics(self, *args: Any, **kwargs: Any) -> object:
        return object()

    def describe_cluster(self, **kwargs: Any) -> Future[Any]:
        return described_cluster()

    def describe_topics(self, topics: Any, **kwargs: Any) -> dict[str, Future[Any]]:
        return described_topics(topics)

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


class FakeQuotaBroker:
    """Answers kafka-python quota requests like a Kafka broker, from a dict of quotas."""

    def __init__(self, quotas: dict[QuotaEntity, float] | None = None) -> None:
        self.quotas: dict[QuotaEntity, float] = dict(quotas or {})
        self.requests: list[Any] = []
        self.fail_next: list[int] = []  # error codes to answer the next alters with

    def send(self, request: Any) -> Any:
        self.requests.append(request)
        if isinstance(request, DescribeClientQuotasRequest):
            assert request.strict is True
            entity = tuple(
                sorted(
                    (c.entity_type, None if c.match_type == 1 else c.match)
                    for c in request.components
                )
            )
            R = DescribeClientQuotasResponse
            entries = []
            if entity in self.quotas:
                entries.append(
                    R.EntryData(
                        entity=[
                            R.EntryData.EntityData(entity_type=k, entity_name=n) for k, n in entity
                        ],
                        values=[
                            R.EntryData.ValueData(
                                key="producer_byte_rate", value=self.quotas[entity]
                            )
                        ],
                    )
                )
            return R(throttle_time_ms=0, error_code=0, error_message=None, entries=entries)
        assert isinstance(request, AlterClientQuotasRequest)
        A = AlterClientQuotasResponse
        out = []
        for entry in request.entries:
            entity = tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity))
            code = self.fail_next.pop(0) if self.fail_next else 0
            if code == 0:
                for op in entry.ops:
                    assert op.key == "producer_byte_rate"
                    if op.remove:
                        self.quotas.pop(entity, None)
                    else:
                        self.quotas[entity] = op.value
            out.append(
                A.EntryData(
                    error_code=code,
                    error_message="nope" if code else None,
                    entity=[
                        A.EntryData.EntityData(entity_type=k, entity_name=n) for k, n in entity
                    ],
                )
            )
        return A(throttle_time_ms=0, entries=out)


def _done(value: Any = None, error: BaseException | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)
    return future


class FakeConfluentAdmin:
    """confluent-kafka AdminClient's create_acls/describe_acls/delete_acls, with its shapes:
    dicts of binding/filter -> Future, and ``KafkaException(KafkaError)`` failures."""

    def __init__(self) -> None:
        self.acls: set[AclBinding] = set()
        self.fail_creates = 0
        #: Time out this many DescribeAcls (a broker that went away with the request).
        self.fail_describes = 0
        #: Answer CreateAcls with success but keep nothing (a broker that drops ACLs).
        self.forget = False
        #: A deleted ACL is still listed by this many DescribeAcls after its DeleteAcls (a
        #: KRaft broker that has not replayed the removal yet); None: listed for ever.
        self.delete_lag: int | None = 0
        self._ghosts: dict[AclBinding, int | None] = {}

    @staticmethod
    def _matches(f: AclBindingFilter, b: AclBinding) -> bool:
        """As the broker matches a filter: ``None`` and ``ANY`` match anything (MATCH, which
        diskguard never sends, is left out)."""
        return (
            f.restype in (ResourceType.ANY, b.restype)
            and f.name in (None, b.name)
            and f.resource_pattern_type in (ResourcePatternType.ANY, b.resource_pattern_type)
            and f.principal in (None, b.principal)
            and f.host in (None, b.host)
            and f.operation in (AclOperation.ANY, b.operation)
            and f.permission_type in (AclPermissionType.ANY, b.permission_type)
        )

    def create_acls(self, acls: list[AclBinding], **_: Any) -> dict[AclBinding, Future[Any]]:
        if self.fail_creates:
            self.fail_creates -= 1
            err = KafkaException(KafkaError(KafkaError.SECURITY_DISABLED, "no authorizer"))
            return {acl: _done(error=err) for acl in acls}
        if not self.forget:
            self.acls.update(acls)
        return {acl: _done() for acl in acls}

    def describe_acls(self, acl_filter: AclBindingFilter, **_: Any) -> Future[Any]:
        if self.fail_describes:
            self.fail_describes -= 1
            err = KafkaException(KafkaError(KafkaError._TIMED_OUT, "Failed while waiting"))
            return _done(error=err)
        listed = self.acls | set(self._ghosts)
        for ghost, left in list(self._ghosts.items()):
            if left is not None:
                if left <= 1:
                    del self._ghosts[ghost]
                else:
                    self._ghosts[ghost] = left - 1
        return _done([b for b in listed if self._matches(acl_filter, b)])

    def delete_acls(
        self, filters: list[AclBindingFilter], **_: Any
    ) -> dict[AclBindingFilter, Future[Any]]:
        out = {}
        for f in filters:
            matched = [b for b in self.acls if self._matches(f, b)]
            self.acls.difference_update(matched)
            if self.delete_lag != 0:
                self._ghosts.update(dict.fromkeys(matched, self.delete_lag))
            out[f] = _done(matched)
        return out

    def replay(self) -> None:
        """The broker has replayed every removal: DescribeAcls no longer lists any of them."""
        self._ghosts.clear()

    def topics(self) -> set[str]:
        return {a.name for a in self.acls}
