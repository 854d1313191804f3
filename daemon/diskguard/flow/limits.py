"""The config -> ``FlowLimits`` translation (edge).

Kept out of ``flow.state`` so the state machine stays pure: it takes plain numbers and
never sees the config, just as ``retention.planner.Limits`` is built by
``retention.inputs.limits_for``.
"""

from __future__ import annotations

from diskguard.config import Config
from diskguard.flow.state import FlowLimits, default_min_free_bytes

__all__ = ["flow_limits"]


def flow_limits(cfg: Config, total_bytes: int) -> FlowLimits:
    """Limits for a filesystem of ``total_bytes``; the min-free default depends on it."""
    flow = cfg.flow_control
    min_free = (
        flow.min_free_bytes
        if flow.min_free_bytes is not None
        else default_min_free_bytes(total_bytes)
    )
    return FlowLimits(
        overfull_percent=flow.overfull_percent,
        underfull_percent=flow.underfull_percent,
        overfull_bytes=flow.overfull_bytes,
        underfull_bytes=flow.underfull_bytes,
        min_free_bytes=min_free,
        low_space_percent=cfg.alerts.low_space_percent,
        low_space_bytes=cfg.alerts.low_space_bytes,
    )
