"""The broker edge. Two kinds of evidence (see docs/broker-calls.md):

- the real ``tansu`` Kafka-protocol broker: reachability, what a broker that does not
  implement DeleteRecords does to the call (it must become a failed result, never an
  exception in the loop), committed consumer-group offsets end to end;
- the AdminClient boundary, with an injected fake admin returning futures shaped exactly like
  confluent-kafka's (``DeletedRecords`` / ``KafkaException(KafkaError(...))``), for the
  DeleteRecords answers tansu cannot give (success, not leader, authorization, timeouts).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (
    AdminClient,
    ConfigEntry,
    ConfigResource,
    ConsumerGroupListing,
    DeletedRecords,
    ListConsumerGroupsResult,
    NewTopic,
)
from structlog.testing import capture_logs

from diskguard.broker.client import BrokerClient, describe_error
from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir, Partition, SegmentInfo
from diskguard.retention.limits import Limits
from diskguard.retention.planner import NO_OFFSET, Deletion, plan_filesystem
from support.fakes import described_cluster, described_topics
from support.net import free_port
from support.tansu import run_tansu


def deletion(topic: str, partition: int, base: int, nxt: int, size: int = 1000) -> Deletion:
    return Deletion(
        log_dir="/data/kafka",
        topic=topic,
        partition=partition,
        base_offset=base,
        next_offset=nxt,
        max_timestamp_ms=0,
        bytes=size,
        files=(),
        mount="/data",
    )


# ----------------------------------------------------------------------------- fake boundary

NEVER = object()  # a future the broker never completes
ABSENT = object()  # the partition is missing from the answer


class FakeAdmin:
    """Answers like ``confluent_kafka.admin.AdminClient``: dicts of futures keyed by
    ``TopicPartition`` (DeleteRecords) or group id (offsets)."""

    def __init__(self) -> None:
        self.delete_answers: dict[tuple[str, int], Any] = {}
        self.delete_raises: BaseException | None = None
        self.delete_calls: list[tuple[list[tuple[str, int, int]], dict[str, Any]]] = []
        self.groups: Any = []
        #: The groups' listing cut short by the client's timeout after this many seconds:
        #: librdkafka answers it partial (the groups so far and a timeout error), not raised.
        self.groups_time_out_after: float | None = None
        self.group_offsets: dict[str, Any] = {}
        self.topics_raise: BaseException | None = None
        #: topic -> {key: value} or an exception for that topic's future; absent topics are
        #: left out of the answer.
        self.configs: dict[str, Any] = {}
        self.configs_raise: BaseException | None = None
        self.config_calls: list[list[str]] = []
        #: Broker ids in the cluster (``describe_cluster``); leader per partition
        #: (``describe_topics``: a topic without any is unknown to the broker).
        self.nodes: tuple[int, ...] = (1,)
        self.leaders: dict[tuple[str, int], int] = {}
        self.describe_topics_calls: list[list[str]] = []
        #: Log start offset per partition (ListOffsets EARLIEST); absent: that one fails.
        self.log_starts: dict[tuple[str, int], int] = {}
        self.list_offsets_calls: list[list[tuple[str, int]]] = []
        self.list_offsets_raise: BaseException | None = None

    def list_topics(self, *args: Any, **kwargs: Any) -> Any:
        if self.topics_raise is not None:
            raise self.topics_raise
        return object()

    def describe_cluster(self, **kwargs: Any) -> concurrent.futures.Future[Any]:
        if self.topics_raise is not None:
            raise self.topics_raise
        return described_cluster(*self.nodes)

    def describe_topics(
        self, topics: Any, **kwargs: Any
    ) -> Mapping[str, concurrent.futures.Future[Any]]:
        self.describe_topics_calls.append(list(topics.topic_names))
        if self.topics_raise is not None:
            raise self.topics_raise
        return described_topics(topics, self.leaders)

    def list_offsets(
        self, request: Mapping[TopicPartition, Any], **kwargs: Any
    ) -> Mapping[TopicPartition, concurrent.futures.Future[Any]]:
        self.list_offsets_calls.append([(tp.topic, tp.partition) for tp in request])
        if self.list_offsets_raise is not None:
            raise self.list_offsets_raise
        out: dict[TopicPartition, concurrent.futures.Future[Any]] = {}
        for tp in request:
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            start = self.log_starts.get((tp.topic, tp.partition))
            if start is None:
                future.set_exception(kafka_error(KafkaError.NOT_LEADER_FOR_PARTITION))
            else:
                future.set_result(TopicPartition(tp.topic, tp.partition, start))
            out[tp] = future
        return out

    def delete_records(
        self, topic_partition_offsets: list[TopicPartition], **kwargs: Any
    ) -> Mapping[TopicPartition, concurrent.futures.Future[Any]]:
        self.delete_calls.append(
            ([(tp.topic, tp.partition, tp.offset) for tp in topic_partition_offsets], kwargs)
        )
        if self.delete_raises is not None:
            raise self.delete_raises
        out: dict[TopicPartition, concurrent.futures.Future[Any]] = {}
        for tp in topic_partition_offsets:
            answer = self.delete_answers.get((tp.topic, tp.partition), tp.offset)
            if answer is ABSENT:
                continue
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            if isinstance(answer, BaseException):
                future.set_exception(answer)
            elif answer is not NEVER:
                future.set_result(DeletedRecords(answer))
            out[TopicPartition(tp.topic, tp.partition, tp.offset)] = future
        return out

    def list_consumer_groups(self, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if isinstance(self.groups, BaseException):
            future.set_exception(self.groups)
        elif self.groups_time_out_after is not None:
            partial = ListConsumerGroupsResult(
                valid=[], errors=[kafka_error(KafkaError._TIMED_OUT, "Local: Timed out")]
            )
            threading.Timer(self.groups_time_out_after, future.set_result, [partial]).start()
        else:
            future.set_result(
                ListConsumerGroupsResult(
                    valid=[ConsumerGroupListing(g, False) for g in self.groups], errors=[]
                )
            )
        return future

    def list_consumer_group_offsets(
        self, list_consumer_group_offsets_request: list[ConsumerGroupTopicPartitions], **kwargs: Any
    ) -> Mapping[str, concurrent.futures.Future[Any]]:
        assert len(list_consumer_group_offsets_request) == 1  # the API takes one group
        group = list_consumer_group_offsets_request[0].group_id
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        answer = self.group_offsets[group]
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            tps = [TopicPartition(t, p, off) for t, p, off in answer]
            future.set_result(ConsumerGroupTopicPartitions(group, tps))
        return {group: future}

    def describe_configs(
        self, resources: list[ConfigResource], **kwargs: Any
    ) -> Mapping[ConfigResource, concurrent.futures.Future[Any]]:
        self.config_calls.append([r.name for r in resources])
        if self.configs_raise is not None:
            raise self.configs_raise
        out: dict[ConfigResource, concurrent.futures.Future[Any]] = {}
        for resource in resources:
            if resource.name not in self.configs:
                continue
            future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            answer = self.configs[resource.name]
            if isinstance(answer, BaseException):
                future.set_exception(answer)
            elif answer is not NEVER:
                future.set_result({k: ConfigEntry(k, v) for k, v in answer.items()})
            out[resource] = future
        return out


def kafka_error(code: int, text: str = "") -> KafkaException:
    return KafkaException(KafkaError(code, text) if text else KafkaError(code))


def test_delete_records_one_request_up_to_each_partitions_highest_next_offset() -> None:
    admin = FakeAdmin()
    client = BrokerClient("unused:9092", timeout=2.0, admin=admin)
    chosen = [
        deletion("orders", 0, 0, 100, 10),
        deletion("orders", 1, 0, 50, 20),
        deletion("orders", 0, 100, 250, 30),
    ]
    results = client.delete_records(chosen)
    assert len(admin.delete_calls) == 1
    request, kwargs = admin.delete_calls[0]
    assert sorted(request) == [("orders", 0, 250), ("orders", 1, 50)]
    assert kwargs["request_timeout"] == 2.0
    assert [r.deletion for r in results] == chosen
    assert all(r.ok and r.mode == "broker" and r.error is None for r in results)
    # What the broker will reclaim at its next retention check: the segments' bytes.
    assert [r.freed_bytes for r in results] == [10, 20, 30]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (kafka_error(KafkaError.NOT_LEADER_FOR_PARTITION), "NOT_LEADER_FOR_PARTITION"),
        (kafka_error(KafkaError.UNKNOWN_TOPIC_OR_PART), "UNKNOWN_TOPIC_OR_PART"),
        (kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED), "DELETE permission"),
        (kafka_error(KafkaError.REQUEST_TIMED_OUT), "REQUEST_TIMED_OUT"),
        (kafka_error(KafkaError.UNSUPPORTED_VERSION), "does not support DeleteRecords"),
        (kafka_error(KafkaError.OFFSET_OUT_OF_RANGE), "OFFSET_OUT_OF_RANGE"),
        (NEVER, "timed out"),
        (ABSENT, "no answer"),
        (40, "below the requested offset 100"),
    ],
)
def test_per_partition_errors_become_failed_results(answer: Any, expected: str) -> None:
    admin = FakeAdmin()
    admin.delete_answers[("orders", 0)] = answer
    client = BrokerClient("unused:9092", timeout=0.2, admin=admin)
    results = client.delete_records([deletion("orders", 0, 0, 100), deletion("orders", 1, 0, 9)])
    bad, good = results
    assert not bad.ok and bad.freed_bytes == 0 and expected in (bad.error or ""), bad.error
    assert good.ok  # one partition's error does not fail the others


@pytest.mark.parametrize(
    ("answer", "lasting"),
    [
        (kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED), True),
        (kafka_error(KafkaError.POLICY_VIOLATION), True),
        (kafka_error(KafkaError.NOT_LEADER_FOR_PARTITION), False),
        (kafka_error(KafkaError.REQUEST_TIMED_OUT), False),
        (kafka_error(KafkaError.UNKNOWN_TOPIC_OR_PART), False),
        (NEVER, False),
        (40, False),
    ],
)
def test_only_answers_that_recur_mark_a_failure_lasting(answer: Any, lasting: bool) -> None:
    """A denied or policy-violating DeleteRecords repeats until an ACL or a topic config
    changes (the cycle sets the partition aside); a leader moving or a timeout may pass."""
    admin = FakeAdmin()
    admin.delete_answers[("orders", 0)] = answer
    client = BrokerClient("unused:9092", timeout=0.2, admin=admin)
    bad, good = client.delete_records([deletion("orders", 0, 0, 100), deletion("x", 1, 0, 9)])
    assert not bad.ok and bad.lasting is lasting
    assert good.ok and not good.lasting


@pytest.mark.parametrize(
    "exc",
    [kafka_error(KafkaError._TRANSPORT), ValueError("bad offsets"), TypeError("bad type")],
)
def test_a_failing_call_fails_every_deletion_without_raising(exc: BaseException) -> None:
    admin = FakeAdmin()
    admin.delete_raises = exc
    client = BrokerClient("unused:9092", timeout=0.2, admin=admin)
    results = client.delete_records([deletion("a", 0, 0, 5), deletion("b", 0, 0, 5)])
    assert [r.ok for r in results] == [False, False]
    assert all(r.error and not r.lasting for r in results)
    assert client.delete_records([]) == []


def test_reachable_with_the_fake() -> None:
    admin = FakeAdmin()
    client = BrokerClient("unused:9092", admin=admin)
    assert client.reachable() is True
    admin.topics_raise = kafka_error(KafkaError._TRANSPORT)
    assert client.reachable() is False


def test_leaders_ask_for_the_wanted_topics_only() -> None:
    """One Metadata request for the topics asked about (DescribeTopics), not the cluster's
    every partition; a topic the broker does not know gives no preference, quietly."""
    admin = FakeAdmin()
    admin.leaders = {("a", 0): 1, ("a", 1): 2, ("b", 0): 1, ("c", 0): 3}
    client = BrokerClient("unused:9092", admin=admin)
    assert client.leaders(["b", "a", "gone", "a"]) == {("a", 0): 1, ("a", 1): 2, ("b", 0): 1}
    assert admin.describe_topics_calls == [["a", "b", "gone"]]
    assert client.leaders([]) == {} and len(admin.describe_topics_calls) == 1
    admin.topics_raise = kafka_error(KafkaError._TRANSPORT)
    with capture_logs() as logs:
        assert client.leaders(["a"]) == {}
    assert [e["event"] for e in logs] == ["metadata_unavailable"]


def test_broker_configs_without_a_broker_id_ask_the_first_broker() -> None:
    admin = FakeAdmin()
    admin.nodes = (3, 2)
    admin.configs = {"2": {"log.retention.check.interval.ms": "1000"}}
    client = BrokerClient("unused:9092", admin=admin)
    assert client.broker_configs(None) == {"log.retention.check.interval.ms": "1000"}
    assert admin.config_calls == [["2"]]


def test_committed_offsets_from_every_group_for_the_wanted_topics() -> None:
    admin = FakeAdmin()
    admin.groups = ["billing", "audit", "broken"]
    admin.group_offsets = {
        "billing": [("orders", 0, 120), ("orders", 1, 7), ("other", 0, 5)],
        "audit": [("orders", 0, 30), ("orders", 1, -1001)],  # -1001: nothing committed
        "broken": kafka_error(KafkaError.GROUP_AUTHORIZATION_FAILED),
    }
    client = BrokerClient("unused:9092", admin=admin)
    assert client.committed_offsets(["orders"]) == {
        ("orders", 0): {"billing": 120, "audit": 30},
        ("orders", 1): {"billing": 7, "audit": NO_OFFSET},  # audit consumes orders, not 1 yet
    }
    assert client.committed_offsets([]) == {}
    admin.groups = kafka_error(KafkaError._TIMED_OUT)
    assert client.committed_offsets(["orders"]) == {}


def test_group_without_committed_offset_on_a_partition_has_not_consumed_it() -> None:
    """From the AdminClient answer to the plan: a group that commits on some partitions of a
    topic but not on others (offset -1001, or the partition absent from the answer) has read
    nothing there; its segments sort as unconsumed and report the whole segment."""
    admin = FakeAdmin()
    admin.groups = ["billing", "idle"]
    admin.group_offsets = {
        # orders-0 all read; orders-1 explicitly nothing committed; orders-2 not in the answer.
        "billing": [("orders", 0, 500), ("orders", 1, -1001)],
        "idle": [("orders", 0, -1001), ("orders", 1, -1001)],  # consumes nothing of orders
    }
    committed = BrokerClient("unused:9092", admin=admin).committed_offsets(["orders"])
    assert committed == {("orders", 0): {"billing": 500}, ("orders", 1): {"billing": NO_OFFSET}}

    parts = [
        Partition("/d/k", t, p, f"/d/k/{t}-{p}", (0, 100, 200))
        for t, p in (("orders", 2), ("orders", 1), ("orders", 0), ("other", 0))
    ]
    usage = FilesystemUsage("/d", "/dev/x", 100 * 1024**2, 99 * 1024**2, 1024**2)
    fs = Filesystem(usage, (LogDir("/d/k", "/d", tuple(parts)),))

    def read(partition: Partition, base: int) -> SegmentInfo:
        return SegmentInfo(1024**2, 1000 + base, "timeindex", ())

    # 3.5 MiB excess: the four equally old first segments, read ones first ("other" has no
    # consumer group at all).
    _, chosen = plan_filesystem(fs, Limits(95.5, 95.5), read, committed)
    order = [(d.topic, d.partition) for d in chosen]
    assert order == [("orders", 0), ("other", 0), ("orders", 1), ("orders", 2)]
    by_part = {d.partition: d for d in chosen if d.topic == "orders"}
    assert by_part[0].unconsumed_records == {} and not by_part[0].groups_without_offset
    for key in (1, 2):
        assert by_part[key].unconsumed_records == {"billing": 100}
        assert by_part[key].groups_without_offset == ("billing",)


def test_describe_topic_configs_returns_the_policy_keys_of_answered_topics() -> None:
    admin = FakeAdmin()
    admin.configs = {
        "orders": {"cleanup.policy": "delete", "remote.storage.enable": "false", "x": "1"},
        "events": {"cleanup.policy": "compact,delete"},  # a broker returning only set keys
        "denied": kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED),
        "slow": NEVER,
    }
    client = BrokerClient("unused:9092", admin=admin, timeout=0.2)
    with capture_logs() as logs:
        got = client.describe_topic_configs(["orders", "events", "denied", "slow", "gone"])
    assert got == {
        "orders": {"cleanup.policy": "delete", "remote.storage.enable": "false"},
        "events": {"cleanup.policy": "compact,delete"},
    }
    assert admin.config_calls == [["denied", "events", "gone", "orders", "slow"]]
    # One warning names every topic left unknown.
    warnings = [e for e in logs if e["event"] == "topic_configs_unavailable"]
    assert len(warnings) == 1
    assert warnings[0]["topics"] == ["denied", "gone", "slow"]
    assert client.describe_topic_configs([]) == {}


def test_a_failing_describe_configs_call_answers_nothing_without_raising() -> None:
    admin = FakeAdmin()
    admin.configs_raise = kafka_error(KafkaError._TRANSPORT)
    client = BrokerClient("unused:9092", admin=admin)
    with capture_logs() as logs:
        assert client.describe_topic_configs(["orders"]) == {}
    assert [e["topics"] for e in logs if e["event"] == "topic_configs_unavailable"] == [["orders"]]


def test_describe_error() -> None:
    assert describe_error(kafka_error(KafkaError._TRANSPORT)).startswith("_TRANSPORT:")
    assert "timed out" in describe_error(concurrent.futures.TimeoutError())
    assert describe_error(RuntimeError("x")) == "RuntimeError: x"


# ----------------------------------------------------------------------------- real tansu


@pytest.fixture(scope="module")
def tansu() -> Iterator[str]:
    with run_tansu() as bootstrap:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic("orders", 2, 1)]).values():
            future.result(10)
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(30):
            producer.produce("orders", b"x" * 100, partition=i % 2)
        assert producer.flush(10) == 0
        yield bootstrap


def test_reachable_against_tansu_and_a_closed_port(tansu: str) -> None:
    assert BrokerClient(tansu, timeout=5.0).reachable() is True
    started = time.monotonic()
    assert BrokerClient(f"127.0.0.1:{free_port()}", timeout=1.0).reachable() is False
    assert time.monotonic() - started < 5  # bounded by the timeout, not hanging


def test_delete_records_against_tansu_is_a_failed_result_and_the_loop_goes_on(tansu: str) -> None:
    """tansu 0.6 (memory engine) does not implement DeleteRecords: the broker task panics
    ("not yet implemented") and drops the connection, which librdkafka reports as
    ``_TRANSPORT``. Whatever the exact error, it must come back as a failed result."""
    client = BrokerClient(tansu, timeout=5.0)
    started = time.monotonic()
    results = client.delete_records([deletion("orders", 0, 0, 5), deletion("orders", 0, 5, 10)])
    assert time.monotonic() - started < 20
    assert [r.ok for r in results] == [False, False]
    assert all(r.error and r.mode == "broker" and r.freed_bytes == 0 for r in results)
    print("tansu DeleteRecords answer:", results[0].error)
    # The broker survives it and the client keeps working.
    assert client.reachable() is True


def test_committed_offsets_against_tansu(tansu: str) -> None:
    consumer = Consumer(
        {"bootstrap.servers": tansu, "group.id": "billing", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition("orders", 0, 0), TopicPartition("orders", 1, 0)])
        consumer.commit(
            offsets=[TopicPartition("orders", 0, 7), TopicPartition("orders", 1, 3)],
            asynchronous=False,
        )
    finally:
        consumer.close()
    offsets = BrokerClient(tansu, timeout=5.0).committed_offsets(["orders", "absent"])
    assert offsets == {("orders", 0): {"billing": 7}, ("orders", 1): {"billing": 3}}


def test_within_a_cycle_a_hung_broker_is_waited_out_once() -> None:
    """A request that waits out the whole timeout unanswered makes the cycle's other
    requests fail at once with that reason; outside a cycle, and in the next one, the broker
    is asked again."""
    admin = FakeAdmin()
    admin.delete_answers = {("t", 0): NEVER}
    client = BrokerClient("127.0.0.1:1", {}, timeout=0.3, admin=admin)  # type: ignore[arg-type]
    with client.one_timeout():
        started = time.monotonic()
        (first,) = client.delete_records([deletion("t", 0, 0, 10)])
        waited = time.monotonic() - started
        assert not first.ok and "timed out" in (first.error or "")
        (second,) = client.delete_records([deletion("t", 0, 10, 20)])
        assert len(admin.delete_calls) == 1  # at once: the broker was not asked again
        assert second.error is not None and second.error.startswith(
            "the broker did not answer within 0.3 s earlier in this cycle"
        )
        assert not client.reachable()
        assert client.leaders(["t"]) == {}
    assert waited >= 0.3
    assert client.reachable()  # outside a cycle: asked
    with client.one_timeout():
        client.delete_records([deletion("t", 0, 10, 20)])  # a new cycle asks again
    assert len(admin.delete_calls) == 2


def test_a_groups_listing_cut_short_by_the_timeout_counts_as_waited_out() -> None:
    """librdkafka answers a listing the broker never finished as a partial result with a
    timeout error, not an exception: it waited the timeout out all the same, so the cycle's
    later requests fail at once rather than wait it out again, one after the other."""
    admin = FakeAdmin()
    admin.groups_time_out_after = 0.3
    client = BrokerClient("127.0.0.1:1", {}, timeout=0.3, admin=admin)  # type: ignore[arg-type]
    with client.one_timeout(), capture_logs() as logs:
        assert client.committed_offsets(["t"]) == {}
        (result,) = client.delete_records([deletion("t", 0, 0, 10)])
    assert [e["event"] for e in logs] == ["consumer_groups_partial", "delete_records_failed"]
    assert admin.delete_calls == []  # not asked: the broker did not answer earlier
    assert result.error is not None and "earlier in this cycle" in result.error


def test_log_start_offsets_asked_early_answer_as_asked_now() -> None:
    """A one-shot plan sends ListOffsets before its walk (``log_start_offsets_soon``, for
    every partition on its disks) and takes the answer for the filesystems it trims: the
    same offsets a request for those alone gives; one it did not send is asked then."""
    admin = FakeAdmin()
    admin.log_starts = {("t", 0): 10, ("t", 1): 0, ("u", 0): 7}
    client = BrokerClient("127.0.0.1:1", {}, timeout=1.0, admin=admin)  # type: ignore[arg-type]
    now = client.log_start_offsets([("t", 0), ("t", 2)])
    asked = client.log_start_offsets_soon([("t", 0), ("t", 1), ("t", 2), ("u", 0)])
    assert client.log_start_offsets([("t", 0), ("t", 2)], asked) == now == {("t", 0): 10}
    assert client.log_start_offsets([("u", 0), ("v", 0)], asked) == {("u", 0): 7}
    assert admin.list_offsets_calls[1:] == [[("t", 0), ("t", 1), ("t", 2), ("u", 0)], [("v", 0)]]


def test_log_start_offsets_asked_early_fail_when_taken_without_raising() -> None:
    admin = FakeAdmin()
    admin.list_offsets_raise = kafka_error(KafkaError._TRANSPORT, "broker down")
    client = BrokerClient("127.0.0.1:1", {}, timeout=1.0, admin=admin)  # type: ignore[arg-type]
    asked = client.log_start_offsets_soon([("t", 0)])
    assert client.log_start_offsets([("t", 0)], asked) == {}
    assert len(admin.list_offsets_calls) == 1  # not asked again


def test_placement_sent_early_is_the_placement_asked_later() -> None:
    """A one-shot plan sends DescribeTopics before asking the groups' offsets
    (``placement_soon``): the answer is ``placement``'s."""
    admin = FakeAdmin()
    admin.leaders = {("t", 0): 1, ("t", 1): 2, ("u", 0): 1}
    client = BrokerClient("127.0.0.1:1", {}, timeout=1.0, admin=admin)  # type: ignore[arg-type]
    early = client.placement_soon(["u", "t", "t"])
    assert early() == client.placement(["t", "u"]) != {}
    assert admin.describe_topics_calls == [["t", "u"], ["t", "u"]]


