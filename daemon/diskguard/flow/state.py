"""Qpid-style overfull/underfull flow control and Redpanda-style alert levels (pure).

Why a state machine and not a threshold check: producers must be blocked at the *overfull*
limit but released only below the lower *underfull* limit (Qpid Broker-J's MST-1008 /
MST-1009), so a disk hovering around one number never flaps between "blocked" and "free".
A hard floor on free space (Redpanda's ``storage_min_free_bytes``) blocks regardless of the
percent/byte limits, because a broker whose disk fills often cannot even restart.

Integration surface for the daemon loop (one call per filesystem per cycle)::

    limits = flow_limits(config, usage.total_bytes)            # flow.limits: the edge
    state, transitions = step(states.get(mount, FlowState()), usage, limits)
    states[mount] = state
    for transition in transitions:
        log.info(transition.event, **transition.fields())       # the edge logs
        actuators.apply(transition, topics=topics_on(mount))   # acts; never blocks or raises
        ballast.on_transition(transition)
    actuators.reconcile({m: s.overfull for m, s in states.items()}, topics_by_mount)

Nothing here does I/O and nothing here imports the config (``flow.limits`` builds the
limits at the edge): a step takes plain data and returns plain data, so every rule is a
unit test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from diskguard.kafkalog.model import FilesystemUsage

__all__ = [
    "ALERT_DEGRADED",
    "ALERT_LOW_SPACE",
    "ALERT_OK",
    "FlowLimits",
    "FlowState",
    "Transition",
    "default_min_free_bytes",
    "step",
]

#: Redpanda's ``storage_disk_free_space_alert`` values.
ALERT_OK: Final = 0
ALERT_LOW_SPACE: Final = 1
ALERT_DEGRADED: Final = 2

#: Exactly the texts of Qpid Broker-J's MST-1008 / MST-1009, so operators grepping for them
#: find us too.
OVERFULL_MESSAGE: Final = "store overfull, flow control will be enforced"
CLEARED_MESSAGE: Final = "store overfull condition cleared"
ALERT_MESSAGES: Final = {
    ALERT_OK: "disk space ok",
    ALERT_LOW_SPACE: "low free disk space",
    # Not "producers are being blocked": that is true only if an actuator acted, which the
    # daemon's flow_control_applied line says (naming it).
    ALERT_DEGRADED: "disk space degraded: store overfull",
}

_MIN_FREE_CAP: Final = 5 * 1024**3
_MIN_FREE_FRACTION: Final = 0.05

EventName = Literal["overfull", "overfull_cleared", "disk_alert"]


def default_min_free_bytes(total_bytes: int) -> int:
    """min(5 GiB, 5% of the filesystem): Redpanda's 5 GiB, scaled down for small disks.

    A flat 5 GiB would keep a 20 GiB test disk permanently "overfull"; 5% alone would be
    50 GiB on a 1 TB disk, far more than a broker needs to restart.
    """
    return min(_MIN_FREE_CAP, int(total_bytes * _MIN_FREE_FRACTION))


def _fmt_percent(value: float) -> str:
    return f"{value:g}%"


@dataclass(frozen=True)
class FlowLimits:
    """Every limit that applies to one filesystem, resolved to plain numbers.

    Percent limits compare with df's Use% (``FilesystemUsage.usage_percent``); byte limits
    compare with *used* bytes; ``min_free_bytes`` and ``low_space_bytes`` compare with
    *available* bytes (df's Avail), since that is what the broker can still write.
    """

    overfull_percent: float | None = None
    underfull_percent: float | None = None
    overfull_bytes: int | None = None
    underfull_bytes: int | None = None
    min_free_bytes: int = 0
    low_space_percent: float | None = None
    low_space_bytes: int | None = None

    def __post_init__(self) -> None:
        # The config validates this too; repeated here because limits are also built by hand
        # (tests, bench) and a band inverted by mistake would flap on every cycle.
        for over, under, unit in (
            (self.overfull_percent, self.underfull_percent, "percent"),
            (self.overfull_bytes, self.underfull_bytes, "bytes"),
        ):
            if (over is None) != (under is None):
                raise ValueError(f"overfull_{unit} and underfull_{unit} must be set together")
            if over is not None and under is not None and under >= over:
                raise ValueError(
                    f"underfull_{unit} ({under}) must be below overfull_{unit} ({over})"
                )
        if self.min_free_bytes < 0:
            raise ValueError("min_free_bytes must not be negative")

    def overfull_reasons(self, usage_percent: float, used_bytes: int, free_bytes: int) -> list[str]:
        """Which limits a usage crosses (empty = not overfull); any one is enough to block."""
        reasons = []
        if self.overfull_percent is not None and usage_percent >= self.overfull_percent:
            reasons.append(f"overfull_percent={_fmt_percent(self.overfull_percent)}")
        if self.overfull_bytes is not None and used_bytes >= self.overfull_bytes:
            reasons.append(f"overfull_bytes={self.overfull_bytes}")
        if free_bytes < self.min_free_bytes:
            reasons.append(f"min_free_bytes={self.min_free_bytes}")
        return reasons

    def is_overfull(self, usage: FilesystemUsage) -> bool:
        return bool(
            self.overfull_reasons(usage.usage_percent, usage.used_bytes, usage.available_bytes)
        )

    def is_underfull(self, usage: FilesystemUsage) -> bool:
        """Below *every* configured lower limit and above the floor: safe to release."""
        if self.underfull_percent is not None and not usage.usage_percent < self.underfull_percent:
            return False
        if self.underfull_bytes is not None and not usage.used_bytes < self.underfull_bytes:
            return False
        return usage.available_bytes >= self.min_free_bytes

    def clear_limit(self) -> str:
        """The limits a filesystem had to get under to clear, for the event's ``limit`` field."""
        parts = []
        if self.underfull_percent is not None:
            parts.append(f"underfull_percent={_fmt_percent(self.underfull_percent)}")
        if self.underfull_bytes is not None:
            parts.append(f"underfull_bytes={self.underfull_bytes}")
        parts.append(f"min_free_bytes={self.min_free_bytes}")
        return ",".join(parts)

    def is_low_space(self, usage: FilesystemUsage) -> bool:
        if self.low_space_percent is not None and usage.usage_percent >= self.low_space_percent:
            return True
        return self.low_space_bytes is not None and usage.available_bytes < self.low_space_bytes

    def well_under(self, usage: FilesystemUsage, margin_bytes: int) -> bool:
        """Would ``usage`` still be short of every overfull and low-space limit with
        ``margin_bytes`` more written? A quiet daemon polls the usage less often: it may be
        quiet only this far from any limit that engages flow control or an alert. A margin
        that would fill the disk is never well under, whatever limits are set (a bytes-only
        config with ``min_free_bytes = 0`` would otherwise see a full disk as fine)."""
        if usage.fills_with(margin_bytes):
            return False
        padded = usage.after_writing(margin_bytes)
        return not self.is_overfull(padded) and not self.is_low_space(padded)

    def would_be_overfull_after(self, usage: FilesystemUsage, extra_bytes: int) -> list[str]:
        """Limits crossed if ``extra_bytes`` more were written (the ballast's pre-check)."""
        used = usage.used_bytes + extra_bytes
        free = usage.available_bytes - extra_bytes
        denominator = usage.used_bytes + usage.available_bytes
        percent = 100.0 * used / denominator if denominator else 100.0
        return self.overfull_reasons(percent, used, free)


@dataclass(frozen=True)
class FlowState:
    """What the daemon remembers per filesystem between cycles.

    ``None`` means "not observed yet" (daemon start): the first observation then reports an
    already overfull disk, and stays silent about a healthy one.
    """

    overfull: bool | None = None
    alert_level: int | None = None


@dataclass(frozen=True)
class Transition:
    """One event for the edge to log and act on; ``fields()`` is what goes into the log line."""

    event: EventName
    mount: str
    message: str
    usage_percent: float
    free_bytes: int
    limit: str | None = None
    level: int | None = None
    previous_level: int | None = None
    #: ``overfull`` only: "usage" (a limit is crossed now) or "predicted" (broker mode: the
    #: usage predicted for when the broker frees what was asked crosses it).
    reason: str | None = None
    #: With reason "predicted": that predicted usage.
    predicted_usage_percent: float | None = None

    def fields(self) -> dict[str, Any]:
        """Structured-log fields, the event's own set only (no Nones that do not belong)."""
        out: dict[str, Any] = {"mount": self.mount}
        if self.event == "disk_alert":
            out["alert_level"] = self.level
            out["previous_alert_level"] = self.previous_level
            out["usage_percent"] = round(self.usage_percent, 3)
            out["free_bytes"] = self.free_bytes
        else:
            out["usage_percent"] = round(self.usage_percent, 3)
            out["free_bytes"] = self.free_bytes
            out["limit"] = self.limit
        if self.reason is not None:
            out["reason"] = self.reason
        if self.predicted_usage_percent is not None:
            out["predicted_usage_percent"] = round(self.predicted_usage_percent, 3)
        out["message"] = self.message
        return out


def alert_level(overfull: bool, usage: FilesystemUsage, limits: FlowLimits) -> int:
    """2 while flow control is enforced, 1 below the soft low-space alert, else 0."""
    if overfull:
        return ALERT_DEGRADED
    if limits.is_low_space(usage):
        return ALERT_LOW_SPACE
    return ALERT_OK


def step(
    state: FlowState, usage: FilesystemUsage, limits: FlowLimits
) -> tuple[FlowState, list[Transition]]:
    """Advance one filesystem's state by one observation.

    Enter overfull when usage reaches any overfull limit or free space falls under the floor;
    leave only when usage is under every underfull limit and free space is back above the
    floor. In between, the previous state holds: that band is what stops flapping.
    """
    free = usage.available_bytes
    percent = usage.usage_percent
    reasons = limits.overfull_reasons(percent, usage.used_bytes, free)
    transitions: list[Transition] = []
    if state.overfull:
        overfull = not limits.is_underfull(usage)
        if not overfull:
            transitions.append(
                Transition(
                    event="overfull_cleared",
                    mount=usage.mount,
                    message=CLEARED_MESSAGE,
                    usage_percent=percent,
                    free_bytes=free,
                    limit=limits.clear_limit(),
                )
            )
    else:
        overfull = bool(reasons)
        if overfull:
            transitions.append(
                Transition(
                    event="overfull",
                    mount=usage.mount,
                    message=OVERFULL_MESSAGE,
                    usage_percent=percent,
                    free_bytes=free,
                    limit=",".join(reasons),
                )
            )
    level = alert_level(overfull, usage, limits)
    if level != state.alert_level and not (state.alert_level is None and level == ALERT_OK):
        transitions.append(
            Transition(
                event="disk_alert",
                mount=usage.mount,
                message=ALERT_MESSAGES[level],
                usage_percent=percent,
                free_bytes=free,
                level=level,
                previous_level=state.alert_level,
            )
        )
    return FlowState(overfull=overfull, alert_level=level), transitions
