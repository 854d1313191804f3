"""The fastest growth of a filesystem seen lately (pure): how far from a limit a daemon that
looks at the usage only now and then must stay.

Nothing here touches the disk or the clock: the daemon's loop feeds its usage samples in.
"""

from __future__ import annotations

from collections import deque


class GrowthPeak:
    """The fastest growth of one filesystem seen lately, step by step: what a daemon that
    looks at the usage only every ``step_s`` must keep room for.

    ``GrowthEstimator``'s rate is sustained growth (a burst is no rate until it has lasted a
    window), right for a forecast that deletes, wrong for how late a crossing may be seen: a
    writer that bursts at 60 MiB/s crosses 1 % of a 4 GiB disk in under a second, whatever it
    did before. Here a step's growth counts at once, and the fastest step is kept ``keep_s``
    seconds (a writer that burst lately may burst again). Only increases count, as there: a
    deletion meanwhile hides none of what was written. The step under way counts too, over a
    whole step at least (a few milliseconds' jitter between two hint-paced samples is no
    rate).
    """

    def __init__(self, step_s: float = 1.0, keep_s: float = 300.0) -> None:
        self.step_s = step_s
        self.keep_s = keep_s
        self._last: tuple[float, int] | None = None
        #: Growth (increases only) since the step under way began, and when it began.
        self._grown = 0
        self._since = 0.0
        #: (end, rate) of finished steps, the rates decreasing: the first is the peak.
        self._peaks: deque[tuple[float, float]] = deque()
        self._now = 0.0

    def observe(self, t: float, used_bytes: int) -> None:
        if self._last is None:
            self._last, self._since, self._now = (t, used_bytes), t, t
            return
        last_t, last_used = self._last
        if t <= last_t:
            return  # clocks only go forward here (monotonic); drop a repeat
        self._grown += max(0, used_bytes - last_used)
        self._last, self._now = (t, used_bytes), t
        if t - self._since >= self.step_s:
            rate = self._grown / (t - self._since)
            while self._peaks and self._peaks[-1][1] <= rate:
                self._peaks.pop()
            self._peaks.append((t, rate))
            self._grown, self._since = 0, t
        while self._peaks and t - self._peaks[0][0] > self.keep_s:
            self._peaks.popleft()

    def rate(self) -> float:
        """Bytes per second: the fastest step within ``keep_s``, or the step under way."""
        current = self._grown / max(self.step_s, self._now - self._since)
        return max(current, self._peaks[0][1] if self._peaks else 0.0)
