"""The broker-mode forecast: growth rate, reclaim latency, and the planner's predictive rule.

The last test closes the loop in simulation: the real planner, growth estimator and reclaim
model against a broker that frees DeleteRecords'd segments only at fixed-rate retention
checks plus a delete delay, as measured on Kafka 2.2. The same loop runs against processes
in tests/test_broker_reclaim_e2e.py and bench/bench_broker_reclaim.py.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir, Partition, SegmentInfo
from diskguard.retention.limits import Limits, stand, with_forecast
from diskguard.retention.planner import Deletion, plan_filesystem
from diskguard.retention.reclaim import GrowthEstimator, ReclaimModel, ReclaimSettings
from diskguard.retention.reclaimwatch import ReclaimWatch, reclaim_settings, settings_from_values

MiB = 1024**2


# -- growth --------------------------------------------------------------------------------
def test_growth_rate_ignores_drops_from_deletions() -> None:
    g = GrowthEstimator(window_s=30.0)
    used = 100 * MiB
    for i in range(41):  # 10 s at 4 MiB/s, sampled every 0.25 s
        if i == 20:
            used -= 50 * MiB  # the broker frees 50 MiB mid-window
        g.observe(i * 0.25, used)
        used += MiB
    rate = g.rate()
    assert rate is not None
    # 40 increments of 1 MiB over 10 s, one of them hidden in the drop's sample.
    assert 3.8 * MiB <= rate <= 4.0 * MiB


def test_growth_rate_needs_history_and_forgets_old_samples() -> None:
    g = GrowthEstimator(window_s=10.0, min_span_s=2.0)
    g.observe(0.0, 0)
    g.observe(1.0, MiB)
    assert g.rate() is None  # 1 s of history is not a rate
    for t in range(2, 60):
        g.observe(float(t), MiB if t < 30 else MiB + (t - 30) * 2 * MiB)
    rate = g.rate()
    assert rate is not None and rate == pytest.approx(2 * MiB, rel=0.01)  # old idle time gone


def test_growth_rate_drops_repeated_or_backward_times() -> None:
    g = GrowthEstimator()
    g.observe(5.0, 0)
    g.observe(5.0, 10 * MiB)
    g.observe(4.0, 20 * MiB)
    g.observe(8.0, 3 * MiB)
    assert g.rate() == pytest.approx(1 * MiB)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.001, 5.0), st.integers(-(10**9), 10**9)), min_size=1, max_size=120
    ),
    st.floats(1.0, 30.0),
)
def test_growth_rate_kept_as_a_running_sum_equals_the_sum_over_the_window(
    steps: list[tuple[float, int]], window_s: float
) -> None:
    """``rate`` is O(1) (the loop asks at every wake-up); it must equal the plain sum of the
    window's increases after every sample, as samples enter and leave the window."""
    g = GrowthEstimator(window_s=window_s, min_span_s=0.0)
    kept: list[tuple[float, int]] = []
    t, used = 0.0, 10**10
    for dt, delta in steps:
        t, used = t + dt, max(0, used + delta)
        g.observe(t, used)
        kept.append((t, used))
        while len(kept) > 2 and t - kept[1][0] >= window_s:
            kept.pop(0)
        if len(kept) < 2:
            assert g.rate() is None
            continue
        grown = sum(max(0, b[1] - a[1]) for a, b in itertools.pairwise(kept))
        assert g.rate() == grown / (kept[-1][0] - kept[0][0])


# -- reclaim latency ----------------------------------------------------------------------
def test_latency_is_worst_case_until_a_check_is_seen_then_follows_the_phase() -> None:
    model = ReclaimModel(ReclaimSettings(check_interval_s=15.0, delete_delay_s=0.5))
    assert model.latency_at(100.0) == (15.5, "settings")
    model.observe_check(103.0)  # checks at 103, 118, 133, ...
    assert model.latency_at(110.0) == (8.5, "measured")
    assert model.latency_at(117.8) == pytest.approx((15.5 + 0.2, "measured"))  # the one after
    assert model.near_check(117.1) and model.near_check(118.9) and not model.near_check(119.1)
    assert model.latency_at(200.0)[0] == pytest.approx(208.0 - 200.0 + 0.5)


