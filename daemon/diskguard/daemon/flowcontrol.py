"""Flow control in the daemon: each filesystem's flow state, the actuators and the ballast.

The state machine is ``flow.state`` (pure); this feeds it the usage (or the broker-mode
forecast, when higher), logs each transition (``overfull``, ``overfull_cleared``,
``disk_alert``), applies the actuators and says what really holds producers back
(``flow_control_applied``). It runs on the loop's thread at every usage poll, whatever a
retention cycle beside it is waiting for.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from diskguard.config import Config
from diskguard.flow.ballast import Ballast
from diskguard.flow.limits import flow_limits
from diskguard.flow.reconcile import Actuators
from diskguard.flow.state import ALERT_DEGRADED, FlowState, Transition, step
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger
from diskguard.metrics import Metrics
from diskguard.retention.limits import quiet_margin_bytes

log = get_logger("diskguard.daemon")

#: Broker mode: the usage expected once space asked for now is freed, when higher than today's.
Prediction = Callable[[FilesystemUsage], FilesystemUsage | None]


class FlowControl:
    """Producers held back while a filesystem is overfull, released when it is under.
    Owns the flow states (they outlive a reload); the actuators and the ballast are the
    config's and are rebuilt with it (``build``)."""

    def __init__(self, config: Config, state_dir: Path, metrics: Metrics) -> None:
        self._metrics = metrics
        self.states: dict[str, FlowState] = {}
        self._built = False
        self.build(config, state_dir)

    def build(self, config: Config, state_dir: Path) -> None:
        self._config = config
        self.actuators = Actuators(
            config,
            state_dir,
            on_failure=self._metrics.actuator_failed,
            on_lease_expired=self._metrics.hold_lease_expired,
            # At start-up the ledger's holds are said again once in place; at a reload this
            # process has said them already.
            said_before=self._built,
        )
        self._built = True
        self.ballast = Ballast(config.ballast, state_dir) if config.ballast.path else None

    def restore(self, mounts: Iterable[str]) -> None:
        """A restart must not release producers of a disk still between the limits: continue
        the episode the actuators' state file says was open."""
        wanted = set(mounts)
        for mount in self.actuators.recorded_overfull_mounts():
            if mount in wanted:
                self.states[mount] = FlowState(overfull=True)

    def forget(self, mount: str) -> None:
        self.states.pop(mount, None)

    def step(
        self, usages: Mapping[str, FilesystemUsage], predicted: Prediction
    ) -> list[Transition]:
        """One step of every filesystem's state machine; the transitions, logged."""
        transitions: list[Transition] = []
        for mount, usage in usages.items():
            limits = flow_limits(self._config, usage.total_bytes)
            ahead = predicted(usage)
            # Flow control engages on the predicted usage too: when even what the broker will
            # free cannot keep the disk under the overfull limit, producers must slow now.
            seen = ahead if ahead is not None else usage
            state, changes = step(self.states.get(mount, FlowState()), seen, limits)
            self.states[mount] = state
            for raw in changes:
                change = replace(
                    raw, usage_percent=usage.usage_percent, free_bytes=usage.available_bytes
                )
                if change.event == "overfull":
                    by_usage = limits.is_overfull(usage)
                    change = replace(
                        change,
                        reason="usage" if by_usage else "predicted",
                        predicted_usage_percent=None
                        if by_usage or ahead is None
                        else ahead.usage_percent,
                    )
                _log_transition(change)
                transitions.append(change)
        return transitions

    def act(self, transitions: list[Transition], topics: Mapping[str, list[str]]) -> None:
        """The actuators and the ballast on each transition (``topics``: per mount, for ACLs)."""
        for change in transitions:
            engaged = self.actuators.apply(change, topics=topics.get(change.mount, []))
            if change.event in ("overfull", "overfull_cleared"):
                _log_flow_control_applied(change, engaged)
            if self.ballast is not None:
                self.ballast.on_transition(change)

    def well_under(
        self,
        usages: Mapping[str, FilesystemUsage],
        predicted: Callable[[FilesystemUsage], FilesystemUsage | None],
        margins: Mapping[str, int],
    ) -> bool:
        """Is every filesystem its margin (mount -> bytes, ``quiet_margin_bytes``) short of
        every flow limit (overfull, low-space alert), on today's usage and on the one the
        forecast predicts? Only then may the daemon be quiet (its usage poll slower): a
        limit set below the retention ceiling must not be seen later for it."""
        for mount, usage in usages.items():
            limits = flow_limits(self._config, usage.total_bytes)
            ahead = predicted(usage)
            margin = margins.get(mount, quiet_margin_bytes(usage))
            for seen in (usage,) if ahead is None else (usage, ahead):
                if not limits.well_under(seen, margin):
                    return False
        return True

    def engaged(self) -> bool:
        """Some filesystem is overfull (producers held back) or at an alert level: each
        cycle's ``reconcile`` keeps the actuators' view of its topics current."""
        return any(s.overfull or s.alert_level for s in self.states.values())

    def reconcile(self, topics: Mapping[str, list[str]]) -> None:
        """The actuators' whole view again (a topic created while its disk is overfull needs
        its ACL too)."""
        self.actuators.reconcile({m: bool(s.overfull) for m, s in self.states.items()}, topics)

    def ensure_ballast(self, usages: Mapping[str, FilesystemUsage]) -> None:
        """Re-create the ballast file if it is gone and its filesystem has room again."""
        if self.ballast is None:
            return
        for usage in usages.values():
            if _on_device(usage.mount, self.ballast.path):
                self.ballast.ensure(usage, flow_limits(self._config, usage.total_bytes))

    def observe_limits(self, mount: str, device: str, total: int, capacity: int) -> None:
        """The flow limits of a filesystem as metrics (the scan knows its size)."""
        limits = flow_limits(self._config, total)
        self._metrics.observe_flow_limits(mount, device, limits, capacity)

    def close(self, timeout_s: float = 5.0, stopping: bool = False) -> None:
        """``stopping``: the daemon exits, and a hook still running goes with it (its process
        group), rather than outlive it; at a reload it finishes."""
        self.actuators.close(timeout_s, stopping=stopping)


