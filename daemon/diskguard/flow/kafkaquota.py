"""The ``quota`` actuator: a Kafka client quota (``producer_byte_rate``) while overfull (edge).

The broker calls are ``flow.quotaadmin``'s (kafka-python: confluent-kafka, which every other
Kafka call goes through, has no client-quota API, KIP-546). Brokers before Kafka 2.6 have no
client-quota API either: ``quota`` then logs one ``actuator_failed`` per overfull episode
naming the missing API and does not retry it.
"""

from __future__ import annotations

from collections.abc import Callable

from diskguard.config import QuotaConfig
from diskguard.flow.actuator import Ledger, ReadBack, actuator_log
from diskguard.flow.holds import ClusterHolds, QuotaEntity, settled_claim
from diskguard.flow.quotaadmin import (
    ClientOptions,
    KafkaAdminConnection,
    KafkaQuotaAdmin,
    QuotaAdmin,
    kafka_python_options,
    missing_quota_api,
)
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


def quota_entities(cfg: QuotaConfig) -> list[QuotaEntity]:
    """Configured entities, or the default user and the default client id when none are."""
    if not cfg.entities:
        return [(("user", None),), (("client-id", None),)]
    return [tuple(sorted(entity.items())) for entity in cfg.entities]


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
        self._read_back = ReadBack(ledger, "quota")

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

    def _seen_lifted(
        self,
        mine: dict[str, tuple[QuotaEntity, float]],
        owned: dict[str, tuple[QuotaEntity, float | None]],
        holds: ClusterHolds,
    ) -> None:
        """Throttles this guard said (``quota_applied``) and had begun to let go, needed again
        before a restore was seen: its restore may not have been sent, or not shown yet (the
        broker gave the throttle until after the wait), or shown since. The quota there now
        says which: a throttle still in place is the same hold, said once; one the broker
        no longer gives was lifted, and is said so (``quota_restored``, with the value there
        now, which becomes the value before the new throttle) before it is applied anew."""
        with self._ledger.lock:
            pending = sorted(mine.keys() & self._ledger.applied.quota_said & owned.keys())
        for key in pending:
            (entity, rate), previous = mine[key], owned[key][1]
            ours = rate if previous is None else min(rate, previous)
            throttles = holds.throttle_rates(key) | {float(self._cfg.producer_byte_rate), ours}
            now = self._admin.describe_producer_byte_rate(entity)
            if now in throttles:
                continue
            owned[key] = (entity, now)
            self._restored(key, entity, now, keep=True)

    def _restored(
        self, key: str, entity: QuotaEntity, value: float | None, *, keep: bool = False
    ) -> None:
        """Say a restore the broker shows; the claim goes with it (``keep``: stays, as the
        value before a throttle applied again at once)."""
        actuator_log().info(
            "quota_restored", actuator="quota", entity=key, producer_byte_rate=value
        )
        with self._ledger.lock:
            self._ledger.applied.quota_said.discard(key)
            if keep:
                self._ledger.applied.quota_previous[key] = (entity, value)
            else:
                self._ledger.applied.quota_previous.pop(key, None)
        self._ledger.save()
        self._publish()

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
        try:
            converged = self._pass(mine, needs, owned, had, claims, holds)
        except Exception as exc:  # logged, counted, retried next cycle
            missing = missing_quota_api(exc)
            with ledger.lock:
                recorded = applied.throttled
            if missing is not None and mine and not recorded:
                # Nothing was applied, nothing to restore, and no retry will make the broker
                # grow the API: one line, one count, and the daemon goes on.
                self._unsupported = True
                ledger.failed("quota", "throttle", missing)
                return True
            # The throttle re-sent while this guard's needs are what it applied before, and
            # nothing of its to restore: a read-back of a hold in place.
            pending = not (had and mine) or bool(owned.keys() - needs.keys())
            action = "throttle" if mine else "restore"
            self._read_back.failed(action, exc, holds, pending=pending)
            return False
        self._read_back.answered()
        return converged

    def _pass(
        self,
        mine: dict[str, tuple[QuotaEntity, float]],
        needs: dict[str, tuple[QuotaEntity, float]],
        owned: dict[str, tuple[QuotaEntity, float | None]],
        had: bool,
        claims: dict[str, tuple[QuotaEntity, float | None]],
        holds: ClusterHolds,
    ) -> bool:
        """``converge``'s broker calls; raises what the broker raised."""
        ledger, applied = self._ledger, self._ledger.applied
        admin = self._admin
        waiting = False
        if mine and not had:
            self._seen_lifted(mine, owned, holds)
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
            with ledger.lock:
                known = key in applied.quota_said
                applied.quota_said.add(key)
            # Said once per hold: not again while a release of it was never seen (nor
            # at a re-send), but by a restarted process, whose log starts anew.
            if not known or not self._said:
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
            self._restored(key, entity, previous)
        return True
