"""``LadderApi.log_dirs_soon``: a one-shot plan asks DescribeLogDirs on a thread while it scans
(kafka-python's import and connection included). The next ``log_dirs`` of that broker takes
the answer, or raises the failure, without asking again; the one after asks the broker as
always; a broker that was never asked for is not waited for at ``close``."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from kafka.errors import KafkaTimeoutError, RequestTimedOutError

from diskguard.broker.kafkapython import KafkaPythonAdmin
from diskguard.broker.ladderapi import LadderApi, LadderCallFailed
from diskguard.broker.patience import OneTimeout

_ANSWER = [
    {
        "broker": 1,
        "log_dirs": [
            {
                "error_code": 0,
                "log_dir": "/data/a",
                "total_bytes": 100,
                "usable_bytes": 40,
                "topics": [{"name": "orders", "partitions": [{"partition_index": 0}]}],
            }
        ],
    }
]


class _Admin:
    def __init__(
        self, fail: bool, release: threading.Event, error: Exception | None = None
    ) -> None:
        self.asked: list[list[int]] = []
        self.replicas: list[dict[str, list[int]]] = []
        self.fail = fail
        self.release = release
        self.error = error or ConnectionError("refused")

        self.inside = 0
        self.most_inside = 0
        self.entered = threading.Event()

    def describe_log_dirs(
        self, topic_partitions: dict[str, list[int]], brokers: list[int]
    ) -> list[dict[str, Any]]:
        self.inside += 1
        self.most_inside = max(self.most_inside, self.inside)
        self.entered.set()
        self.release.wait(10)
        self.inside -= 1
        self.asked.append(brokers)
        self.replicas.append(topic_partitions)
        if self.fail:
            raise self.error
        return _ANSWER


class _Kafka(KafkaPythonAdmin):
    def __init__(self, admin: _Admin) -> None:
        super().__init__("127.0.0.1:9092", {})
        self._fake = admin
        self.resets = 0

    def admin(self) -> Any:
        return self._fake

    def reset(self) -> None:
        self.resets += 1


def _api(fail: bool = False) -> tuple[LadderApi, _Admin, _Kafka, threading.Event]:
    release = threading.Event()
    admin = _Admin(fail, release)
    kafka = _Kafka(admin)
    return LadderApi(None, kafka, timeout=1.0), admin, kafka, release


def test_the_next_call_takes_the_early_answer_and_the_one_after_asks_again() -> None:
    api, admin, _kafka, release = _api()
    api.log_dirs_soon(1)
    release.set()
    (first,) = api.log_dirs(1)
    assert admin.asked == [[1]]
    assert first.path == "/data/a" and first.online and first.replicas[0].topic == "orders"
    assert api.log_dirs(1) == [first]
    assert admin.asked == [[1], [1]]
    # The early answer is the dirs' state: a call that wants replicas asks for them.
    api.log_dirs_soon(1)
    api.log_dirs(1, {"orders": [0, 0]})
    assert admin.replicas == [{}, {}, {}, {"orders": [0]}]


def test_the_next_call_raises_the_early_failure_without_asking_again() -> None:
    api, admin, kafka, release = _api(fail=True)
    api.log_dirs_soon(1)
    release.set()
    with pytest.raises(LadderCallFailed, match="DescribeLogDirs: ConnectionError: refused"):
        api.log_dirs(1)
    assert admin.asked == [[1]] and kafka.resets == 1


def test_another_broker_is_asked_and_an_answer_never_taken_is_not_waited_for() -> None:
    api, _admin, kafka, release = _api()
    api.log_dirs_soon(1)
    api.close()  # the thread still waits on the broker: close does not
    assert kafka.resets == 0
    release.set()
    api2, admin2, _kafka2, release2 = _api()
    api2.log_dirs_soon(1)
    release2.set()
    assert api2.log_dirs(2) == []  # asked of broker 2 itself: the answer names broker 1 only
    assert [2] in admin2.asked


def test_a_call_waits_for_the_early_one_still_asking() -> None:
    """kafka-python's client is not thread-safe: a call that wants replicas (which the early
    answer does not hold) waits until the early call is done, then asks on its own."""
    api, admin, _kafka, release = _api()
    api.log_dirs_soon(1)
    assert admin.entered.wait(10)
    admin.entered.clear()
    later = threading.Thread(target=api.log_dirs, args=(1, {"orders": [0]}))
    later.start()
    assert not admin.entered.wait(0.5)  # not let in beside the early call
    release.set()
    later.join(10)
    assert admin.most_inside == 1
    assert admin.replicas == [{}, {"orders": [0]}]


#: What kafka-python raises for a request the broker took and never answered.
_TIMED_OUT = RequestTimedOutError("Request timed out after 300 ms")


def test_a_bootstrap_that_failed_is_not_taken_for_a_hung_broker() -> None:
    """kafka-python that cannot bootstrap within the timeout (the address, its security
    settings) says nothing of the cycle's other client: its calls are still made."""
    release = threading.Event()
    admin = _Admin(fail=True, release=release, error=KafkaTimeoutError("Unable to bootstrap"))
    patience = OneTimeout(0.3)
    api = LadderApi(None, _Kafka(admin), timeout=0.3, patience=patience)
    with patience.cycle():
        threading.Timer(0.35, release.set).start()
        with pytest.raises(LadderCallFailed, match="Unable to bootstrap"):
            api.log_dirs(1)
        patience.check()  # not marked: the next call is made
        with pytest.raises(LadderCallFailed, match="Unable to bootstrap"):
            api.log_dirs(1)
    assert admin.asked == [[1], [1]]


