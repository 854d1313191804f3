"""How far below every limit a quiet daemon stays (``limits.quiet_margin_bytes``, fed the
fastest growth seen lately by ``growthpeak.GrowthPeak``).

While quiet, the daemon polls the usage every second and appends alone do not wake it, and
a cycle it starts then (a consistency rescan, a snapshot) keeps a reacting one waiting: a
crossing must never come before the daemon looks again. A fixed share of the disk is not
that: on a small disk a fast writer crosses 1 % between two polls. Simulated clock and disk
throughout: no sleeps, nothing timed.
"""

from __future__ import annotations

from collections.abc import Callable

from diskguard.kafkalog.model import FilesystemUsage
from diskguard.retention.growthpeak import GrowthPeak
from diskguard.retention.limits import Limits, quiet_margin_bytes, stand

MiB = 1024**2
GiB = 1024 * MiB
#: The quiet poll (``schedule.QUIET_POLL_S``) and the loop's pace otherwise (``HINT_PACE_S``).
POLL_S = 1.0
PACE_S = 0.02
#: How late a crossing may be seen while quiet: the poll, and a 0.5 s cycle started then.
REACH_S = POLL_S + 0.5

Margin = Callable[[FilesystemUsage, GrowthPeak], int]


def _with_peak(usage: FilesystemUsage, peak: GrowthPeak) -> int:
    return quiet_margin_bytes(usage, peak.rate(), REACH_S)


def _floor_only(usage: FilesystemUsage, _peak: GrowthPeak) -> int:
    return quiet_margin_bytes(usage)


def _late_crossings(
    margin: Margin, capacity: int, rate: float, start_percent: float = 60.0
) -> list[float]:
    """A disk idle at ``start_percent`` of ``capacity`` for a minute, then a writer at ``rate``
    bytes/s, against a 70 % limit, for each of ten phases of the burst's start between two
    polls. The daemon looks every ``POLL_S`` while quiet (``margin`` short of the limit), every
    ``PACE_S`` otherwise. Returns the times of polls found quiet although the limit is
    crossed before the daemon may look again (``REACH_S``): crossings seen late."""
    limits = Limits(limit_percent=70.0, target_percent=69.0)
    late = []
    for phase in range(10):
        burst_at = 60.0 + phase / 10

        def used_at(t: float, burst_at: float = burst_at) -> int:
            grown = rate * max(0.0, t - burst_at)
            return min(capacity, int(capacity * start_percent / 100 + grown))

        peak, t = GrowthPeak(), 0.0
        while t < 600.0:
            used = used_at(t)
            usage = FilesystemUsage("/data", "/dev/x", capacity, used, capacity - used)
            if usage.above(limits.limit_percent):
                break  # crossed while the daemon looks at the pace of the appends
            peak.observe(t, used)
            quiet = not stand(usage.after_writing(margin(usage, peak)), limits, 0).over
            if quiet and used_at(t + REACH_S) > capacity * limits.limit_percent / 100:
                late.append(t)
            t += POLL_S if quiet else PACE_S
    return late


def test_a_fast_writer_on_a_small_disk_is_never_crossing_while_the_daemon_is_quiet() -> None:
    # 1 % of 4 GiB is 41 MiB: less than a second of writing at 60 MiB/s.
    assert _late_crossings(_floor_only, 4 * GiB, 60 * MiB), "the floor alone should fall short"
    assert _late_crossings(_with_peak, 4 * GiB, 60 * MiB) == []
    # Faster still, on a smaller disk, from further away: a burst out of nothing is seen a
    # poll after it began, so only one that starts within two polls of the limit is left to
    # the floor.
    assert _late_crossings(_with_peak, 1 * GiB, 200 * MiB, start_percent=20.0) == []


def test_where_one_percent_is_seconds_of_writing_the_floor_decides() -> None:
    # 1 % of 1 TiB at 60 MiB/s is almost three minutes: the growth adds nothing.
    assert _late_crossings(_floor_only, 1024 * GiB, 60 * MiB, start_percent=68.5) == []
    usage = FilesystemUsage("/data", "/dev/x", 1024 * GiB, 700 * GiB, 324 * GiB)
    assert quiet_margin_bytes(usage, 60 * MiB, REACH_S) == quiet_margin_bytes(usage)


def test_the_margin_is_the_growth_over_the_reach_or_one_percent() -> None:
    usage = FilesystemUsage("/data", "/dev/x", 4 * GiB, 1 * GiB, 3 * GiB)
    assert quiet_margin_bytes(usage) == int(0.01 * 4 * GiB)
    assert quiet_margin_bytes(usage, 60 * MiB, 1.5) == 90 * MiB
    assert quiet_margin_bytes(usage, -60 * MiB, 1.5) == quiet_margin_bytes(usage)


def test_a_burst_counts_at_once_and_for_minutes() -> None:
    peak = GrowthPeak(step_s=1.0, keep_s=300.0)
    for t in range(60):
        peak.observe(float(t), 1 * GiB)
    assert peak.rate() == 0.0
    # Two seconds at 50 MiB/s: the fastest step is the rate, before any sustained window.
    for t, used in ((60.0, 1 * GiB + 50 * MiB), (61.0, 1 * GiB + 100 * MiB)):
        peak.observe(t, used)
    assert peak.rate() == 50 * MiB
    # The step under way counts at once too, over a whole step at least.
    peak.observe(61.25, 1 * GiB + 120 * MiB)
    assert peak.rate() == 50 * MiB
    peak.observe(61.5, 1 * GiB + 200 * MiB)
    assert peak.rate() == 100 * MiB
    # A deletion meanwhile hides nothing of what was written.
    peak.observe(62.0, 1 * GiB)
    peak.observe(62.1, 1 * GiB + 30 * MiB)
    assert peak.rate() >= 100 * MiB
    # Quiet again: the burst is remembered for keep_s, then forgotten.
    for t in range(63, 362):
        peak.observe(float(t), 1 * GiB + 30 * MiB)
    assert peak.rate() >= 100 * MiB
    for t in range(362, 370):
        peak.observe(float(t), 1 * GiB + 30 * MiB)
    assert peak.rate() == 0.0