def test_measured_latencies_per_mount() -> None:
    model = ReclaimModel(ReclaimSettings())
    for v in (3.0, 1.0, 2.0, 10.0):
        model.observe_latency("/a", v)
    model.observe_latency("/b", float("nan"))
    assert model.observed("/a") == (2.0, 10.0, 4)
    assert model.observed("/b") == (None, None, 0)


def _deletion(path: str, mount: str = "/data") -> Deletion:
    return Deletion("/data/k", "t", 0, 0, 10, 1, MiB, (f"{path}.log", f"{path}.index"), mount)


def test_watch_times_our_segments_from_inotify_events() -> None:
    watch = ReclaimWatch(ReclaimSettings(check_interval_s=10.0, delete_delay_s=1.0))
    watch.requested([_deletion("/data/k/t-0/0")], t=100.0)
    # Someone else's segment renamed: not a check we can date.
    watch.on_event("moved", "/data/k/u-0/0.log", "/data/k/u-0/0.log.deleted", 101.0)
    assert watch.model.last_check_t is None
    watch.on_event("moved", "/data/k/t-0/0.log", "/data/k/t-0/0.log.deleted", 104.0)
    assert watch.model.last_check_t == 104.0
    watch.on_event("deleted", "/data/k/t-0/0.log.deleted", "", 105.0)
    assert watch.model.observed("/data") == (5.0, 5.0, 1)
    assert watch.outstanding() == 0


def test_watch_scan_fallback_measures_without_inotify() -> None:
    watch = ReclaimWatch(ReclaimSettings())
    watch.requested([_deletion("/x/t-0/0")], t=10.0)
    files = {"/x/t-0/0.log"}
    watch.check(12.0, exists=files.__contains__)
    assert watch.outstanding() == 1
    files = {"/x/t-0/0.log.deleted"}
    watch.check(13.0, exists=files.__contains__)
    assert watch.model.last_check_t is None  # a rename seen late does not date a check
    watch.check(20.0, exists=set().__contains__)
    assert watch.model.observed("/data") == (10.0, 10.0, 1)


def test_settings_from_broker_else_properties_else_defaults(tmp_path: object) -> None:
    from pathlib import Path

    from diskguard.config import parse_config

    root = Path(str(tmp_path))
    (root / "logs").mkdir()
    props = root / "server.properties"
    props.write_text(
        f"log.dirs={root / 'logs'}\nlog.retention.check.interval.ms=15000\n"
        "log.segment.delete.delay.ms=500\n"
    )
    config = parse_config({"broker": {"server_properties": str(props)}}, root / "c.toml")
    s = reclaim_settings(config)
    assert (s.check_interval_s, s.delete_delay_s, s.source) == (15.0, 0.5, str(props))
    s = reclaim_settings(config, lambda: {"log.retention.check.interval.ms": "1000"})
    assert (s.check_interval_s, s.delete_delay_s, s.source) == (1.0, 60.0, "broker")
    s = reclaim_settings(config, lambda: None)  # broker did not answer
    assert s.source == str(props)
    assert settings_from_values({"x": "1"}, "broker") is None
    assert settings_from_values({"log.segment.delete.delay.ms": "junk"}, "b") is None


# -- the predictive rule ------------------------------------------------------------------
def _fs(used: int, capacity: int = 1000 * MiB, pending: int = 0) -> Filesystem:
    usage = FilesystemUsage("/data", "/dev/x", capacity, used, capacity - used)
    return Filesystem(usage, (LogDir("/data/k", "/data", (), pending),))


def over_ceiling(usage: FilesystemUsage, limits: Limits, pending: int) -> tuple[bool, bool]:
    standing = stand(usage, limits, pending)
    return standing.over, standing.predicted_only


