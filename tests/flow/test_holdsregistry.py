"""The holds topic's client: how long one call may take (fast, no broker).

A pass reads the topic and writes this guard's record; while the topic's leader changes
every call fails, and a call that spends the broker timeout on each step (the watermark
asked again until a deadline, each ask allowed a whole timeout; then the reads with a
deadline of their own) made one pass take about a minute, with nothing said above debug.
Here librdkafka's clients are fakes that never answer, and time is a fake clock each call
advances by the timeout it was given: what a call costs is counted, not measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
from confluent_kafka import KafkaError, KafkaException

from diskguard.config import parse_config
from diskguard.flow import holdsregistry
from diskguard.flow.actuator import ActuatorError
from diskguard.flow.holdsregistry import HoldsRegistry, call_budget
from diskguard.flow.reconcile import Actuators


@pytest.mark.parametrize(
    ("lease_s", "broker_timeout_s", "budget_s"),
    [
        (60.0, 10.0, 10.0),  # the default lease: the broker timeout, as before
        (30.0, 10.0, 5.0),  # a sixth of the lease
        (600.0, 10.0, 10.0),  # never more than the broker timeout
        (3.0, 10.0, 1.0),  # never less than a second (the shortest lease is 3 s)
        (60.0, 4.0, 4.0),
    ],
)
def test_a_call_gets_a_sixth_of_the_lease_within_the_broker_timeout(
    lease_s: float, broker_timeout_s: float, budget_s: float
) -> None:
    assert call_budget(lease_s, broker_timeout_s) == budget_s


@pytest.mark.parametrize("lease_s", [6.0, 20.0, 30.0, 60.0, 120.0, 3600.0])
def test_a_pass_of_one_read_and_one_write_fits_in_a_renewal_interval(lease_s: float) -> None:
    """A guard renews every lease / 3: a pass that fails both calls is over before the next
    renewal is due, so its holds are renewed (or reported) well inside the lease."""
    assert 2 * call_budget(lease_s) <= lease_s / 3


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _silent(clock: FakeClock) -> Any:
    """A call that waits its whole timeout and then fails, as during a leader change."""

    def wait(*_args: Any, timeout: float = -1, request_timeout: float = -1, **_kw: Any) -> Any:
        clock.sleep(max(timeout, request_timeout, 0.0))
        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, "leader changing"))

    return wait


class Admin:
    """The metadata answers at once: the topic exists (its leader then does not answer), or
    it is created and never gets a leader."""

    def __init__(self, topic: str, exists: bool) -> None:
        self._topics = {topic: type("Topic", (), {"error": None, "partitions": {}})()}
        self._exists = exists

    def list_topics(self, *_args: Any, **_kw: Any) -> Any:
        return type("Meta", (), {"topics": self._topics if self._exists else {}, "brokers": {1: 1}})

    def create_topics(self, topics: list[Any], **_kw: Any) -> dict[str, Any]:
        done = type("Done", (), {"result": lambda self, timeout=None: None})()
        return {t.topic: done for t in topics}


class SilentConsumer:
    def __init__(self, clock: FakeClock) -> None:
        self.get_watermark_offsets = _silent(clock)
        self._clock = clock

    def assign(self, _partitions: Any) -> None: ...

    def resume(self, _partitions: Any) -> None: ...

    def pause(self, _partitions: Any) -> None: ...

    def close(self) -> None: ...

    def poll(self, timeout: float) -> None:
        self._clock.sleep(timeout)


class SilentProducer:
    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def produce(self, *_args: Any, **_kw: Any) -> None: ...

    def flush(self, timeout: float = -1) -> int:
        self._clock.sleep(timeout)
        return 1


@pytest.mark.parametrize("exists", [True, False], ids=["leader-silent", "created-no-leader"])
@pytest.mark.parametrize(
    ("call", "error", "slack"),
    [
        # A read: the budget, plus at most one short pause between asks.
        ("read", "holds topic __diskguard_holds", 0.5),
        # A write: and a second for the delivery report of a message that timed out in it.
        ("remove", "not acknowledged", 1.5),
    ],
)
def test_a_call_that_gets_no_answer_ends_within_its_budget(
    monkeypatch: pytest.MonkeyPatch, exists: bool, call: str, error: str, slack: float
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(holdsregistry, "time", clock)
    admin = Admin("__diskguard_holds", exists)
    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", lambda *_a, **_k: admin)
    monkeypatch.setattr(confluent_kafka, "Consumer", lambda *_a, **_k: SilentConsumer(clock))
    monkeypatch.setattr(confluent_kafka, "Producer", lambda *_a, **_k: SilentProducer(clock))
    registry = HoldsRegistry("127.0.0.1:9", {}, timeout_s=5.0)
    start = clock.now
    with pytest.raises(ActuatorError, match=error):
        registry.read() if call == "read" else registry.remove("broker-1")
    assert clock.now - start <= 5.0 + slack, clock.now - start


def test_the_daemon_bounds_its_registry_calls_by_its_lease(tmp_path: Path) -> None:
    logs = tmp_path / "kafka-logs"
    logs.mkdir()
    cfg = parse_config(
        {
            "broker": {"log_dirs": [str(logs)], "bootstrap_servers": "127.0.0.1:9"},
            "flow_control": {
                "overfull_percent": 90,
                "underfull_percent": 80,
                "actuators": ["acl"],
                "hold_lease": "30s",
            },
            "daemon": {"state_dir": str(tmp_path / "state")},
        },
        tmp_path / "diskguard.toml",
    )
    acts = Actuators(cfg, background=False)
    try:
        registry = acts._shared.registry  # what the daemon built from its config
        assert isinstance(registry, HoldsRegistry)
        assert registry.timeout_s == call_budget(30.0) == 5.0
    finally:
        acts.close()
