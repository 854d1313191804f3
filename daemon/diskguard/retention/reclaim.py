"""The broker's reclaim latency and a filesystem's growth rate, as a forecast (pure).

Measured against a real Kafka broker: ``DeleteRecords`` moves the log start offset at once
but frees nothing until the broker's next retention check (``log.retention.check.interval.ms``,
run at a fixed rate, the first 30 s after start-up), which renames the segments ``*.deleted``
and removes them ``log.segment.delete.delay.ms`` later. A guard that asks only once the disk
is over its ceiling overshoots by write rate x that latency. So the planner is given, per
filesystem, how much the disk will grow before space asked for *now* is really free, and how
much it grows between two chances to free space (one check period).

A forecast deletes for growth that has not happened yet, so it rests only on growth that is
sustained (``GrowthEstimator``: a step is no rate, and no rate comes from a window shorter
than what it predicts), and once the check phase is known its requests wait for the last
seconds before the check that will reclaim them (``ReclaimModel.send_in``): they feed the
same check, sized on the newest rate, and a writer that stops is not paid for a period.

Nothing here touches the disk, the clock or the broker: the edges feed observations in (usage
samples, the times our own deletions were seen renamed and gone) and read numbers out.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from dataclasses import dataclass

__all__ = [
    "KAFKA_CHECK_INTERVAL_S",
    "KAFKA_DELETE_DELAY_S",
    "KAFKA_INITIAL_DELAY_S",
    "MIN_RATE_WINDOW_S",
    "PARTIAL_RATE_WINDOW_S",
    "SEND_LEAD_S",
    "WARNING_RATE_WINDOW_S",
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
#: A forecast's requests are sent in the last seconds before the check that will reclaim
#: them (once the check phase is known): at least this long before it (beyond the margin),
#: or a tenth of the check period if longer, so that a cycle (scan, plan, DeleteRecords)
#: started in the window still reaches the broker before the check.
SEND_LEAD_S = 2.0
#: A forecast's requests start at least this many times the slowest recent broker-mode
#: cycle before their check (a busy machine, a slow broker).
SEND_LEAD_CYCLES = 3
#: The shortest window a rate is measured over, whatever the broker's settings.
MIN_RATE_WINDOW_S = 10.0
#: Less history than a forecast's window is a rate only from this long on (or the whole
#: window, if shorter): a write of a few seconds on a busy machine lies in all three parts
#: of a 10 s window, not of a 30 s one.
PARTIAL_RATE_WINDOW_S = 30.0
#: The window of the rate warnings judge by (``broker_reclaim_slow``), where a forecast's is
#: longer: growth sustained over a minute, which a one-off burst of a few seconds is not.
WARNING_RATE_WINDOW_S = 60.0


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
    """What the planner needs to hold the ceiling in broker mode, for one filesystem: the
    growth rate, the time until space asked for now is free (``latency_s``), and the check
    period after it (once the next check has passed, nothing asked can free space before the
    one after it, so the disk must have room for a period's growth). The bytes are
    ``limits.Limits``'s to compute.
    """

    growth_bytes_per_s: float = 0.0
    latency_s: float = 0.0
    period_s: float = 0.0
    #: "measured" (the check phase is known from our own deletions seen renamed) or
    #: "settings" (worst case from the broker's settings, phase unknown), or "none".
    latency_source: str = "none"
    #: Right at a retention check: act only on today's usage, not on the forecast.
    near_check: bool = False
    #: Seconds until requests made for the forecast are sent: the check phase is known and
    #: the check that would reclaim them is further away than the send lead. Until then a
    #: cycle acts on today's usage only; sent in the window, a request feeds the same check
    #: and is sized on the newest rate, so a writer that stops meanwhile is not paid for.
    send_in_s: float = 0.0
    #: How far ahead the forecast may look: as far as the window its rate was measured over
    #: reaches back (a forecast never predicts further than it has seen). Infinite for a
    #: rate taken over from a running daemon, which measured it over a whole window.
    horizon_s: float = math.inf

    @property
    def deferred(self) -> bool:
        """Requests made only for the forecast wait (near a check, or before the window)."""
        return self.near_check or self.send_in_s > 0


class GrowthEstimator:
    """Sustained write rate of one filesystem, from usage samples.

    Only increases count: a sample that went down (the broker or diskguard freed space) adds
    nothing, so a reclaim is never read as negative growth and the rate does not collapse
    right after every retention check.

    A rate is what the disk grew through the *whole* window: the window is cut into
    ``PARTS`` equal parts, and the rate is the typical (median) part's, but never more than
    twice the slowest part's nor more than the window's mean. A one-off write (a step) lies in
    one or two parts, the slowest grew nothing: no rate at all, however large the step; a
    step on top of steady writes is no part of their median; growth that stopped fades with
    the last part (twice the slowest); and a forecast never predicts more than the window
    grew (the mean). The lowest part alone would be a rate biased low by every writer's
    jitter, and a ceiling held on it would be exceeded by that much. And there is no rate
    until the samples span the whole window: a forecast of the next ``H`` seconds asks for a
    window of at least ``H`` (``rate(window_s)``), so seconds of history after a start never
    stand for minutes.

    ``window_s``: the longest window asked for (older samples are dropped). Samples closer
    than ``resolution_s`` are merged (a busy disk wakes the loop up to 50 times a second).
    """

    PARTS = 3

    def __init__(self, window_s: float = 60.0, resolution_s: float = 0.1) -> None:
        self.window_s = window_s
        self.resolution_s = resolution_s
        #: Sample times and the growth accumulated up to each (increases only).
        self._t: list[float] = []
        self._g: list[int] = []
        self._first = 0  # samples before this index have left the window
        self._last_t: float | None = None
        self._last_used = 0
        self._cached: tuple[float, float, float | None] | None = None

    def observe(self, t: float, used_bytes: int) -> None:
        if self._last_t is not None and t <= self._last_t:
            return  # clocks only go forward here (monotonic); drop a repeat
        grown = max(0, used_bytes - self._last_used) if self._last_t is not None else 0
        self._last_t, self._last_used = t, used_bytes
        cumulative = (self._g[-1] if self._g else 0) + grown
        if len(self._t) - self._first >= 2 and t - self._t[-2] < self.resolution_s:
            # Merge into the newest sample: its time moves up, the growth stays counted.
            self._t[-1], self._g[-1] = t, cumulative
        else:
            self._t.append(t)
            self._g.append(cumulative)
        # Keep one sample at or before the window's start: it is the window's baseline.
        while len(self._t) - self._first > 2 and t - self._t[self._first + 1] >= self.window_s:
            self._first += 1
        if self._first > 1024 and self._first * 2 > len(self._t):
            del self._t[: self._first], self._g[: self._first]
            self._first = 0

    def _grown_by(self, t: float) -> int:
        """Growth accumulated up to the last sample at or before ``t``."""
        i = bisect.bisect_right(self._t, t, lo=self._first) - 1
        return self._g[max(i, self._first)]

    def rate_up_to(
        self, window_s: float, min_window_s: float = MIN_RATE_WINDOW_S
    ) -> tuple[float, float] | None:
        """``(rate, window)``: the rate sustained through the last ``window_s`` seconds, or
        through all the history held if shorter (and then that window: a forecast may look
        only as far ahead); None with less than ``min_window_s`` of history."""
        window = min(window_s, self.span())
        if window < min_window_s or window <= 0:
            return None
        rate = self.rate(window)
        return None if rate is None else (rate, window)

    def span(self) -> float:
        """Seconds of history held (0 without two samples)."""
        if len(self._t) - self._first < 2 or self._last_t is None:
            return 0.0
        return self._last_t - self._t[self._first]

    def rate(self, window_s: float | None = None) -> float | None:
        """Bytes per second sustained through the last ``window_s`` seconds (default: the
        whole window), None until the samples span that much."""
        window = self.window_s if window_s is None else window_s
        now = self._last_t
        if now is None or window <= 0 or self.span() < window:
            return None
        if self._cached is not None and self._cached[:2] == (now, window):
            return self._cached[2]
        part = window / self.PARTS
        start = now - window
        grown = sorted(
            self._grown_by(start + (i + 1) * part) - self._grown_by(start + i * part)
            for i in range(self.PARTS)
        )
        rate = sustained(grown) / part
        self._cached = (now, window, rate)
        return rate


def sustained(parts: list[int]) -> float:
    """Growth per part sustained through all ``parts`` (sorted): the median part's, at most
    twice the least and at most the mean."""
    n = len(parts)
    median = (parts[(n - 1) // 2] + parts[n // 2]) / 2
    return min(median, 2 * parts[0], sum(parts) / n)


class ReclaimModel:
    """When does space asked of the broker now come back? Learned from the broker's settings
    and from watching our own DeleteRecords'd segments go.

    The broker runs its retention check at a fixed rate, so once one check has been seen (a
    segment we asked for renamed ``*.deleted``), every later one is known: the latency of a
    request made at ``t`` is the time to the next check plus the delete delay. Until then the
    worst case (a whole period plus the delay) is assumed: it may delete a little early, never
    late; but once a request of ours waits unrenamed, no check has run since it was accepted,
    so the next one comes within a period of it: later requests feed that same check, and
    their latency ends there (else every poll until it would ask for a period's growth more).
    Measured request-to-gone latencies are kept for ``status`` and metrics.
    """

    def __init__(
        self, settings: ReclaimSettings, samples: int = 256, send_lead_s: float = SEND_LEAD_S
    ) -> None:
        self.settings = settings
        self.send_lead_s = send_lead_s
        self.last_check_t: float | None = None
        #: When the oldest request not yet seen renamed was accepted (phase unknown only).
        self.unseen_since: float | None = None
        #: How long the last broker-mode cycles took (seconds): a tuple rebound whole, as the
        #: retention worker adds to it while the loop reads it.
        self._cycles: tuple[float, ...] = ()
        self._samples = samples
        self._latencies: dict[str, deque[float]] = {}

    def observe_check(self, t: float) -> None:
        """A retention check ran at ``t`` (our segment seen renamed ``*.deleted``)."""
        if self.last_check_t is None or t > self.last_check_t:
            self.last_check_t = t
        self.unseen_since = None

    def observe_request(self, t: float) -> None:
        """The broker accepted a DeleteRecords of ours at ``t``."""
        if self.unseen_since is None:
            self.unseen_since = t

    def observe_renamed_unseen(self) -> None:
        """Our segments were found renamed by a scan, at an unknown moment: a check ran, so
        the wait for one no longer bounds the next."""
        self.unseen_since = None

    def observe_cycle(self, seconds: float) -> None:
        """A broker-mode cycle (scan, plan, DeleteRecords) took ``seconds``."""
        if seconds >= 0 and math.isfinite(seconds):
            self._cycles = (*self._cycles[-7:], seconds)

    def observe_latency(self, mount: str, seconds: float) -> None:
        """One request-to-gone latency on ``mount`` (DeleteRecords sent -> files unlinked)."""
        if seconds >= 0 and math.isfinite(seconds):
            self._latencies.setdefault(mount, deque(maxlen=self._samples)).append(seconds)

    def next_check(self, t: float) -> float | None:
        """The first check a request asked for at ``t`` can feed, if the phase is known: at
        least a margin after ``t`` and after the slowest recent cycle (``reach_s``)."""
        if self.last_check_t is None:
            return None
        period = self.settings.check_interval_s
        if period <= 0:
            return t
        elapsed = t + self._margin() + self.reach_s - self.last_check_t
        k = max(0, math.floor(elapsed / period) + 1)
        return self.last_check_t + k * period

    @property
    def reach_s(self) -> float:
        """How long a request sized at the cycle's forecast may take to reach the broker: the
        slowest recent broker-mode cycle. Sized for a check it then reaches too late, it
        is reclaimed a whole period later, and the disk overshoots by a period's growth (a
        loaded machine: 2.1 points over a ceiling at a 2 s check). At most one check period:
        one cycle that waited out a hung broker must not push every forecast of the next
        eight a period further per period it took."""
        return min(max(self._cycles, default=0.0), max(0.0, self.settings.check_interval_s))

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
        if nxt is not None:
            return nxt - t + self.settings.delete_delay_s, "measured"
        worst = self.settings.worst_latency_s
        if self.unseen_since is not None:
            # The check our waiting request awaits; past it (its rename missed, or reached
            # too late to feed it), the worst.
            due = self.unseen_since + self.settings.check_interval_s + self._margin()
            if t + self.reach_s <= due:
                return min(worst, due - t + self.settings.delete_delay_s), "settings"
        return worst, "settings"

    @property
    def rate_window_s(self) -> float:
        """The window a forecast's rate must be sustained over: what the forecast predicts
        at most, the worst-case latency plus the check period after it (and at least
        ``MIN_RATE_WINDOW_S``)."""
        return max(
            MIN_RATE_WINDOW_S, self.settings.check_interval_s + self.settings.worst_latency_s
        )

    @property
    def send_lead(self) -> float:
        """How long before a check (beyond twice the margin) a forecast's requests are sent:
        ``SEND_LEAD_S``, a tenth of the period, or ``SEND_LEAD_CYCLES`` times the slowest
        recent cycle, whichever is longest."""
        slowest = max(self._cycles, default=0.0)
        return max(
            self.send_lead_s, self.settings.check_interval_s / 10, SEND_LEAD_CYCLES * slowest
        )

    def send_in(self, t: float) -> float:
        """Seconds from ``t`` until the send window of the next check opens; 0 inside it, or
        when the phase is unknown (then a request may be needed by any moment)."""
        nxt = self.next_check(t)
        if nxt is None:
            return 0.0
        return max(0.0, nxt - t - 2 * self._margin() - self.send_lead)

    def forecast(self, t: float, rate: float | None, horizon_s: float = math.inf) -> Forecast:
        """At ``t``, growing at ``rate`` measured over ``horizon_s`` seconds."""
        latency, source = self.latency_at(t)
        return Forecast(
            growth_bytes_per_s=max(0.0, rate or 0.0),
            latency_s=latency,
            period_s=self.settings.check_interval_s,
            latency_source=source,
            near_check=self.near_check(t),
            send_in_s=self.send_in(t),
            horizon_s=horizon_s,
        )

    def observed(self, mount: str) -> tuple[float | None, float | None, int]:
        """``(p50, max, count)`` of request-to-gone latencies measured on ``mount``."""
        values = sorted(self._latencies.get(mount, ()))
        if not values:
            return None, None, 0
        return values[(len(values) - 1) // 2], values[-1], len(values)
