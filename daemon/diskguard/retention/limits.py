"""Over, and by how much: one filesystem measured against its retention limits. Pure.

``stand`` is the one rule: every "is this filesystem over?" and "how many bytes must go?"
in diskguard is this function's answer (the planner calls it directly; everything else asks
``retention.ceilings.Ceilings``, which builds the ``Limits`` from the config and knows what
is pending). KIP-61 triggers above the ceiling (``limit_percent``) and then deletes down to
``target_percent``; bytes already on their way out (``pending``) count as deleted, never twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from diskguard.kafkalog.model import Filesystem, FilesystemUsage

if TYPE_CHECKING:
    # Types only: status asks for the limits without importing the reclaim model (start-up).
    from diskguard.retention.reclaim import Forecast

#: The offline headroom never asks for more than this share of a filesystem.
HEADROOM_CAP_FRACTION = 0.05
#: "Well under its limits" (a quiet daemon, whose usage poll is slower) leaves at least
#: this share of the filesystem between the usage and every limit: the room for a burst out
#: of nothing, which no growth seen before could announce.
QUIET_MARGIN_FRACTION = 0.01


@dataclass(frozen=True)
class Limits:
    """The limits that apply to one filesystem."""

    limit_percent: float
    target_percent: float
    #: Per-log-dir byte budget for Kafka data (Redpanda's target capacity bytes).
    max_bytes: int | None = None
    #: Extra free space to leave (offline rescue: room for the broker's log recovery).
    headroom_bytes: int = 0
    #: Broker mode only (offline, files go at once): the filesystem's write rate, the time
    #: until space asked for now is really free (the broker's reclaim latency), and the
    #: broker's retention-check period. All 0 when unknown: then only today's usage counts.
    growth_bytes_per_s: float = 0.0
    reclaim_latency_s: float = 0.0
    reclaim_period_s: float = 0.0
    #: How the latency is known: "measured" (check phase seen), "settings" (worst case), "none".
    latency_source: str = "none"
    #: How far ahead the forecast may look (the span its rate was measured over): the growth
    #: until reclaim, then the period's, count only within it.
    forecast_horizon_s: float = math.inf
    #: The forecast waits: at a retention check of known phase (a request now may or may not
    #: catch this check; after it, it certainly catches the next), or before the last seconds
    #: ahead of the check its requests would feed (sent then, they feed the same check, sized
    #: on a newer rate). Meanwhile only today's usage counts, for triggering and for how much.
    defer_forecast: bool = False

    @property
    def growth_bytes(self) -> int:
        """Growth expected before space asked for now is free (rate x latency, within the
        horizon)."""
        return int(self.growth_bytes_per_s * min(self.reclaim_latency_s, self.forecast_horizon_s))

    @property
    def period_growth_bytes(self) -> int:
        """Growth over one check period, until the chance after the next one (within what
        the horizon leaves after the latency)."""
        left = max(0.0, self.forecast_horizon_s - self.reclaim_latency_s)
        return int(self.growth_bytes_per_s * min(self.reclaim_period_s, left))


def with_forecast(limits: Limits, forecast: Forecast) -> Limits:
    """``limits`` looking ahead by a broker-mode forecast (rate, reclaim latency, period)."""
    return replace(
        limits,
        growth_bytes_per_s=forecast.growth_bytes_per_s,
        reclaim_latency_s=forecast.latency_s,
        reclaim_period_s=forecast.period_s,
        latency_source=forecast.latency_source,
        defer_forecast=forecast.deferred,
        forecast_horizon_s=forecast.horizon_s,
    )


@dataclass(frozen=True)
class Standing:
    """One filesystem against its limits: the answer every caller reads.

    ``over``: a retention cycle must free space on it now (today's usage above the ceiling,
    or, in broker mode, the usage predicted for when space asked for now is freed);
    ``predicted_only``: only that prediction is over; ``excess_bytes``: what must go for the
    usage-percent rule, net of ``pending_bytes`` (0 when not over).
    """

    usage: FilesystemUsage
    limits: Limits
    pending_bytes: int
    over: bool
    predicted_only: bool
    excess_bytes: int
    #: Set when the retention on this filesystem is stopped (``retention.unfreed``: earlier
    #: deletions did not free their space): why, in one sentence; then nothing is chosen.
    halted: str = ""

    @property
    def over_usage(self) -> bool:
        """Today's usage above the ceiling, on the exact bytes (no forecast, no pending)."""
        return self.usage.above(self.limits.limit_percent)

    @property
    def predicted_used_bytes(self) -> int:
        """``used`` expected when space asked for now is freed: ``used + growth - pending``
        (``used - pending`` without a forecast)."""
        return self.usage.used_bytes + self.limits.growth_bytes - self.pending_bytes


