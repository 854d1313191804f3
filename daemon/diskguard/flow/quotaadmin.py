"""The ``quota`` actuator's broker calls: DescribeClientQuotas / AlterClientQuotas (edge).

Through kafka-python (``broker.kafkapython``): confluent-kafka, which every other Kafka call
goes through, has no client-quota API (KIP-546). A change counts as made once a describe
shows it (``KafkaQuotaAdmin``); a broker without the API (Kafka < 2.6) is recognised here
(``missing_quota_api``). The actuator itself: ``flow.kafkaquota``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final, Protocol

from diskguard.broker.kafkapython import (
    ClientOptions,
    KafkaPythonAdmin,
    KafkaPythonUnavailable,
    client_options,
)
from diskguard.config import BrokerConfig
from diskguard.flow.actuator import ActuatorError
from diskguard.flow.holds import QuotaEntity, entity_key

__all__ = [
    "PRODUCER_BYTE_RATE",
    "ClientOptions",
    "KafkaAdminConnection",
    "KafkaQuotaAdmin",
    "QuotaAdmin",
    "kafka_python_options",
    "missing_quota_api",
]

PRODUCER_BYTE_RATE: Final = "producer_byte_rate"


class QuotaAdmin(Protocol):
    """The two quota calls the ``quota`` actuator needs (injectable for tests)."""

    def describe_producer_byte_rate(self, entity: QuotaEntity) -> float | None:
        """The entity's own ``producer_byte_rate`` (None = not set)."""
        ...

    def alter_producer_byte_rate(self, entity: QuotaEntity, value: float | None) -> None:
        """Set the entity's ``producer_byte_rate``; None removes it."""
        ...


def _kafka_error(code: int, message: str | None, what: str) -> ActuatorError:
    import kafka.errors as kafka_errors

    name = kafka_errors.for_code(code).__name__
    detail = f": {message}" if message else ""
    return ActuatorError(f"{what} failed: {name} (error code {code}){detail}")


class KafkaQuotaAdmin:
    """DescribeClientQuotas / AlterClientQuotas built and parsed with kafka-python's messages.

    ``send`` takes a kafka-python request object and returns its response object; the real
    one goes over ``KafkaAdminConnection``, tests pass a fake broker.

    An alter is done only once a describe shows it (within ``visible_within_s``): a KRaft
    broker answers DescribeClientQuotas from its metadata image, which learns an accepted
    AlterClientQuotas from the controller a moment later (measured on 4.4: a describe right
    after the alter still gave the old value). Were a restore not yet visible, the next
    episode's describe could take diskguard's own throttle for the value to restore, and
    leave it in place for good. ZooKeeper-mode brokers show it at once.
    """

    def __init__(
        self, send: Callable[[Any], Any], visible_within_s: float = 5.0, poll_s: float = 0.05
    ) -> None:
        self._send = send
        self._visible_within_s = visible_within_s
        self._poll_s = poll_s

    def describe_producer_byte_rate(self, entity: QuotaEntity) -> float | None:
        from kafka.protocol.admin import DescribeClientQuotasRequest as Describe

        components = [
            Describe.ComponentData(
                entity_type=kind, match_type=1 if name is None else 0, match=name
            )
            for kind, name in entity
        ]
        response = self._send(Describe(components=components, strict=True))
        if response.error_code:
            raise _kafka_error(response.error_code, response.error_message, "DescribeClientQuotas")
        for entry in response.entries or ():
            found = tuple(sorted((e.entity_type, e.entity_name) for e in entry.entity))
            if found != entity:
                continue
            for value in entry.values:
                if value.key == PRODUCER_BYTE_RATE:
                    return float(value.value)
        return None

    def alter_producer_byte_rate(self, entity: QuotaEntity, value: float | None) -> None:
        from kafka.protocol.admin import AlterClientQuotasRequest as Alter

        op = Alter.EntryData.OpData(
            key=PRODUCER_BYTE_RATE,
            value=0.0 if value is None else float(value),
            remove=value is None,
        )
        request = Alter(
            entries=[
                Alter.EntryData(
                    entity=[
                        Alter.EntryData.EntityData(entity_type=kind, entity_name=name)
                        for kind, name in entity
                    ],
                    ops=[op],
                )
            ],
            validate_only=False,
        )
        response = self._send(request)
        entries = list(response.entries or ())
        if not entries:
            raise ActuatorError("AlterClientQuotas failed: the broker answered with no entries")
        for entry in entries:
            if entry.error_code:
                raise _kafka_error(entry.error_code, entry.error_message, "AlterClientQuotas")
        self._await_visible(entity, None if value is None else float(value))

    def _await_visible(self, entity: QuotaEntity, value: float | None) -> None:
        deadline = time.monotonic() + self._visible_within_s
        while True:
            seen = self.describe_producer_byte_rate(entity)
            if seen == value:
                return
            if time.monotonic() >= deadline:
                raise ActuatorError(
                    f"AlterClientQuotas accepted, but DescribeClientQuotas still gives "
                    f"producer_byte_rate {seen} for {entity_key(entity)} after "
                    f"{self._visible_within_s:g} s (wanted {value})"
                )
            time.sleep(self._poll_s)


# ------------------------------------------------------------------ librdkafka -> kafka-python


def kafka_python_options(broker: BrokerConfig, timeout_ms: int) -> ClientOptions:
    """The broker config for the quota client (``broker.kafkapython``: the one translation)."""
    return client_options(
        broker.bootstrap_servers, broker.client, timeout_ms, "the quota client's two calls"
    )


class KafkaAdminConnection:
    """The quota client's kafka-python connection (``broker.kafkapython.KafkaPythonAdmin``),
    its failures as ``ActuatorError``."""

    def __init__(self, broker: BrokerConfig, timeout_s: float = 10.0) -> None:
        self._admin = KafkaPythonAdmin(
            broker.bootstrap_servers, broker.client, timeout_s, "the quota client's two calls"
        )

    def admin(self) -> Any:
        try:
            return self._admin.admin()
        except KafkaPythonUnavailable as exc:
            raise ActuatorError(str(exc)) from exc

    def send(self, request: Any) -> Any:
        """Send one kafka-python request to the least loaded broker; its response."""
        self.admin()
        return self._admin.send(request)

    def reset(self) -> None:
        """Drop the client (after a failure): the next call reconnects."""
        self._admin.reset()

    def quota_admin(self) -> QuotaAdmin:
        return KafkaQuotaAdmin(self.send)


def missing_quota_api(exc: BaseException) -> str | None:
    """The ``actuator_failed`` text when ``exc`` says the broker lacks the quota API, else None.

    kafka-python raises ``IncompatibleBrokerVersion`` (an ``UnsupportedVersionError``) before
    sending when the broker's ApiVersions answer does not list the request; a broker that
    lists it but rejects our version answers UNSUPPORTED_VERSION (error code 35).
    """
    try:
        from kafka.errors import UnsupportedVersionError
    except ImportError:  # pragma: no cover - kafka-python is a dependency
        return None
    if not isinstance(exc, UnsupportedVersionError) and "UnsupportedVersion" not in str(exc):
        return None
    return (
        "DescribeClientQuotas/AlterClientQuotas not supported by the broker (client quotas "
        "API, Kafka 2.6+, KIP-546): producers are NOT throttled; use the acl or exec actuator "
        f"({type(exc).__name__})"
    )
