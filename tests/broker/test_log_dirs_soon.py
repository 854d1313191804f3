"""``LadderApi.log_dirs_soon``: a one-shot plan asks DescribeLogDirs on a thread while it scans
(kafka-python's import and connection included). The next ``log_dirs`` of that broker takes
the answer, or raises the failure, without asking again; the one after asks the broker as
always; a broker that was never asked for is not waited for at ``close``."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from diskguard.broker.kafkapython import KafkaPythonAdmin
from diskguard.broker.ladderapi import LadderApi, LadderCallFailed

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
    def __init__(self, fail: bool, release: threading.Event) -> None:
        self.asked: list[list[int]] = []
        self.replicas: list[dict[str, list[int]]] = []
        self.fail = fail
        self.release = release

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
            raise ConnectionError("refused")
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
