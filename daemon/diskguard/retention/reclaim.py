"""The broker's reclaim latency and a filesystem's growth rate, as a forecast (pure).

Measured against a real Kafka broker: ``DeleteRecords`` moves the log start offset at once
but frees nothing until the broker's next retention check (``log.retention.check.interval.ms``,
run at a fixed rate, the first 30 s after start-up), which renames the segments ``*.deleted``
and removes them ``log.segment.delete.delay.ms`` later. A guard that asks only once the disk
is over its ceiling overshoots by write rate x that latency. So the planner is given, per
filesystem, how much the disk will grow before space asked for *now* is really free, and how
much it grows between two chances to free space (one check period).

Nothing here touches the disk, the clock or the broker: the edges feed observations in (usage
samples, the times our own deletions were seen renamed and gone) and read numbers out.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

__all__ = [
    "KAFKA_CHECK_INTERVAL_S",
    "KAFKA_DELETE_DELAY_S",
    "KAFKA_INITIAL_DELAY_S",
    "Forecast",
    "GrowthEstimator",
    "ReclaimModel",
    "ReclaimSettings",
]

#: Apache Kafka's defaults: log.retention.check.interval.ms, log.segment.delete.delay.ms and
#: LogManager's InitialTaskDelayMs (the first retention check after start-up).
KAFKA_CHECK_INTERVAL_S = 300.0
KAFKA_DELETE_DELAY_S = 60.0
KAFKA_INITIAL_DELAY_S = 30.0

#: How sure the check phase is: a check this close ahead may run before our DeleteRecords
#: reaches the broker (plan for the one after it), and a rename seen by inotify lags the
#: check itself. Within this distance of a check, requests only made for the forecast wait:
#: whether they catch this check or the next is a coin toss, and the next is soon.
_CHECK_MARGIN_S = 0.5


@dataclass(frozen=True)
class ReclaimSettings:
    """The two broker settings that decide when DeleteRecords'd space comes back."""

    check_interval_s: float = KAFKA_CHECK_INTERVAL_S
    delete_delay_s: float = KAFKA_DELETE_DELAY_S
    #: Where the numbers came from: "broker" (DescribeConfigs), a server.properties path, or
    #: "kafka defaults".
    source: str = "kafka defaults"

    @property
    def worst_latency_s(self) -> float:
        """A request made just after a check waits a whole period, then the delete delay."""
        return self.check_interval_s + self.delete_delay_s

    def settings_to_change(self) -> str:
        """The exact broker settings an operator would lower, for ``broker_reclaim_slow``."""
        return (
            f"log.retention.check.interval.ms={round(self.check_interval_s * 1000)}, "
            f"log.segment.delete.delay.ms={round(self.delete_delay_s * 1000)} "
            "(and topic-level file.delete.delay.ms overrides)"
        )


@dataclass(frozen=True)
class Forecast:
    """What the planner needs to hold the ceiling in broker mode, for one filesystem.

    ``growth_bytes``: growth expected until space asked for now is free (rate x latency).
    ``period_growth_bytes``: growth between two retention checks, i.e. until the chance
    after that one (rate x check interval): once the next check has passed, nothing asked
    can free space before the one after it, so the disk must have room for this much.
    """

    growth_bytes_per_s: float = 0.0
    latency_s: float = 0.0
    period_s: float = 0.0
    #: "measured" (the check phase is known from our own deletions seen renamed) or
    #: "settings" (worst case from the broker's settings, phase unknown), or "none".
    latency_source: str = "none"
    #: Right at a retention check: act only on today's usage, not on the forecast.
    near_check: bool = False

    @property
    def growth_bytes(self) -> int:
        return int(self.growth_bytes_per_s * self.latency_s)

    @property
    def period_growth_bytes(self) -> int:
        return int(self.growth_bytes_per_s * self.period_s)

    @property
    def headroom_needed_bytes(self) -> int:
        """Free space the disk needs above the ceiling if nothing were asked early:
        growth over the broker's worst-case reclaim latency."""
        return int(self.growth_bytes_per_s * (self.period_s + self.latency_s))


