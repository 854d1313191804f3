"""The reconciler: drives the configured actuators to the daemon's view, crash-safely (edge).

``apply`` acts on a transition at once (the hook fires, the wish changes); ``reconcile`` sets
the wish to the daemon's whole view every cycle; a worker thread converges the broker to it
through each actuator's ``converge``, retrying failed passes with a growing delay. What is
applied is recorded in the ``Ledger`` (``actuators.json``) before it is applied, so a
restarted daemon undoes what a killed one left behind. See ``flow.actuator`` for the three.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from diskguard.config import Config
from diskguard.flow.actuator import STATE_FILE, Actuator, Ledger
from diskguard.flow.hook import HookActuator
from diskguard.flow.kafkaacl import AclActuator, AclAdmin, ProcessAclAdmin, default_allow
from diskguard.flow.kafkaquota import (
    KafkaAdminConnection,
    QuotaActuator,
    QuotaAdmin,
    quota_entities,
)
from diskguard.flow.sharedholds import GuardIdentity, Needs, Registry, SharedHolds, quota_needs
from diskguard.flow.state import Transition
from diskguard.kafkalog.serverprops import local_broker_id

__all__ = ["Actuators", "configured_actuators"]


def configured_actuators(
    cfg: Config,
    ledger: Ledger,
    *,
    quota_admin: QuotaAdmin | None = None,
    acl_admin: AclAdmin | None = None,
    broker_timeout_s: float = 10.0,
    publish: Callable[[], bool] = lambda: True,
    acl_permissive: bool | None = None,
    said_before: bool = False,
) -> list[Actuator]:
    """The actuators ``flow_control.actuators`` names, plus any an earlier run left work for.

    A throttle or ACL recorded by an earlier run must be undone even if its actuator has
    since been removed from the config: it is built for that too, only to undo. Order
    matters only for logs: quota before acl, as always. ``quota_admin`` / ``acl_admin``
    replace the Kafka clients (tests). ``said_before``: see ``Actuators``.
    """
    flow = cfg.flow_control
    kinds = set(flow.actuators)
    applied = ledger.applied
    out: list[Actuator] = []
    if "exec" in kinds and flow.on_change:
        out.append(HookActuator(flow.on_change, flow.on_change_timeout, ledger))
    if quota_admin is not None or "quota" in kinds or applied.throttled:
        connection: KafkaAdminConnection | None = None
        if quota_admin is None:
            connection = KafkaAdminConnection(cfg.broker, broker_timeout_s)
            quota_admin = connection.quota_admin()
        out.append(
            QuotaActuator(
                flow.quota,
                quota_admin,
                ledger,
                configured="quota" in kinds,
                connection=connection,
                publish=publish,
                said_before=said_before,
            )
        )
    if acl_admin is None and ("acl" in kinds or applied.acl or applied.acl_owned):
        acl_admin = ProcessAclAdmin(cfg.broker, broker_timeout_s)
    if acl_admin is not None:
        out.append(
            AclActuator(
                flow.acl_principal,
                acl_admin,
                ledger,
                configured="acl" in kinds,
                permissive=acl_permissive,
                publish=publish,
                said_before=said_before,
            )
        )
    return out


def never_held(topic: str, cfg: Config) -> bool:
    """Topics no hold ever applies to: the broker's own (``__*``, written by the broker
    itself, not by producers; diskguard's holds topic among them) and the snapshot topic
    (diskguard's own writes: the spool keeps them anyway, but a guard should not block
    its own report of the overfull disk)."""
    return topic.startswith("__") or topic == cfg.snapshots.topic


class Actuators:
    """Logs flow-control transitions and drives the configured actuators.

    Call ``apply(transition, topics)`` for every transition ``flow.state.step`` returns and
    ``reconcile(overfull_by_mount, topics_by_mount)`` once per cycle with every filesystem's
    current state: ``apply`` fires the hook and updates the wish at once; ``reconcile`` is
    what makes a restarted daemon (or a changed topic list) converge. Neither blocks nor
    raises. A failed broker call is retried by the worker every ``retry_interval_s`` until
    it succeeds (and on every ``apply``/``reconcile``). ``background=False`` runs broker calls
    in the caller's thread (CLI, tests) and retries only on the next call.

    A daemon that starts with holds in its ledger (restarted on a disk still overfull) says
    them again (``acl_applied``, ``quota_applied``) once its first pass finds them in place,
    whoever put them there: another guard may have re-created them before this one got to.
    ``said_before``: this process said them already (rebuilt at a config reload).
    """

    def __init__(
        self,
        cfg: Config,
        state_dir: Path | None = None,
        *,
        on_failure: Callable[[str], None] | None = None,
        quota_admin: QuotaAdmin | None = None,
        acl_admin: AclAdmin | None = None,
        background: bool = True,
        broker_timeout_s: float = 10.0,
        retry_interval_s: float = 10.0,
        registry: Registry | None = None,
        acl_permissive: bool | None = None,
        on_lease_expired: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
        said_before: bool = False,
    ) -> None:
        self._cfg = cfg
        self._ledger = Ledger((state_dir or cfg.daemon.state_dir) / STATE_FILE, on_failure)
        self._applied = self._ledger.applied
        kinds = set(cfg.flow_control.actuators)
        injected = quota_admin is not None or acl_admin is not None
        if (
            registry is None
            and not injected
            and cfg.broker.bootstrap_servers
            and (kinds & {"quota", "acl"} or self._applied.throttled or self._applied.acl_owned)
        ):
            from diskguard.flow.holdsregistry import HoldsRegistry, call_budget

            registry = HoldsRegistry(
                cfg.broker.bootstrap_servers,
                cfg.broker.client,
                cfg.flow_control.holds_topic,
                # Each call bounded by the lease: a pass while the topic's leader changes
                # must end before the next renewal is due.
                call_budget(cfg.flow_control.hold_lease, broker_timeout_s),
            )
        broker_id = local_broker_id(cfg.broker.log_dirs)
        from diskguard.flow.holdsregistry import guard_key

        self._shared = SharedHolds(
            self._ledger,
            GuardIdentity(
                guard_key(broker_id, cfg.snapshots.host),
                broker_id,
                cfg.snapshots.host,
                cfg.flow_control.hold_lease,
            ),
            self._needs,
            registry,
            on_expired=on_lease_expired,
            clock=clock,
        )
        if acl_permissive is None and acl_admin is None:
            acl_permissive = default_allow(cfg.broker)
        self._actuators = configured_actuators(
            cfg,
            self._ledger,
            quota_admin=quota_admin,
            acl_admin=acl_admin,
            broker_timeout_s=broker_timeout_s,
            publish=self._shared.publish,
            acl_permissive=acl_permissive,
            said_before=said_before,
        )
        self._lock = self._ledger.lock  # guards the record and the desired state
        self._sync_lock = threading.Lock()  # one converge pass at a time
        #: Bumped on every change of the desired state; a pass only counts as converged if
        #: nothing changed while it ran.
        self._generation = 0
        self._converged_generation = -1
        self._background = background
        self._retry_interval = retry_interval_s
        self._failed_passes = 0
        self._wake = threading.Condition()
        self._pending = False
        self._running = False
        self._closed = False
        self._worker: threading.Thread | None = None
        #: A shared registry is read (and this guard's lease renewed) this often.
        self._renew_s = max(0.5, cfg.flow_control.hold_lease / 3)
        self._next_renewal = time.monotonic() + self._renew_s
        self._retry_at = 0.0
        if background:
            self._worker = threading.Thread(
                target=self._work, name="diskguard-actuators", daemon=True
            )
            self._worker.start()

    # ----------------------------------------------------------------- public surface

    def apply(self, transition: Transition, topics: Iterable[str] = ()) -> tuple[str, ...]:
        """Act on one transition; ``topics`` = topics with partitions on its mount.

        Returns the actuators engaged for it (sorted; empty for a ``disk_alert`` or when none
        is configured), so the daemon names what holds producers back instead of claiming it
        (their outcome follows: ``hook_finished``, ``quota_applied``, ``acl_applied`` or
        ``actuator_failed``). The daemon logs the transition itself; this only acts.
        """
        engaged: list[str] = []
        try:
            if transition.event not in ("overfull", "overfull_cleared"):
                return ()
            for actuator in self._actuators:
                if actuator.on_transition(transition):
                    engaged.append(actuator.name)
            with self._lock:
                if transition.event == "overfull":
                    wanted = sorted(set(topics))
                    # No topic list (no scan yet) must not drop ACLs recorded before a restart.
                    if wanted or transition.mount not in self._applied.overfull:
                        self._applied.overfull[transition.mount] = wanted
                else:
                    self._applied.overfull.pop(transition.mount, None)
                self._generation += 1
            self._request_sync()
        except Exception as exc:  # never into the loop
            self._ledger.failed("actuators", transition.event, repr(exc))
        return tuple(sorted(engaged))

    def reconcile(
        self,
        overfull_by_mount: Mapping[str, bool | None],
        topics_by_mount: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """Make the desired state exactly the daemon's current view, then converge.

        Mounts absent from ``overfull_by_mount`` are no longer watched and count as clear;
        ``None`` (not observed yet) keeps what was recorded before. Cheap when nothing
        changed and the last pass succeeded, so call it every cycle: that is the retry.
        """
        try:
            topics_by_mount = topics_by_mount or {}
            with self._lock:
                desired: dict[str, list[str]] = {}
                for mount, overfull in overfull_by_mount.items():
                    if overfull is None:
                        if mount in self._applied.overfull:
                            desired[mount] = self._applied.overfull[mount]
                    elif overfull:
                        known = topics_by_mount.get(mount)
                        desired[mount] = sorted(
                            set(known)
                            if known is not None
                            else self._applied.overfull.get(mount, [])
                        )
                if desired != self._applied.overfull:
                    self._applied.overfull = desired
                    self._generation += 1
                needed = self._converged_generation != self._generation
            if needed:
                self._request_sync()
        except Exception as exc:  # never into the loop
            self._ledger.failed("actuators", "reconcile", repr(exc))

    def sync(self, renewal: bool = False) -> bool:
        """One converge pass in the caller's thread; True when the broker matches the wish.

        ``renewal``: the periodic pass that renews this guard's lease; while anything is
        held in the cluster it also checks the broker again (another guard may have lifted
        what this one still needs)."""
        with self._sync_lock:
            with self._lock:
                generation = self._generation
                confirmed = self._converged_generation == generation
            holds = self._shared.refresh()
            active = bool(holds.acl_needs() or holds.quota_needs() or not holds.own.empty)
            if self._shared.changed or (renewal and active) or not self._shared.complete:
                confirmed = False
            ok = True
            for actuator in self._actuators:
                ok = actuator.converge(confirmed, holds) and ok
            ok = self._shared.publish() and ok and self._shared.complete
            with self._lock:
                self._failed_passes = 0 if ok else self._failed_passes + 1
                # A pass that did not converge leaves the next one unconfirmed: it reads the
                # broker again rather than trusting an earlier pass's result.
                self._converged_generation = generation if ok else -1
                return ok and generation == self._generation

    def _needs(self) -> Needs:
        """What this guard needs held now, from its overfull mounts and the config."""
        flow = self._cfg.flow_control
        kinds = set(flow.actuators)
        with self._lock:
            topics = {t for ts in self._applied.overfull.values() for t in ts}
            overfull = bool(self._applied.overfull)
        acl = (
            frozenset((t, flow.acl_principal) for t in topics if not never_held(t, self._cfg))
            if "acl" in kinds
            else frozenset()
        )
        quota = (
            quota_needs(quota_entities(flow.quota), float(flow.quota.producer_byte_rate))
            if "quota" in kinds and overfull
            else {}
        )
        return acl, quota

    def recorded_overfull_mounts(self) -> set[str]:
        """Mounts the last run recorded as overfull (from ``actuators.json`` at start-up).

        A daemon may seed ``FlowState(overfull=True)`` for these, so a restart while the
        disk sits *between* the limits continues the episode instead of releasing producers.
        """
        with self._lock:
            return set(self._applied.overfull)

    def failure_counts(self) -> dict[str, int]:
        """Failures per actuator since start (for the metrics endpoint)."""
        return self._ledger.failure_counts()

    def applied(self) -> dict[str, Any]:
        """What is applied now, in the persisted JSON shape (for status output)."""
        with self._lock:
            return self._applied.to_json()

    @property
    def converged(self) -> bool:
        """The broker matches the desired state as of the last successful pass."""
        with self._lock:
            return self._converged_generation == self._generation

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait for queued broker work and hooks to finish (tests, shutdown)."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            while self._pending or self._running:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(left)
        return all(a.wait_idle(max(0.0, deadline - time.monotonic())) for a in self._actuators)

    def close(self, timeout_s: float = 5.0, stopping: bool = False) -> None:
        """Stop the workers; an in-flight broker call gets ``timeout_s`` to finish.
        ``stopping``: the daemon exits, so a hook still running is ended with its process
        group (it would otherwise outlive the daemon, children and all); at a config reload
        it is left to finish."""
        deadline = time.monotonic() + timeout_s
        with self._wake:
            self._closed = True
            self._wake.notify_all()
        if self._worker is not None and self._worker is not threading.current_thread():
            self._worker.join(timeout_s)
        for actuator in self._actuators:
            actuator.close()
            if stopping and isinstance(actuator, HookActuator):
                actuator.terminate(max(0.0, deadline - time.monotonic()))
        if self._shared.registry is not None:
            self._shared.registry.close()

    # ----------------------------------------------------------------- internals

    def _request_sync(self) -> None:
        if not self._background:
            self.sync()
            return
        with self._wake:
            self._pending = True
            self._wake.notify_all()

    def _work(self) -> None:
        while True:
            renewal = False
            with self._wake:
                while not self._pending and not self._closed:
                    # Wake for a retry of a failed pass, and (with a registry) to renew.
                    due = [] if self.converged else [self._retry_at]
                    if self._shared.registry is not None:
                        due.append(self._next_renewal)
                    if not due:
                        self._wake.wait()
                        continue
                    now = time.monotonic()
                    if min(due) > now:
                        self._wake.wait(min(due) - now)
                        continue
                    renewal = self._shared.registry is not None and self._next_renewal <= now
                    break
                if self._closed:
                    return
                self._pending = False
                self._running = True
            if renewal:
                self._next_renewal = time.monotonic() + self._renew_s
            try:
                self.sync(renewal=renewal)
            except Exception as exc:  # the worker must survive anything
                self._ledger.failed("actuators", "sync", repr(exc))
            finally:
                with self._wake:
                    self._running = False
                    self._retry_at = time.monotonic() + self._retry_delay()
                    self._wake.notify_all()

    def _retry_delay(self) -> float:
        """Doubling after each failed pass, capped at 5 minutes: a broker that is down for
        an hour gets a dozen ``actuator_failed`` lines, not hundreds."""
        with self._lock:
            streak = self._failed_passes
        return min(300.0, self._retry_interval * float(2 ** max(0, min(streak - 1, 10))))