def test_within_a_cycle_a_log_dirs_call_that_hung_is_waited_out_once() -> None:
    """The ladder's calls go through another client (kafka-python) but share the retention
    cycle's one timeout: once one of them, or one of the ``BrokerClient``'s, got no answer
    within it, the rest of the cycle's calls fail at once with that reason; the next cycle
    asks again."""
    release = threading.Event()
    admin = _Admin(fail=True, release=release, error=_TIMED_OUT)
    patience = OneTimeout(0.3)
    api = LadderApi(None, _Kafka(admin), timeout=0.3, patience=patience)
    with patience.cycle():
        threading.Timer(0.35, release.set).start()  # kafka-python's request timing out
        with pytest.raises(LadderCallFailed, match="timed out"):
            api.log_dirs(1)
        with pytest.raises(LadderCallFailed, match=r"did not answer within 0\.3 s earlier"):
            api.log_dirs(1)
        with pytest.raises(LadderCallFailed, match=r"did not answer within 0\.3 s earlier"):
            api.cordon(1, ["/data/a"], add=True)  # a config call: not made either
    assert admin.asked == [[1]]
    # The next cycle asks again (released now, the fake fails at once).
    with patience.cycle(), pytest.raises(LadderCallFailed, match="timed out"):
        api.log_dirs(1)
    assert admin.asked == [[1], [1]]


def test_an_early_log_dirs_answer_that_waited_out_the_timeout_counts_for_the_cycle() -> None:
    """Asked on a thread before the cycle (a one-shot plan), the answer that fails after the
    whole timeout since it was asked ends the cycle's patience too; and once the cycle's
    patience is over, the early answer is not waited for."""
    release = threading.Event()
    admin = _Admin(fail=True, release=release, error=_TIMED_OUT)
    patience = OneTimeout(0.3)
    api = LadderApi(None, _Kafka(admin), timeout=0.3, patience=patience)
    api.log_dirs_soon(1)
    with patience.cycle():
        threading.Timer(0.35, release.set).start()
        with pytest.raises(LadderCallFailed, match="timed out"):
            api.log_dirs(1)
        with pytest.raises(LadderCallFailed, match="earlier in this cycle"):
            api.log_dirs(1)
    stuck = threading.Event()
    admin2 = _Admin(fail=False, release=stuck)
    api2 = LadderApi(None, _Kafka(admin2), 0.3, patience)
    api2.log_dirs_soon(1)
    assert admin2.entered.wait(10)
    with patience.cycle():
        patience.waited_out(time.monotonic() - 1.0, "timed out")  # another call hung
        with pytest.raises(LadderCallFailed, match="earlier in this cycle"):
            api2.log_dirs(1)
        assert admin2.inside == 1  # raised while the early call still waits: not joined
    stuck.set()
