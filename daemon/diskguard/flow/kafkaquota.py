"""The ``quota`` actuator: a Kafka client quota (``producer_byte_rate``) while overfull (edge).

Through kafka-python (``broker.kafkapython``): confluent-kafka, which every other Kafka call
goes through, has no client-quota API (DescribeClientQuotas / AlterClientQuotas, KIP-546).
Brokers before Kafka 2.6 have no client-quota API either: ``quota`` then logs one
``actuator_failed`` per overfull episode naming the missing API and does not retry it.
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
from diskguard.config import BrokerConfig, QuotaConfig
from diskguard.flow.actuator import ActuatorError, Ledger, actuator_log
from diskguard.flow.holds import ClusterHolds, QuotaEntity, entity_key, settled_claim
from diskguard.flow.state import Transition

__all__ = [
    "ClientOptions",
    "KafkaAdminConnection",
    "KafkaQuotaAdmin",
    "QuotaActuator",
    "QuotaAdmin",
    "kafka_python_options",
    "quota_entities",
]

PRODUCER_BYTE_RATE: Final = "producer_byte_rate"


def quota_entities(cfg: QuotaConfig) -> list[QuotaEntity]:
    """Configured entities, or the default user and the default client id when none are."""
    if not cfg.entities:
        return [(("user", None),), (("client-id", None),)]
    return [tuple(sorted(entity.items())) for entity in cfg.entities]


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


def _missing_quota_api(exc: BaseException) -> str | None:
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


class QuotaActuator:
    """``quota``: throttles producers while any filesystem is overfull, restores after.

    ``configured`` False = present only to restore a throttle an earlier run recorded (the
    actuator was since removed from the config). ``said_before`` False: a throttle the
    ledger records was never said by this process (a restart); its first pass re-sends it
    and says so (``quota_applied``).
    """

    name = "quota"

    def __init__(
        self,
        cfg: QuotaConfig,
        admin: QuotaAdmin,
        ledger: Ledger,
        *,
        configured: bool,
        connection: KafkaAdminConnection | None = None,
        publish: Callable[[], bool] = lambda: True,
        said_before: bool = False,
    ) -> None:
        self._publish = publish
        self._cfg = cfg
        self._admin = admin
        self._ledger = ledger
        self._configured = configured
        self._connection = connection
        if connection is not None:
            ledger.on_broker_failure(connection.reset)
        #: The broker has no client-quota API (Kafka < 2.6): said once per overfull episode.
        self._unsupported = False
        #: A throttle recorded as applied has been said by this process (see ``converge``).
        self._said = said_before

    def on_transition(self, transition: Transition) -> bool:
        if transition.event == "overfull":
            self._unsupported = False  # a new episode: try (and say) again
        return self._configured

    def wait_idle(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        if self._connection is not None:
            self._connection.reset()

    def _settle(
        self, owned: dict[str, tuple[QuotaEntity, float | None]], holds: ClusterHolds
    ) -> dict[str, tuple[QuotaEntity, float | None]]:
        """This guard's claims, each checked against the other guards' (``settled_claim``): a
        claim that was another guard's throttle is replaced, in the ledger and the record."""
        settled = dict(owned)
        for key, claim in owned.items():
            throttles = holds.throttle_rates(key) | {float(self._cfg.producer_byte_rate)}
            for other in holds.others.values():
                theirs = other.quota_owned.get(key)
                if theirs is not None:
                    settled[key] = settled_claim(settled[key], theirs, throttles)
            if settled[key] != claim:
                self._settled(key, claim[1], settled[key][1])
        if settled != owned:
            with self._ledger.lock:
                self._ledger.applied.quota_previous.update(settled)
            self._ledger.save()
            self._publish()
        return settled

    def _recheck(
        self, key: str, entity: QuotaEntity, claimed: float | None, holds: ClusterHolds
    ) -> float | None:
        """A claim that equals a throttle rate may be another guard's throttle read as the
        value before it (``settled_claim``), kept in the ledger of a guard killed after the
        race while the survivor restored the real value. Before throttling on it again the
        quota is described: a value there now that is no throttle is what the operator has
        (restored, or set since), and it replaces the claim."""
        throttles = holds.throttle_rates(key) | {float(self._cfg.producer_byte_rate)}
        if claimed not in throttles:
            return claimed
        now = self._admin.describe_producer_byte_rate(entity)
        if now in throttles:
            return claimed
        self._settled(key, claimed, now)
        with self._ledger.lock:
            self._ledger.applied.quota_previous[key] = (entity, now)
        self._ledger.save()
        self._publish()
        return now

    @staticmethod
    def _settled(key: str, claimed: float | None, previous: float | None) -> None:
        actuator_log().warning(
            "quota_claim_settled",
            actuator="quota",
            entity=key,
            claimed=claimed,
            previous=previous,
            message="this guard had taken another guard's throttle for the value before it; "
            "what the operator had is restored instead",
        )

    def converge(self, confirmed: bool, holds: ClusterHolds) -> bool:
        """Throttle while any live guard needs it, restore what this guard owns when none does.

        The value restored is the one found before the *first* guard's throttle (a guard
        that finds a throttle already in place takes the value that guard recorded, not
        the throttle). Unconfirmed (after a restart or a failure) the throttle is re-sent:
        AlterClientQuotas is idempotent, and a write-ahead record may stand for a call that
        never reached the broker.
        """
        ledger, applied = self._ledger, self._ledger.applied
        needs = holds.quota_needs()
        mine = {k: v for k, v in needs.items() if k in holds.own.quota_needs}
        claims = holds.quota_owned()
        with ledger.lock:
            had = applied.quota_applied
            owned = dict(applied.quota_previous)
        owned = self._settle(owned, holds)
        if not mine and not owned and not had:
            return True
        if confirmed:
            return True
        if mine and not had and self._unsupported:
            return True  # already said this episode; retrying cannot help
        admin = self._admin
        waiting = False
        try:
            for key, (entity, rate) in sorted(mine.items()):
                claim = owned.get(key) or claims.get(key)
                if claim is None and not holds.complete:
                    # The value there now may be another guard's throttle, which only its
                    # record says: taken for "before", it would be restored for good.
                    waiting = True
                    continue
                previous = admin.describe_producer_byte_rate(entity) if claim is None else claim[1]
                if claim is not None and key in owned:
                    previous = self._recheck(key, entity, previous, holds)
                if key not in owned:
                    with ledger.lock:
                        applied.quota_previous[key] = (entity, previous)
                    # Saved and published before the alter: the restore value must survive
                    # a crash, and another guard must not take our throttle for the value.
                    ledger.save()
                    self._publish()
                # Never loosen a quota that was already stricter than ours.
                value = rate if previous is None else min(rate, previous)
                admin.alter_producer_byte_rate(entity, value)
                if not had or not self._said:
                    actuator_log().info(
                        "quota_applied",
                        actuator="quota",
                        entity=key,
                        producer_byte_rate=value,
                        previous=previous,
                    )
            if waiting:
                ledger.failed(
                    "quota",
                    "throttle",
                    "the holds topic could not be read: the value before the throttle is "
                    "unknown; throttling when it answers",
                )
                return False
            with ledger.lock:
                applied.quota_applied = bool(mine)
            ledger.save()
            self._said = True
            if had and not mine and needs:
                actuator_log().info(
                    "hold_kept",
                    actuator="quota",
                    entities=sorted(needs),
                    held_by=holds.quota_needed_by(),
                    message="this guard no longer needs the throttle; another guard still does",
                )
            if not holds.complete:
                return not owned.keys() - needs.keys()
            for key, (entity, previous) in sorted(owned.items()):
                if key in needs:
                    continue
                admin.alter_producer_byte_rate(entity, previous)
                actuator_log().info(
                    "quota_restored", actuator="quota", entity=key, producer_byte_rate=previous
                )
                with ledger.lock:
                    applied.quota_previous.pop(key, None)
                ledger.save()
                self._publish()
            return True
        except Exception as exc:  # logged, counted, retried next cycle
            missing = _missing_quota_api(exc)
            with ledger.lock:
                recorded = applied.throttled
            if missing is not None and mine and not recorded:
                # Nothing was applied, nothing to restore, and no retry will make the broker
                # grow the API: one line, one count, and the daemon goes on.
                self._unsupported = True
                ledger.failed("quota", "throttle", missing)
                return True
            ledger.broker_failed("quota", "throttle" if mine else "restore", exc)
            return False
