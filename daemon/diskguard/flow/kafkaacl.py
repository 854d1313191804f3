"""The ``acl`` actuator: DENY WRITE ACLs on the topics of an overfull filesystem (edge).

On a cluster that lets everyone in where no ACL is found, a topic's first ACL ends that for
the topic: a DENY WRITE alone would also stop its consumers, DescribeConfigs and diskguard's
own DeleteRecords (measured on Kafka 2.2 and 4.4). Such a topic gets an ALLOW ALL for
``User:*`` with the DENY, which keeps every other access as it was; a topic that already had
ACLs only gets the DENY. What the hold adds is removed with it (``flow.holds``). The broker
calls are ``flow.acladmin``'s, each in a child process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from diskguard.config import BrokerConfig
from diskguard.flow.acladmin import AclAdmin, ConfluentAclAdmin, ProcessAclAdmin
from diskguard.flow.actuator import Ledger, ReadBack, actuator_log
from diskguard.flow.holds import AclBinding, ClusterHolds, acl_plan, deny_write
from diskguard.flow.state import Transition
from diskguard.kafkalog.serverprops import read_properties

__all__ = [
    "AclActuator",
    "AclAdmin",
    "ConfluentAclAdmin",
    "ProcessAclAdmin",
    "default_allow",
]


def default_allow(broker: BrokerConfig) -> bool | None:
    """Does the broker let everyone in where no ACL is found? From its ``server.properties``
    (``allow.everyone.if.no.acl.found``, Kafka's default ``false``) when
    ``broker.server_properties`` is set; None (unknown) otherwise. DescribeConfigs cannot
    say: the broker reports the authorizer's own settings as sensitive (no value)."""
    if broker.server_properties is None:
        return None
    try:
        props = read_properties(broker.server_properties)
    except OSError:
        return None
    return props.get("allow.everyone.if.no.acl.found", "false").strip().lower() == "true"


class AclActuator:
    """``acl``: DENY WRITE for every topic with a partition on an overfull filesystem, shared
    with every other guard of the cluster (``flow.holds``).

    ``permissive``: ``default_allow`` — whether a topic without ACLs gets an ALLOW ALL for
    ``User:*`` with its DENY (keeping reads, DescribeConfigs and DeleteRecords as they were).
    ``configured`` False = present only to remove ACLs an earlier run recorded (the actuator
    was since removed from the config). ``said_before`` False: the holds the ledger records
    were never said by this process (a restart), and are said (``acl_applied``) once in place.
    """

    name = "acl"

    def __init__(
        self,
        principal: str,
        admin: AclAdmin,
        ledger: Ledger,
        *,
        configured: bool,
        permissive: bool | None = None,
        publish: Callable[[], bool] = lambda: True,
        said_before: bool = False,
    ) -> None:
        self._principal = principal
        self._admin = admin
        self._ledger = ledger
        self._configured = configured
        self._permissive = permissive
        self._publish = publish
        self._skipped_said: tuple[str, ...] = ()
        #: ACLs this guard owns that the previous read did not list (see ``converge``).
        self._missing: set[AclBinding] = set()
        #: The holds the ledger records have been said by this process (``acl_applied``);
        #: False after a restart, until its first pass that gets that far.
        self._said = said_before
        self._read_back = ReadBack(ledger, "acl")

    def on_transition(self, transition: Transition) -> bool:
        return self._configured

    def wait_idle(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        pass

    def converge(self, confirmed: bool, holds: ClusterHolds) -> bool:
        """Make the cluster's ACLs what every live guard needs; undo what nobody needs.

        Unconfirmed (a restart, a failure, another guard's record changed, a lease renewal
        while something is held) the ACLs are read back and the difference applied: an ACL
        another guard removed while this one still needs it is created again.
        """
        ledger, applied = self._ledger, self._ledger.applied
        needs = holds.acl_needs()
        owned = holds.acl_owned()
        own_needs = set(holds.own.acl_needs)
        with ledger.lock:
            had = set(applied.acl)
        if not needs and not owned and not had:
            return True
        if confirmed and own_needs == had:
            return True
        try:
            present = self._admin.topic_acls()
        except Exception as exc:
            self._read_back.failed("describe", exc, holds, pending=own_needs != had)
            return False
        self._read_back.answered()
        plan = acl_plan(needs, present, owned, self._permissive)
        # Lift nothing while another guard's needs are unknown: it may need exactly that.
        delete = plan.delete if holds.complete else ()
        # A removal this guard asked for that the broker does not show yet, needed again: the
        # same hold, but created again with the rest, after the DeleteAcls the broker
        # accepted (which may still land, and must not lift a hold that is needed).
        with ledger.lock:
            resumed = applied.acl_removing & plan.desired & present
        create = tuple(sorted({*plan.create, *resumed}))
        if plan.create:
            with ledger.lock:
                applied.acl_owned.update(plan.create)
            # Recorded (and published) before the create: an ACL we do not know about is one
            # we never remove, and one another guard does not know is ours it takes for the
            # operator's.
            ledger.save()
            self._publish()
        ok = True
        if delete:
            with ledger.lock:
                applied.acl_removing.update(delete)
            # Recorded before the call: a removal the broker shows only after the call gave
            # up waiting (or after a restart) is still said when a later pass sees it.
            ledger.save()
            try:
                self._admin.delete(delete)
            except Exception as exc:
                ledger.broker_failed("acl", "remove", exc)
                ok = False
            else:
                with ledger.lock:
                    applied.acl_owned.difference_update(delete)
                    applied.acl_removing.difference_update(delete)
                    applied.acl_said.difference_update(_holds(delete))
                self._removed(delete)
        if create:
            try:
                self._admin.create(create)
            except Exception as exc:
                ledger.broker_failed("acl", "deny", exc)
                return False
        with ledger.lock:
            # Ours but gone (another guard lifted it): no longer ours to remove. Only when two
            # reads in a row miss it: a KRaft broker lists an ACL once it replayed it, and one
            # that lags (just restarted, loaded) must not make us forget an ACL we must lift.
            missing = {b for b in applied.acl_owned if b not in present and b not in plan.create}
            gone = missing & self._missing
            applied.acl_owned.difference_update(gone)
            self._missing = missing - self._missing
            # A removal this guard asked for that the broker shows only now (its DeleteAcls
            # gave up waiting for it): gone for two reads, or gone and needed again (created
            # anew this pass). Said once, so the log never claims a hold that was lifted.
            lifted = applied.acl_removing & (gone | set(plan.create))
            applied.acl_removing.difference_update(lifted | resumed)
            applied.acl_said.difference_update(_holds(lifted))
            # Still listed and not needed: read again until the broker shows the removal.
            unseen = applied.acl_removing - plan.desired
            held = {(t, p) for t, p in own_needs if t not in plan.skipped}
            applied.acl = held
            # Said and not said lifted: not said again (unless by a restarted process, whose
            # log starts anew). Kept while needed, listed or ours to remove.
            said = set(applied.acl_said) if self._said else set()
            applied.acl_said = {
                (t, p)
                for t, p in applied.acl_said | held
                if (t, p) in own_needs
                or deny_write(t, p) in present
                or deny_write(t, p) in applied.acl_owned
            }
        ledger.save()
        self._publish()
        if lifted:
            self._removed(sorted(lifted))
        # Newly held, or held again (this pass created its ACLs: e.g. after a restart, once
        # another guard had let them go when this one's lease expired), or held since before
        # this process started and not said yet: a restarted guard says its hold is in place
        # even when another guard's pass re-created the ACLs before its own did.
        self._said = True
        own_topics = {t for t, _p in held}
        newly = sorted(
            {t for t, _p in held - said} | {b.name for b in plan.create if b.name in own_topics}
        )
        if newly:
            actuator_log().info(
                "acl_applied",
                actuator="acl",
                principal=self._principal,
                topics=newly,
                allowed=[t for t in plan.allowed if t in newly],
                created=len(plan.create),
            )
        released = sorted({t for t, _p in had - own_needs})
        kept = {t: holds.needed_by(t) for t in released if holds.needed_by(t)}
        if kept:
            actuator_log().info(
                "hold_kept",
                actuator="acl",
                topics=sorted(kept),
                held_by=sorted({g for guards in kept.values() for g in guards}),
                message="this guard no longer needs the hold; another guard still does",
            )
        skipped = tuple(t for t in plan.skipped if any(t == n for n, _p in own_needs))
        if skipped and skipped != self._skipped_said:
            actuator_log().warning(
                "acl_hold_skipped",
                actuator="acl",
                topics=list(skipped),
                reason="these topics have no ACL, and whether the cluster lets everyone in "
                "where no ACL is found is unknown: a DENY alone would stop their readers and "
                "diskguard's own DeleteRecords, an ALLOW could open them (set "
                "broker.server_properties to the broker's server.properties)",
            )
        self._skipped_said = skipped
        # Missed once, or a removal not seen yet: read again at the next pass.
        return ok and not self._missing and not unseen

    @staticmethod
    def _removed(bindings: Iterable[AclBinding]) -> None:
        denies = [b for b in bindings if b.permission == "DENY"]
        actuator_log().info(
            "acl_removed",
            actuator="acl",
            principal=",".join(sorted({b.principal for b in denies})),
            topics=sorted({b.name for b in bindings}),
        )


def _holds(bindings: Iterable[AclBinding]) -> set[tuple[str, str]]:
    """The (topic, principal) holds whose DENY is among ``bindings``."""
    return {(b.name, b.principal) for b in bindings if b.permission == "DENY"}
