"""Flow control from the loop: step each filesystem's flow state, act on the transitions.

The state machine is ``flow.state`` (pure); this feeds it the usage (or the broker-mode
forecast, when higher), logs each transition (``overfull``, ``overfull_cleared``,
``disk_alert``), applies the actuators and says what really holds producers back
(``flow_control_applied``). A mixin of ``Daemon`` (``loop``), split out only to keep the
loop readable.
"""

from __future__ import annotations

from dataclasses import replace

from diskguard.daemon.forecast import ReclaimForecast
from diskguard.flow.ballast import Ballast
from diskguard.flow.limits import flow_limits
from diskguard.flow.reconcile import Actuators
from diskguard.flow.state import ALERT_DEGRADED, FlowState, Transition, step
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import get_logger

log = get_logger("diskguard.daemon")


class FlowControl(ReclaimForecast):
    """Producers held back while a filesystem is overfull, released when it is under."""

    actuators: Actuators
    ballast: Ballast | None

    def _flow(self, usages: dict[str, FilesystemUsage]) -> list[Transition]:
        transitions: list[Transition] = []
        for mount, usage in usages.items():
            limits = flow_limits(self.config, usage.total_bytes)
            predicted = self._predicted(mount, usage)
            # Flow control engages on the predicted usage too: when even what the broker will
            # free cannot keep the disk under the overfull limit, producers must slow now.
            seen = predicted if predicted is not None else usage
            state, changes = step(self.memory.flow.get(mount, FlowState()), seen, limits)
            self.memory.flow[mount] = state
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
                        if by_usage or predicted is None
                        else (predicted.usage_percent),
                    )
                fields = change.fields()
                if change.event == "overfull":
                    log.warning("overfull", **fields)
                elif change.event == "overfull_cleared":
                    log.info("overfull_cleared", **fields)
                elif change.level == ALERT_DEGRADED:
                    # Level 2 means overfull: an operator must see it (flow_control_applied
                    # then says whether anything holds producers back).
                    log.warning("disk_alert", **fields)
                else:
                    log.info("disk_alert", **fields)
                transitions.append(change)
        return transitions

    def _act_on_transitions(self, transitions: list[Transition]) -> None:
        if not transitions:
            return
        topics = self._topics_by_mount()
        for change in transitions:
            engaged = self.actuators.apply(change, topics=topics.get(change.mount, []))
            if change.event in ("overfull", "overfull_cleared"):
                self._log_flow_control_applied(change, engaged)
            if self.ballast is not None:
                self.ballast.on_transition(change)

    @staticmethod
    def _log_flow_control_applied(change: Transition, engaged: tuple[str, ...]) -> None:
        """Say what really holds producers back: the ``overfull`` text is Qpid's fixed
        contract ("flow control will be enforced") whether or not anything can enforce it,
        so this line names the actuators engaged, or says plainly that none is."""
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

    def _topics_by_mount(self) -> dict[str, list[str]]:
        last = self._last_outcome
        out: dict[str, list[str]] = {}
        if last is None:
            return out
        for fs in last.scan.filesystems:
            out[fs.usage.mount] = sorted({p.topic for d in fs.log_dirs for p in d.partitions})
        return out