def test_placement_sent_before_a_request_that_hung_is_given_up_as_placement_would_be() -> None:
    """Within a cycle, a request that waits out the timeout after the leaders were asked
    leaves them unknown at once, as ``placement`` asked then would (not another wait)."""
    admin = FakeAdmin()
    admin.leaders = {("t", 0): 1}
    admin.delete_answers = {("t", 0): NEVER}
    client = BrokerClient("127.0.0.1:1", {}, timeout=0.3, admin=admin)  # type: ignore[arg-type]
    with client.one_timeout():
        early = client.placement_soon(["t"])
        client.delete_records([deletion("t", 0, 0, 10)])  # waits the whole timeout out
        assert early() == {} == client.placement(["t"])
        assert len(admin.describe_topics_calls) == 1  # placement did not ask again


def _groups_admin() -> FakeAdmin:
    admin = FakeAdmin()
    admin.groups = ["billing", "audit", "broken"]
    admin.group_offsets = {
        "billing": [("orders", 0, 120), ("orders", 1, 7), ("other", 0, 5)],
        "audit": [("orders", 0, 30), ("orders", 1, -1001), ("other", 0, -1001)],
        "broken": kafka_error(KafkaError.GROUP_AUTHORIZATION_FAILED),
    }
    return admin


@pytest.mark.parametrize("advanced", [False, True], ids=["taken", "advanced-then-taken"])
def test_offsets_asked_for_every_topic_are_those_asked_for_the_chosen(advanced: bool) -> None:
    """A one-shot plan asks the groups' offsets before its scan, knowing only the topics on
    its disks (``committed_offsets_soon``): taken for the topics it chose, the answer and
    the warnings are those of ``committed_offsets`` asked for them after the walk."""
    client = BrokerClient("unused:9092", admin=_groups_admin())
    with capture_logs() as later_logs:
        later = client.committed_offsets(["orders"])
    asked = client.committed_offsets_soon()
    if advanced:
        asked.advance()  # ListGroups answered: each group's OffsetFetch sent now
        asked.advance()  # (once)
    with capture_logs() as early_logs:
        early = asked(["orders"])
    assert (
        early
        == later
        == {
            ("orders", 0): {"billing": 120, "audit": 30},
            ("orders", 1): {"billing": 7, "audit": NO_OFFSET},
        }
    )
    assert early_logs == later_logs and [e["event"] for e in early_logs] == [
        "consumer_offsets_unavailable"
    ]