def stand(usage: FilesystemUsage, limits: Limits, pending_bytes: int) -> Standing:
    """The one rule for "over, and by how much".

    Over when today's usage is above the ceiling, or, in broker mode, when the usage predicted
    for the moment the *following* reclaim could free space would be: after the broker's next
    retention check nothing asked can free space for a whole period more, so
    ``used + growth - pending + period_growth`` must stay under the ceiling.

    Once over, the goal is the target, or lower if the growth over the following check period
    would otherwise carry the disk over the ceiling before the next chance to free space; and
    ``headroom_bytes`` (offline rescue) must also be left free, capped at
    ``HEADROOM_CAP_FRACTION`` of the filesystem so a small disk is never emptied for it.

    What a forecast alone (today's usage under the ceiling) may delete is bounded by the
    growth it forecasts, ``growth + period_growth``: never more than the disk is predicted
    to grow, so a wrong forecast can never trim toward a target the disk has not reached.
    While the forecast waits (``defer_forecast``) it counts for nothing: over by today's usage,
    the goal is the plain target.
    """
    growth, period_growth = (
        (0, 0) if limits.defer_forecast else (limits.growth_bytes, limits.period_growth_bytes)
    )
    over, predicted_only = _over(usage, limits, pending_bytes, growth, period_growth)
    excess = 0
    if over:
        goal = usage.used_bytes_at(limits.target_percent)
        if period_growth:
            ceiling_used = usage.used_bytes_at(limits.limit_percent)
            goal = max(0, min(goal, ceiling_used - period_growth))
        if limits.headroom_bytes:
            capacity = usage.used_bytes + usage.available_bytes
            headroom = min(limits.headroom_bytes, int(capacity * HEADROOM_CAP_FRACTION))
            goal = min(goal, capacity - headroom)
        excess = max(0, usage.used_bytes + growth - pending_bytes - goal)
        if predicted_only:
            excess = min(excess, growth + period_growth)
    return Standing(usage, limits, pending_bytes, over, predicted_only, excess)


def _over(
    usage: FilesystemUsage, limits: Limits, pending_bytes: int, growth: int, period_growth: int
) -> tuple[bool, bool]:
    if usage.above(limits.limit_percent):
        return True, False
    if not (growth or period_growth):
        return False, False
    predicted = usage.used_bytes + growth - pending_bytes + period_growth
    return predicted > usage.used_bytes_at(limits.limit_percent), True


def room_above_ceiling(usage: FilesystemUsage, limits: Limits) -> int:
    """Bytes between the ceiling and a full disk: what the growth must fit in while the
    broker has not freed what was asked (``broker_reclaim_slow``)."""
    return usage.used_bytes + usage.available_bytes - usage.used_bytes_at(limits.limit_percent)


def dir_excess(fs: Filesystem, limits: Limits) -> Mapping[str, int]:
    """Per log dir: Kafka bytes over the ``max_bytes`` budget, net of pending reclaim."""
    if limits.max_bytes is None:
        return {}
    out = {}
    for log_dir in fs.log_dirs:
        if log_dir.kafka_bytes is not None:
            value = log_dir.kafka_bytes - limits.max_bytes - log_dir.pending_reclaim_bytes
            if value > 0:
                out[log_dir.path] = value
    return out


def quiet_margin_bytes(
    usage: FilesystemUsage, growth_bytes_per_s: float = 0.0, reach_s: float = 0.0
) -> int:
    """The room a quiet daemon keeps below every limit: ``QUIET_MARGIN_FRACTION`` of the
    filesystem, or what the fastest growth seen lately (``growth_bytes_per_s``) writes within
    ``reach_s``, whichever is more. ``reach_s``: how late a crossing may be seen while quiet
    (the slow usage poll, plus the longest cycle a quiet daemon starts, which a cycle that
    must act waits for). A disk that fills faster than 1 % a poll would otherwise cross
    between two polls of a quiet daemon, and be seen a poll late."""
    floor = int((usage.used_bytes + usage.available_bytes) * QUIET_MARGIN_FRACTION)
    return max(floor, math.ceil(max(0.0, growth_bytes_per_s) * max(0.0, reach_s)))
