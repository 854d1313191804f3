"""The one translation of ``[broker.client]`` (librdkafka's names, for confluent-kafka) into
kafka-python's keywords, which only the quota actuator's client uses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import diskguard
from diskguard.broker.kafkapython import KafkaPythonAdmin
from diskguard.config import BrokerConfig, parse_config
from diskguard.flow.actuator import ActuatorError
from diskguard.flow.kafkaquota import KafkaAdminConnection, kafka_python_options


def broker(tmp_path: Path, client: dict[str, object]) -> BrokerConfig:
    cfg = parse_config(
        {
            "broker": {
                "log_dirs": [str(tmp_path)],
                "bootstrap_servers": "127.0.0.1:9",
                "client": client,
            }
        },
        tmp_path / "diskguard.toml",
    )
    return cfg.broker


def test_what_is_translated_and_what_is_left_out(tmp_path: Path) -> None:
    client = {
        # translated
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "guard",
        "sasl.password": "secret",
        "ssl.ca.location": "/etc/ca.pem",
        "ssl.certificate.location": "/etc/cert.pem",
        "ssl.key.location": "/etc/key.pem",
        "ssl.key.password": "keypass",
        "client.id": "guard-1",
        # left out: security settings with no translation, and librdkafka tuning
        "sasl.kerberos.service.name": "kafka",
        "ssl.endpoint.identification.algorithm": "none",
        "message.timeout.ms": 60000,
        "socket.keepalive.enable": True,
    }
    options = kafka_python_options(broker(tmp_path, client), 2000)
    assert options.kwargs == {
        "bootstrap_servers": "127.0.0.1:9",
        "client_id": "guard-1",
        "request_timeout_ms": 2000,
        "bootstrap_timeout_ms": 2000,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "guard",
        "sasl_plain_password": "secret",
        "ssl_cafile": "/etc/ca.pem",
        "ssl_certfile": "/etc/cert.pem",
        "ssl_keyfile": "/etc/key.pem",
        "ssl_password": "keypass",
    }
    assert sorted(options.ignored) == [
        "message.timeout.ms",
        "sasl.kerberos.service.name",
        "socket.keepalive.enable",
        "ssl.endpoint.identification.algorithm",
    ]
    assert options.unsent_security_keys() == [
        "sasl.kerberos.service.name",
        "ssl.endpoint.identification.algorithm",
    ]
    assert "connects without it" in options.ignored["sasl.kerberos.service.name"]
    assert "librdkafka tuning" in options.ignored["message.timeout.ms"]


def test_defaults_without_client_settings(tmp_path: Path) -> None:
    options = kafka_python_options(broker(tmp_path, {}), 10000)
    assert options.kwargs["client_id"] == "diskguard"
    assert options.ignored == {}


def test_a_failed_connect_names_the_security_keys_left_out(tmp_path: Path) -> None:
    """Nothing listens on port 9: the failure says what kafka-python did not get."""
    connection = KafkaAdminConnection(
        broker(tmp_path, {"sasl.kerberos.service.name": "kafka"}), timeout_s=0.5
    )
    with pytest.raises(ActuatorError, match=r"\[broker.client\] sasl.kerberos.service.name "):
        connection.admin()


def test_only_the_kafka_python_adapters_import_it() -> None:
    """confluent-kafka is the Kafka client; kafka-python only where it has no API (quotas;
    log dirs and replica moves, the tiered offset: the ladder's broker calls)."""
    package = Path(diskguard.__file__).parent
    importing = re.compile(r"^\s*(import kafka\b|from kafka[. ])", re.MULTILINE)
    found = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if importing.search(path.read_text(encoding="utf-8"))
    )
    assert found == ["broker/kafkapython.py", "broker/ladderapi.py", "flow/quotaadmin.py"]


class _Brokers:
    """kafka-python's connection manager as ``KafkaPythonAdmin.send`` sees it: three brokers,
    ``down`` refuse the connection; kafka-python's own choice is ``first``."""

    def __init__(self, down: set[int], first: int) -> None:
        from types import SimpleNamespace

        self.down, self.first, self.sent_to = down, first, []
        nodes = [SimpleNamespace(node_id=i) for i in (1, 2, 3)]
        self.cluster = SimpleNamespace(brokers=lambda: nodes)

    def run(self, call: object, *args: object) -> object:
        return call(*args)  # type: ignore[operator]

    def least_loaded_node(self) -> int:
        return self.first

    def send(self, request: object, node: int) -> str:
        from kafka.errors import KafkaConnectionError

        self.sent_to.append(node)
        if node in self.down:
            raise KafkaConnectionError("111 ECONNREFUSED")
        return f"answer from {node}"


def _admin_over(manager: _Brokers) -> KafkaPythonAdmin:
    from types import SimpleNamespace

    admin = KafkaPythonAdmin("127.0.0.1:9", {})
    admin._admin = SimpleNamespace(_manager=manager)
    return admin


def test_one_dead_broker_of_three_is_not_the_cluster() -> None:
    """A broker killed or restarting refuses the connection: the request goes to the next
    one the metadata names; only when none answers is that the error."""
    manager = _Brokers(down={3}, first=3)
    assert _admin_over(manager).send("DescribeClientQuotas") == "answer from 1"
    assert manager.sent_to == [3, 1]
    from kafka.errors import KafkaConnectionError

    dead = _Brokers(down={1, 2, 3}, first=2)
    with pytest.raises(KafkaConnectionError):
        _admin_over(dead).send("DescribeClientQuotas")
    assert dead.sent_to == [2, 1, 3]