class GrowthEstimator:
    """Write rate of one filesystem from usage samples, robust to the drops deletions cause.

    Only increases count: a sample that went down (the broker or diskguard freed space) adds
    nothing, so a reclaim is never read as negative growth and the rate does not collapse
    right after every retention check. Over ``window_s`` seconds; no rate before
    ``min_span_s`` of history (a one-shot command has none).
    """

    def __init__(self, window_s: float = 60.0, min_span_s: float = 2.0) -> None:
        self.window_s = window_s
        self.min_span_s = min_span_s
        self._samples: deque[tuple[float, int]] = deque()
        self._growth: deque[int] = deque()  # growth[i] = max(0, used[i] - used[i-1])
        #: sum(growth[1:]), kept as samples come and go: ``rate`` is asked at every loop
        #: iteration, and a busy disk wakes the loop hundreds of times a second (inotify),
        #: so summing a 60 s window each time cost more than everything else the loop did.
        self._growth_sum = 0

    def observe(self, t: float, used_bytes: int) -> None:
        if self._samples and t <= self._samples[-1][0]:
            return  # clocks only go forward here (monotonic); drop a repeat
        grown = max(0, used_bytes - self._samples[-1][1]) if self._samples else 0
        self._samples.append((t, used_bytes))
        self._growth.append(grown)
        if len(self._growth) > 1:
            self._growth_sum += grown
        while len(self._samples) > 2 and t - self._samples[1][0] >= self.window_s:
            self._samples.popleft()
            self._growth.popleft()
            # The new first sample's growth happened before the window began.
            self._growth_sum -= self._growth[0]

    def rate(self) -> float | None:
        """Bytes per second over the window, None until there is enough history."""
        if len(self._samples) < 2:
            return None
        span = self._samples[-1][0] - self._samples[0][0]
        if span < self.min_span_s:
            return None
        return self._growth_sum / span


class ReclaimModel:
    """When does space asked of the broker now come back? Learned from the broker's settings
    and from watching our own DeleteRecords'd segments go.

    The broker runs its retention check at a fixed rate, so once one check has been seen (a
    segment we asked for renamed ``*.deleted``), every later one is known: the latency of a
    request made at ``t`` is the time to the next check plus the delete delay. Until then the
    worst case (a whole period plus the delay) is assumed: it may delete a little early, never
    late. Measured request-to-gone latencies are kept for ``status`` and metrics.
    """

    def __init__(self, settings: ReclaimSettings, samples: int = 256) -> None:
        self.settings = settings
        self.last_check_t: float | None = None
        self._samples = samples
        self._latencies: dict[str, deque[float]] = {}

    def observe_check(self, t: float) -> None:
        """A retention check ran at ``t`` (our segment seen renamed ``*.deleted``)."""
        if self.last_check_t is None or t > self.last_check_t:
            self.last_check_t = t

    def observe_latency(self, mount: str, seconds: float) -> None:
        """One request-to-gone latency on ``mount`` (DeleteRecords sent -> files unlinked)."""
        if seconds >= 0 and math.isfinite(seconds):
            self._latencies.setdefault(mount, deque(maxlen=self._samples)).append(seconds)

    def next_check(self, t: float) -> float | None:
        """The first check at least a margin after ``t``, if the phase is known."""
        if self.last_check_t is None:
            return None
        period = self.settings.check_interval_s
        if period <= 0:
            return t
        elapsed = t + self._margin() - self.last_check_t
        k = max(0, math.floor(elapsed / period) + 1)
        return self.last_check_t + k * period

    def _margin(self) -> float:
        """``_CHECK_MARGIN_S``, but at most a tenth of a (short) check period."""
        return min(_CHECK_MARGIN_S, self.settings.check_interval_s / 10)

    def near_check(self, t: float) -> bool:
        """Within twice the margin of a known check time (before or after): wider
        than the margin ``next_check`` allows, so no request is made where it is unsure."""
        if self.last_check_t is None or self.settings.check_interval_s <= 0:
            return False
        period = self.settings.check_interval_s
        offset = (t - self.last_check_t) % period
        return min(offset, period - offset) < 2 * self._margin()

    def latency_at(self, t: float) -> tuple[float, str]:
        """``(seconds until space asked at t is free, "measured"|"settings")``."""
        nxt = self.next_check(t)
        if nxt is None:
            return self.settings.worst_latency_s, "settings"
        return nxt - t + self.settings.delete_delay_s, "measured"

    def forecast(self, t: float, rate: float | None) -> Forecast:
        latency, source = self.latency_at(t)
        return Forecast(
            growth_bytes_per_s=max(0.0, rate or 0.0),
            latency_s=latency,
            period_s=self.settings.check_interval_s,
            latency_source=source,
            near_check=self.near_check(t),
        )

    def observed(self, mount: str) -> tuple[float | None, float | None, int]:
        """``(p50, max, count)`` of request-to-gone latencies measured on ``mount``."""
        values = sorted(self._latencies.get(mount, ()))
        if not values:
            return None, None, 0
        return values[(len(values) - 1) // 2], values[-1], len(values)