def _log_transition(change: Transition) -> None:
    fields = change.fields()
    if change.event == "overfull":
        log.warning("overfull", **fields)
    elif change.event == "overfull_cleared":
        log.info("overfull_cleared", **fields)
    elif change.level == ALERT_DEGRADED:
        # Level 2 means overfull: an operator must see it (flow_control_applied then says
        # whether anything holds producers back).
        log.warning("disk_alert", **fields)
    else:
        log.info("disk_alert", **fields)


def _log_flow_control_applied(change: Transition, engaged: tuple[str, ...]) -> None:
    """Say what really holds producers back: the ``overfull`` text is Qpid's fixed contract
    ("flow control will be enforced") whether or not anything can enforce it, so this line
    names the actuators engaged, or says plainly that none is."""
    overfull = change.event == "overfull"
    if engaged:
        verb = "producers are being blocked by" if overfull else "producers released by"
        message = f"{verb}: {', '.join(engaged)}"
    else:
        message = "no actuator configured: producers are NOT held back"
    fields = {
        "mount": change.mount,
        "transition": change.event,
        "actuators": list(engaged),
        "message": message,
    }
    if overfull and not engaged:
        log.warning("flow_control_applied", **fields)
    else:
        log.info("flow_control_applied", **fields)


def _on_device(mount: str, path: Path | None) -> bool:
    """Whether ``path`` lives on the device labelled ``mount`` (by ``st_dev``, so a path
    through another mount point of the same device counts)."""
    if path is None:
        return False
    try:
        return os.stat(path.parent).st_dev == os.stat(mount).st_dev
    except OSError:
        return False