def test_prediction_triggers_below_the_ceiling_and_counts_pending_once() -> None:
    base = Limits(70.0, 70.0)
    fc = Limits(
        70.0, 70.0, growth_bytes_per_s=4 * MiB, reclaim_latency_s=10.0, reclaim_period_s=15.0
    )
    fs = _fs(600 * MiB)
    usage = fs.usage
    assert over_ceiling(usage, base, 0) == (False, False)
    # 600 + 40 (until freed) + 60 (next period) = 700: exactly at the ceiling, not over.
    assert over_ceiling(usage, fc, 0) == (False, True)
    assert over_ceiling(usage, fc, 0) == over_ceiling(usage, fc, 0)
    usage2 = _fs(601 * MiB).usage
    assert over_ceiling(usage2, fc, 0) == (True, True)
    assert over_ceiling(usage2, fc, 2 * MiB) == (False, True)  # already asked for: no more
    assert over_ceiling(_fs(701 * MiB).usage, base, 0) == (True, False)


def _plan(used: int, limits: Limits, pending: int = 0) -> int:
    parts = (Partition("/data/k", "t", 0, "/data/k/t-0", tuple(range(0, 2000, 10))),)
    usage = FilesystemUsage("/data", "/dev/x", 1000 * MiB, used, 1000 * MiB - used)
    fs = Filesystem(usage, (LogDir("/data/k", "/data", parts, pending),))

    def read(p: Partition, base: int) -> SegmentInfo:
        return SegmentInfo(MiB, base, "timeindex", (f"{p.path}/{base:020d}.log",))

    fs_plan, chosen = plan_filesystem(fs, limits, read)
    assert fs_plan.chosen_bytes == len(chosen) * MiB
    return fs_plan.excess_bytes


def test_predicted_excess_brings_reclaim_time_usage_to_the_goal() -> None:
    fc = Limits(
        70.0, 55.0, growth_bytes_per_s=4 * MiB, reclaim_latency_s=10.0, reclaim_period_s=15.0
    )
    # goal = min(550, 700 - 60) = 550; at reclaim: 620 + 40 - 0 = 660 -> excess 110.
    assert _plan(620 * MiB, fc) == 110 * MiB
    # Pending reclaim counts as freed exactly once.
    assert _plan(620 * MiB, fc, pending=30 * MiB) == 0  # 620+40-30+60 = 690: not over
    assert _plan(650 * MiB, fc, pending=30 * MiB) == 110 * MiB
    # Target = ceiling: the goal is what leaves room for a period of growth (640).
    same = Limits(
        70.0, 70.0, growth_bytes_per_s=4 * MiB, reclaim_latency_s=10.0, reclaim_period_s=15.0
    )
    assert _plan(620 * MiB, same) == 20 * MiB
    # No forecast (offline, or no rate yet): plain KIP-61.
    assert _plan(620 * MiB, Limits(70.0, 55.0)) == 0
    assert _plan(720 * MiB, Limits(70.0, 55.0)) == 170 * MiB


def test_leader_preference_among_equal_candidates() -> None:
    parts = (
        Partition("/data/k", "a", 0, "/data/k/a-0", (0, 10, 20)),
        Partition("/data/k", "b", 0, "/data/k/b-0", (0, 10, 20)),
    )
    usage = FilesystemUsage("/data", "/dev/x", 100 * MiB, 95 * MiB, 5 * MiB)
    fs = Filesystem(usage, (LogDir("/data/k", "/data", parts, 0),))

    def read(p: Partition, base: int) -> SegmentInfo:
        return SegmentInfo(MiB, 1000 + base, "timeindex", (f"{p.path}/{base:020d}.log",))

    _, chosen = plan_filesystem(fs, Limits(90.0, 90.0), read, led_here={("b", 0)})
    assert [(d.topic, d.base_offset) for d in chosen][:2] == [("b", 0), ("a", 0)]
    _, chosen = plan_filesystem(fs, Limits(90.0, 90.0), read)
    assert [(d.topic, d.base_offset) for d in chosen][:2] == [("a", 0), ("b", 0)]