def test_offsets_asked_early_from_a_broker_that_fails_say_so_only_when_taken() -> None:
    admin = _groups_admin()
    admin.groups = kafka_error(KafkaError._TIMED_OUT)
    client = BrokerClient("unused:9092", admin=admin)
    with capture_logs() as logs:
        asked = client.committed_offsets_soon()
        asked.advance()
        assert logs == []  # a plan that chooses nothing asks for no facts, and says nothing
        assert asked(["orders"]) == {}
    assert [e["event"] for e in logs] == ["consumer_groups_unavailable"]


def test_offsets_asked_before_a_request_that_hung_are_given_up_as_asking_then_would() -> None:
    admin = _groups_admin()
    admin.delete_answers = {("orders", 0): NEVER}
    client = BrokerClient("127.0.0.1:1", {}, timeout=0.3, admin=admin)  # type: ignore[arg-type]
    with client.one_timeout():
        asked = client.committed_offsets_soon()
        client.delete_records([deletion("orders", 0, 0, 10)])  # waits the whole timeout out
        asked.advance()  # sends nothing more
        with capture_logs() as logs:
            assert asked(["orders"]) == {} == client.committed_offsets(["orders"])
    assert [e["event"] for e in logs] == ["consumer_groups_unavailable"] * 2
    assert logs[0] == logs[1]


def test_placement_asked_for_every_topic_is_the_placement_of_the_chosen() -> None:
    admin = FakeAdmin()
    admin.leaders = {("t", 0): 1, ("t", 1): 2, ("u", 0): 1, ("v", 0): 3}
    client = BrokerClient("127.0.0.1:1", {}, timeout=1.0, admin=admin)  # type: ignore[arg-type]
    early = client.placement_soon(["u", "t", "v"])
    assert early(["t", "u"]) == client.placement(["t", "u"]) != {}
    assert early(["v"]) == client.placement(["v"]) and ("v", 0) not in early(["t"])