# -- closed loop, simulated -------------------------------------------------------------------
@dataclass
class _SimBroker:
    """Kafka's log manager as measured: writes roll segments; DeleteRecords'd segments are
    freed at fixed-rate retention checks (first ``first_check`` s after start) + a delay."""

    capacity: int
    rate: int
    segment: int
    period: float
    delay: float
    first_check: float
    used: int = 0
    active: int = 0
    closed: list[int] = field(default_factory=list)  # base offsets (one per segment)
    next_base: int = 0
    log_start: int = 0
    renamed: list[tuple[float, list[int]]] = field(default_factory=list)
    checks: list[float] = field(default_factory=list)

    def advance(self, t: float, dt: float) -> None:
        grow = int(self.rate * dt)
        self.used += grow
        self.active += grow
        while self.active >= self.segment:
            self.active -= self.segment
            self.closed.append(self.next_base)
            self.next_base += 1
        k = (t - self.first_check) / self.period
        if k >= 0 and abs(k - round(k)) * self.period < dt / 2:
            gone = [b for b in self.closed if b + 1 <= self.log_start]
            self.closed = [b for b in self.closed if b + 1 > self.log_start]
            if gone:
                self.renamed.append((t, gone))
                self.checks.append(t)
        for when, bases in list(self.renamed):
            if t >= when + self.delay:
                self.used -= len(bases) * self.segment
                self.renamed.remove((when, bases))

    def pending(self) -> int:
        waiting = sum(1 for b in self.closed if b + 1 <= self.log_start)
        return (waiting + sum(len(b) for _, b in self.renamed)) * self.segment


def _simulate(period: float, rate: int, ceiling: float, target: float, seconds: float) -> dict:
    capacity = 384 * MiB
    broker = _SimBroker(
        capacity, rate, 1 * MiB, period, delay=0.5, first_check=7.0, used=int(capacity * 0.3)
    )
    model = ReclaimModel(ReclaimSettings(period, 0.5, "sim"))
    growth = GrowthEstimator()
    dt = 0.25
    t = 0.0
    peak, trough, over_s, peak_all = 0.0, 100.0, 0.0, 0.0
    first_ask: float | None = None
    seen_checks = 0
    while t < seconds:
        broker.advance(t, dt)
        if len(broker.checks) > seen_checks:  # inotify: our segments renamed at a check
            seen_checks = len(broker.checks)
            model.observe_check(broker.checks[-1])
        growth.observe(t, broker.used)
        forecast = model.forecast(t, growth.rate())
        usage = FilesystemUsage("/d", "/dev/x", capacity, broker.used, capacity - broker.used)
        bases = (*[b for b in broker.closed if b + 1 > broker.log_start], broker.next_base)
        part = Partition("/d/k", "t", 0, "/d/k/t-0", tuple(bases))
        fs = Filesystem(usage, (LogDir("/d/k", "/d", (part,), broker.pending()),))

        def read(p: Partition, base: int) -> SegmentInfo:
            return SegmentInfo(MiB, base, "timeindex", ())

        _plan, chosen = plan_filesystem(fs, with_forecast(Limits(ceiling, target), forecast), read)
        if chosen:
            broker.log_start = max(broker.log_start, max(d.next_offset for d in chosen))
            first_ask = t if first_ask is None else first_ask
        pct = usage.usage_percent
        peak_all = max(peak_all, pct)
        if first_ask is not None and t > first_ask + 2 * period:  # one check seen since
            peak, trough = max(peak, pct), min(trough, pct)
            peak, trough = max(peak, pct), min(trough, pct)
        over_s += dt if pct > ceiling else 0.0
        t += dt
    return {"peak": peak, "trough": trough, "over_s": over_s, "peak_all": peak_all}


@pytest.mark.parametrize(
    ("period", "rate", "target"),
    [(15.0, 4 * MiB, 52.0), (1.0, 8 * MiB, 65.0), (30.0, 2 * MiB, 50.0)],
)
def test_simulated_broker_holds_the_ceiling_without_over_deleting(
    period: float, rate: int, target: float
) -> None:
    result = _simulate(period, rate, ceiling=70.0, target=target, seconds=12 * period + 40)
    assert result["peak_all"] <= 71.0, result  # from the start, before any check was seen
    assert result["over_s"] <= 1.0, result
    assert result["trough"] >= target - 3.0, result
