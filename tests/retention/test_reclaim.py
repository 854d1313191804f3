"""The broker-mode forecast: growth rate, reclaim latency, and the planner's predictive rule.

The last test closes the loop in simulation: the real planner, growth estimator and reclaim
model against a broker that frees DeleteRecords'd segments only at fixed-rate retention
checks plus a delete delay, as measured on Kafka 2.2. The same loop runs against processes
in tests/test_broker_reclaim_e2e.py and bench/bench_broker_reclaim.py.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diskguard.config import load_config
from diskguard.kafkalog.model import Filesystem, FilesystemUsage, LogDir, Partition, SegmentInfo
from diskguard.retention.forecaster import Forecaster
from diskguard.retention.limits import Limits, stand, with_forecast
from diskguard.retention.planner import Deletion, plan_filesystem
from diskguard.retention.reclaim import (
    PARTIAL_RATE_WINDOW_S,
    SEND_LEAD_S,
    Forecast,
    GrowthEstimator,
    ReclaimModel,
    ReclaimSettings,
)
from diskguard.retention.reclaimwatch import ReclaimWatch, reclaim_settings, settings_from_values
from support.configs import write_config

MiB = 1024**2


# -- growth --------------------------------------------------------------------------------
def _feed(g: GrowthEstimator, used_at: Callable[[float], float], until: float, t0: float = 0.0):
    """Samples every 0.25 s from ``t0`` to ``until``; yields (t, rate) after each."""
    t = t0
    while t <= until + 1e-9:
        g.observe(t, int(used_at(t)))
        yield t, g.rate()
        t += 0.25


def test_growth_rate_ignores_drops_from_deletions() -> None:
    g = GrowthEstimator(window_s=10.0)
    used = 100 * MiB
    for i in range(41):  # 10 s at 4 MiB/s, sampled every 0.25 s
        if i == 20:
            used -= 50 * MiB  # the broker frees 50 MiB mid-window
        g.observe(i * 0.25, used)
        used += MiB
    rate = g.rate()
    assert rate is not None
    # 40 increments of 1 MiB over 10 s, one of them hidden in the drop's sample: the part
    # holding it grew by one MiB less.
    assert 3.5 * MiB <= rate <= 4.0 * MiB


def test_growth_rate_needs_a_whole_window_and_forgets_old_samples() -> None:
    g = GrowthEstimator(window_s=9.0)
    g.observe(0.0, 0)
    g.observe(8.0, MiB)
    assert g.rate() is None  # 8 s of history is not a 9 s rate
    for t in range(10, 60):
        g.observe(float(t), MiB if t < 30 else MiB + (t - 30) * 2 * MiB)
    rate = g.rate()
    assert rate is not None and rate == pytest.approx(2 * MiB, rel=0.01)  # old idle time gone


def test_growth_rate_drops_repeated_or_backward_times() -> None:
    g = GrowthEstimator(window_s=3.0)
    g.observe(5.0, 0)
    g.observe(5.0, 10 * MiB)
    g.observe(4.0, 20 * MiB)
    for t in (6.0, 7.0, 8.0):
        g.observe(t, int((t - 5.0) * MiB))
    assert g.rate() == pytest.approx(1 * MiB)


def test_a_one_off_write_is_not_a_rate() -> None:
    """60 MiB at once and nothing after: no rate at any moment, however the window falls
    (it was read as 1 MiB/s for a minute, and the forecast deleted for growth that never
    came)."""
    g = GrowthEstimator(window_s=60.0)
    rates = [r for _t, r in _feed(g, lambda t: 100 * MiB + (60 * MiB if t >= 70 else 0), 200)]
    assert all(not r for r in rates), max(r or 0 for r in rates)


def test_a_rate_over_a_window_needs_the_whole_window() -> None:
    """Right after a start (or a reload) seconds of history must not stand for the minutes a
    forecast predicts (a step 2 s after start was read ~10x larger than over a minute): a
    rate over 30.5 s needs 30.5 s of samples (``rate_up_to`` says over how long it has one)."""
    g = GrowthEstimator(window_s=30.5)

    def used(t: float) -> float:
        return 100 * MiB + (60 * MiB if t >= 2 else 0) + 4 * MiB * t

    for t, rate in _feed(g, used, 40.0):
        if t < 30.5:
            assert rate is None, (t, rate)
        else:  # the step is no part of it; the steady 4 MiB/s is
            assert rate == pytest.approx(4 * MiB, rel=0.05), (t, rate)


def test_the_rate_of_a_writer_that_stops_fades_within_a_third_of_the_window() -> None:
    g = GrowthEstimator(window_s=30.0)
    rates = dict(_feed(g, lambda t: 4 * MiB * min(t, 60.0), 90.0))
    assert rates[59.0] == pytest.approx(4 * MiB, rel=0.05)
    assert 0 < rates[65.0] < 4 * MiB
    assert rates[70.25] == 0


def test_a_jittery_steady_writer_is_read_at_its_typical_rate_not_its_slowest() -> None:
    """3.8, 4.2 and 4.0 MiB/s over the three parts: 4.0, as the ceiling needs (the slowest
    part alone, 3.8, left the real 4.x broker 0.66 points over its ceiling each period)."""
    g = GrowthEstimator(window_s=30.0)
    speeds = [3.8, 4.2, 4.0]

    def used(t: float) -> float:
        done = sum(speeds[: min(3, int(t // 10))]) * 10 * MiB
        return done + speeds[min(2, int(t // 10))] * (t % 10) * MiB if t < 30 else done

    rates = dict(_feed(g, used, 30.0))
    assert rates[30.0] == pytest.approx(4.0 * MiB, rel=0.01)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.001, 5.0), st.integers(-(10**9), 10**9)), min_size=1, max_size=120
    ),
    st.floats(1.0, 30.0),
)
def test_growth_rate_is_the_sustained_part_of_the_window_from_the_samples(
    steps: list[tuple[float, int]], window_s: float
) -> None:
    """``rate`` keeps merged samples and bisects them; it must equal the plain computation
    over every sample: the growth of the window's three parts (growth of a sample counted at
    its time), the middle one's but at most twice the least and the mean, per second of a
    part."""
    g = GrowthEstimator(window_s=window_s, resolution_s=0.0)
    kept: list[tuple[float, int]] = []
    t, used = 0.0, 10**10
    for dt, delta in steps:
        t, used = t + dt, max(0, used + delta)
        g.observe(t, used)
        kept.append((t, used))
        if t - kept[0][0] < window_s:
            assert g.rate() is None
            continue
        grown = [0] + [max(0, b[1] - a[1]) for a, b in itertools.pairwise(kept)]
        cumulative = list(itertools.accumulate(grown))

        def by(x: float, cumulative: list[int] = cumulative) -> int:
            # The window's start may fall a rounding error before the first sample.
            found = (c for (ts, _u), c in zip(kept, cumulative, strict=True) if ts <= x)
            return max(found, default=cumulative[0])

        part = window_s / 3
        low, mid, high = sorted(
            by(t - window_s + (i + 1) * part) - by(t - window_s + i * part) for i in range(3)
        )
        expected = min(mid, 2 * low, (low + mid + high) / 3) / part
        assert g.rate() == pytest.approx(expected, rel=1e-9, abs=1e-6)


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
    # goal = min(550, 700 - 60) = 550; at reclaim: 620 + 40 - 0 = 660 -> 110 to the goal,
    # but the forecast alone (620 is under the ceiling) may delete only the growth it
    # forecasts: 40 + 60 = 100.
    assert _plan(620 * MiB, fc) == 100 * MiB
    # Pending reclaim counts as freed exactly once.
    assert _plan(620 * MiB, fc, pending=30 * MiB) == 0  # 620+40-30+60 = 690: not over
    assert _plan(650 * MiB, fc, pending=30 * MiB) == 100 * MiB
    # Over the ceiling today: KIP-61 down to the goal, the growth until reclaim included.
    assert _plan(710 * MiB, fc, pending=30 * MiB) == 170 * MiB
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

    def write(self, grow: int) -> None:
        self.used += grow
        self.active += grow
        while self.active >= self.segment:
            self.active -= self.segment
            self.closed.append(self.next_base)
            self.next_base += 1

    def advance(self, t: float, dt: float) -> None:
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


@dataclass
class _Run:
    """What a simulated run saw: usage percent per step, bytes asked, from ``first_ask``."""

    usage: list[tuple[float, float]]
    asked_bytes: int
    first_ask: float | None
    ceiling: float

    def peak(self, after: float = 0.0) -> float:
        return max(p for t, p in self.usage if t >= after)

    def trough(self, after: float) -> float:
        return min(p for t, p in self.usage if t >= after)

    @property
    def over_s(self) -> float:
        return sum(0.25 for _t, p in self.usage if p > self.ceiling)


def _simulate(
    period: float,
    writes: Callable[[float, float], int],
    ceiling: float,
    target: float,
    seconds: float,
    start_percent: float = 30.0,
    first_check: float = 7.0,
    capacity: int = 384 * MiB,
    delay: float = 0.5,
) -> _Run:
    """The real planner, growth estimator and reclaim model against ``_SimBroker``, sampled
    every 0.25 s, forecasting as ``Forecaster.forecast`` does; ``writes(t, dt)``: bytes the
    producers write in ``[t, t + dt)``. Pre-filled data is one closed segment per MiB."""
    broker = _SimBroker(capacity, 1 * MiB, period, delay=delay, first_check=first_check)
    broker.write(int(capacity * start_percent / 100))
    model = ReclaimModel(ReclaimSettings(period, delay, "sim"))
    growth = GrowthEstimator(window_s=model.rate_window_s)
    dt = 0.25
    t = 0.0
    run = _Run([], 0, None, ceiling)
    seen_checks = 0
    while t < seconds:
        broker.write(writes(t, dt))
        broker.advance(t, dt)
        if len(broker.checks) > seen_checks:  # inotify: our segments renamed at a check
            seen_checks = len(broker.checks)
            model.observe_check(broker.checks[-1])
        growth.observe(t, broker.used)
        window = model.rate_window_s
        measured = growth.rate_up_to(window, min(window, PARTIAL_RATE_WINDOW_S))
        forecast = model.forecast(t, *measured) if measured else model.forecast(t, None)
        usage = FilesystemUsage("/d", "/dev/x", capacity, broker.used, capacity - broker.used)
        bases = (*[b for b in broker.closed if b + 1 > broker.log_start], broker.next_base)
        part = Partition("/d/k", "t", 0, "/d/k/t-0", tuple(bases))
        fs = Filesystem(usage, (LogDir("/d/k", "/d", (part,), broker.pending()),))

        def read(p: Partition, base: int) -> SegmentInfo:
            return SegmentInfo(MiB, base, "timeindex", ())

        _plan, chosen = plan_filesystem(fs, with_forecast(Limits(ceiling, target), forecast), read)
        if chosen:
            broker.log_start = max(broker.log_start, max(d.next_offset for d in chosen))
            model.observe_request(t)  # accepted: the broker executor tells the watch
            run.asked_bytes += sum(d.bytes for d in chosen)
            run.first_ask = t if run.first_ask is None else run.first_ask
        run.usage.append((t, usage.usage_percent))
        t += dt
    return run


def steady(rate: float, stop: float = float("inf")) -> Callable[[float, float], int]:
    return lambda t, dt: int(rate * dt) if t < stop else 0


@pytest.mark.parametrize(
    ("period", "rate", "target"),
    [(15.0, 4 * MiB, 52.0), (1.0, 8 * MiB, 65.0), (30.0, 2 * MiB, 50.0)],
)
def test_simulated_broker_holds_the_ceiling_without_over_deleting(
    period: float, rate: int, target: float
) -> None:
    run = _simulate(period, steady(rate), ceiling=70.0, target=target, seconds=12 * period + 40)
    result = {"peak_all": run.peak(), "over_s": run.over_s}
    assert result["peak_all"] <= 71.0, result  # from the start, before any check was seen
    assert result["over_s"] <= 1.0, result
    assert run.first_ask is not None
    # Once a check has been seen, usage stays between the target and the ceiling.
    assert run.trough(run.first_ask + 2 * period) >= target - 3.0, result


def test_a_writer_that_stops_costs_at_most_one_margin_of_growth() -> None:
    """A steady 4 MiB/s writer that stops: a forecast's requests are sent in the last seconds
    before the check that reclaims them, so the last one predicted only those seconds of
    growth. Sent a whole period ahead, usage fell to 37 % under a 65 % target: the growth of
    a period that never came was deleted too."""
    period, rate, ceiling, target, stop = 15.0, 4 * MiB, 70.0, 65.0, 100.0
    run = _simulate(period, steady(rate, stop), ceiling, target, seconds=stop + 4 * period)
    capacity = 384 * MiB
    # The goal a steady writer needs (a period's growth under the ceiling), less the growth
    # of one margin: the send lead and the check margins, the delete delay, a segment.
    goal = min(target, ceiling - 100 * rate * period / capacity)
    margin_s = SEND_LEAD_S + 2 * 0.5 + 0.5
    bound = goal - 100 * (rate * margin_s + MiB) / capacity
    assert run.peak() <= ceiling + 0.5
    assert run.trough(stop) >= bound, (run.trough(stop), bound)


@pytest.mark.parametrize(
    ("at", "lasting"),
    [(70.0, 0.25), (2.0, 0.25), (2.0, 8.0), (70.0, 15.0)],
    ids=["running-a-while", "right-after-start", "slowly-after-start", "slowly-later"],
)
def test_a_one_off_write_under_the_ceiling_deletes_nothing(at: float, lasting: float) -> None:
    """60 MiB written in ``lasting`` seconds leaves the disk under its ceiling and nothing
    grows after: nothing may go. It was read as 1 MiB/s for a minute and trimmed every closed
    segment it could (with a 30 s check), and right after a start as ~10x that. Written over
    8 s on a busy machine, right after a start, a 10 s window saw it in all three parts and
    called it a rate (38.6 MB went beside a real 4.4 broker): less than a whole window is
    a rate only from 30 s on."""
    period = 30.0

    def once(t: float, dt: float) -> int:
        return int(60 * MiB * dt / lasting) if at <= t < at + lasting else 0

    run = _simulate(period, once, ceiling=55.0, target=50.0, seconds=at + 4 * period)
    assert run.peak() < 55.0
    assert run.asked_bytes == 0, (run.asked_bytes / MiB, run.first_ask)


def test_a_step_on_top_of_a_steady_writer_is_no_part_of_its_rate() -> None:
    """The forecast follows the steady writer, not the step: it holds the ceiling and does
    not trim toward the target for the step's sake."""
    period, rate = 15.0, 2 * MiB

    def writes(t: float, dt: float) -> int:
        return steady(rate)(t, dt) + (40 * MiB if 60.0 <= t < 60.0 + dt else 0)

    run = _simulate(period, writes, ceiling=70.0, target=40.0, seconds=200.0, start_percent=20)
    assert run.peak() <= 70.5
    capacity = 384 * MiB
    goal = 70.0 - 100 * rate * period / capacity
    assert run.first_ask is not None
    margin_s = SEND_LEAD_S + 2 * 0.5 + 0.5
    assert (
        run.trough(run.first_ask + 2 * period)
        >= goal - 100 * (rate * (margin_s + period) + MiB) / capacity
    )


def test_before_the_phase_is_known_requests_count_on_the_check_the_first_one_awaits() -> None:
    """The first forecast comes right after a check of unknown phase, so it assumes the worst
    (a whole period and the delay). The requests after it, until that check renames its
    segments, feed the same check: they must not each assume a whole period more, or the
    disk is emptied by a period's growth once it comes (the writer goes on here)."""
    period, rate = 60.0, 1 * MiB
    run = _simulate(
        period,
        steady(rate),
        ceiling=70.0,
        target=65.0,
        seconds=400.0,
        start_percent=10.0,
        first_check=115.0,
    )
    # Right after the first check (which had nothing of ours to rename): phase unknown.
    assert run.first_ask is not None and 115 <= run.first_ask < 125
    capacity = 384 * MiB
    goal = min(65.0, 70.0 - 100 * rate * period / capacity)
    # The first request's own guess (its check came 54 s, not 60.5 s, after it), a segment.
    bound = goal - 100 * (rate * (period + 0.5 - 54.0) + MiB) / capacity
    reclaimed = 115.0 + period + 0.5  # the first request's check, and the delete delay
    assert run.trough(reclaimed) >= bound, (run.trough(reclaimed), bound)
    assert run.peak() <= 70.5


def test_latency_before_the_phase_is_known_ends_at_the_check_a_waiting_request_awaits() -> None:
    model = ReclaimModel(ReclaimSettings(check_interval_s=300.0, delete_delay_s=60.0))
    assert model.latency_at(100.0) == (360.0, "settings")
    model.observe_request(100.0)
    model.observe_request(120.0)  # the oldest waiting request is what bounds the check
    assert model.latency_at(150.0) == pytest.approx(
        (100.0 + 300.0 + 0.5 - 150.0 + 60.0, "settings")
    )
    # Past the check it awaited, its rename was missed (or it ran late): the worst again.
    assert model.latency_at(401.0) == (360.0, "settings")
    model.observe_renamed_unseen()  # a scan found it renamed: a check ran, when is unknown
    assert model.latency_at(150.0) == (360.0, "settings")
    model.observe_request(200.0)
    model.observe_check(380.0)
    assert model.latency_at(390.0) == (290.0 + 60.0, "measured")
    assert model.unseen_since is None


def test_the_watch_tells_the_model_of_requests_and_of_renames_seen_late() -> None:
    watch = ReclaimWatch(ReclaimSettings(check_interval_s=10.0, delete_delay_s=1.0))
    watch.requested([_deletion("/x/t-0/0")], t=10.0)
    assert watch.model.unseen_since == 10.0
    files = {"/x/t-0/0.log.deleted"}
    watch.check(13.0, exists=files.__contains__)
    assert watch.model.unseen_since is None
    watch.requested([_deletion("/x/t-0/1")], t=14.0)
    files = {"/x/t-0/0.log.deleted", "/x/t-0/1.log"}
    watch.check(15.0, exists=files.__contains__)  # the old rename again: nothing new
    assert watch.model.unseen_since == 14.0
    watch.check(16.0, exists=set().__contains__)  # both gone, the new one's rename unseen
    assert watch.model.unseen_since is None


def test_kafkas_defaults_from_a_cold_start_hold_the_ceiling() -> None:
    """300 s checks and a 60 s delay: a forecast needs 660 s to see all it predicts. Until the
    daemon has seen that much it looks as far ahead as it has looked back, which is enough:
    waiting for the whole window, a steady 0.9 MiB/s took the disk to ~90 % first."""
    run = _simulate(
        300.0,
        steady(0.9 * MiB),
        ceiling=70.0,
        target=60.0,
        seconds=1320.0,
        start_percent=3.0,
        first_check=25.0,
        capacity=1024 * MiB,
        delay=60.0,
    )
    assert run.peak() <= 70.5, run.peak()


def test_a_forecast_looks_no_further_ahead_than_its_rate_was_measured() -> None:
    usage = FilesystemUsage("/d", "/dev/x", 1000 * MiB, 500 * MiB, 500 * MiB)

    def limits(horizon: float) -> Limits:
        fc = Forecast(MiB, latency_s=30.0, period_s=15.0, latency_source="settings")
        return with_forecast(Limits(70.0, 60.0), replace(fc, horizon_s=horizon))

    assert (limits(20.0).growth_bytes, limits(20.0).period_growth_bytes) == (20 * MiB, 0)
    assert (limits(40.0).growth_bytes, limits(40.0).period_growth_bytes) == (30 * MiB, 10 * MiB)
    assert (limits(60.0).growth_bytes, limits(60.0).period_growth_bytes) == (30 * MiB, 15 * MiB)
    assert stand(usage, limits(20.0), 0).predicted_used_bytes == 520 * MiB
    g = GrowthEstimator(window_s=60.0)
    assert g.rate_up_to(60.0) is None
    for i in range(81):  # 20 s at 1 MiB/s
        g.observe(i * 0.25, int(i * 0.25 * MiB))
    rate, window = g.rate_up_to(60.0) or (0.0, 0.0)
    assert window == 20.0 and rate == pytest.approx(MiB, rel=0.05)


# -- the forecast waits for the last seconds before its check -------------------------------
def test_a_forecast_is_sent_in_the_last_seconds_before_the_check_it_feeds() -> None:
    model = ReclaimModel(ReclaimSettings(check_interval_s=30.0, delete_delay_s=0.5))
    base = Limits(70.0, 65.0)
    usage = FilesystemUsage("/d", "/dev/x", 1000 * MiB, 600 * MiB, 400 * MiB)
    rate = 3 * MiB  # 600 + 3 x (L + 30) is over 700 anywhere in the period
    # Phase unknown: a request may be needed by any moment, so the forecast acts at once.
    assert stand(usage, with_forecast(base, model.forecast(5.0, rate)), 0).over
    model.observe_check(100.0)  # checks at 100, 130, 160, ...
    early = model.forecast(101.0, rate)
    assert early.send_in_s == pytest.approx(130.0 - 101.0 - 2 * 0.5 - model.send_lead)
    assert not stand(usage, with_forecast(base, early), 0).over
    in_window = model.forecast(130.0 - 1.0 - model.send_lead + 0.1, rate)
    assert in_window.send_in_s == 0 and not in_window.near_check
    standing = stand(usage, with_forecast(base, in_window), 0)
    assert standing.over and standing.predicted_only
    # Its requests feed the same check as one sent early would: the latency is the window's.
    assert in_window.latency_s == pytest.approx(130.0 - (129.0 - model.send_lead + 0.1) + 0.5)
    # Within the margin of the check itself: neither this check nor the next is sure.
    assert model.forecast(129.6, rate).deferred


def test_outside_the_send_window_a_cycle_over_the_ceiling_acts_on_todays_usage() -> None:
    model = ReclaimModel(ReclaimSettings(check_interval_s=30.0, delete_delay_s=0.5))
    model.observe_check(100.0)
    over = FilesystemUsage("/d", "/dev/x", 1000 * MiB, 720 * MiB, 280 * MiB)
    early = stand(over, with_forecast(Limits(70.0, 65.0), model.forecast(101.0, 3 * MiB)), 0)
    assert early.over and not early.predicted_only
    assert early.excess_bytes == 70 * MiB  # down to the target, no growth added yet
    late = stand(over, with_forecast(Limits(70.0, 65.0), model.forecast(126.5, 3 * MiB)), 0)
    # In the window: the growth until the reclaim and room for a period after it.
    assert late.excess_bytes == 720 * MiB + int(3 * MiB * 4.0) - (700 - 90) * MiB


def test_a_forecast_alone_deletes_at_most_the_growth_it_forecasts() -> None:
    usage = FilesystemUsage("/d", "/dev/x", 1000 * MiB, 690 * MiB, 310 * MiB)
    limits = Limits(
        70.0, 30.0, growth_bytes_per_s=1 * MiB, reclaim_latency_s=10.0, reclaim_period_s=20.0
    )
    standing = stand(usage, limits, 0)
    assert standing.over and standing.predicted_only
    # To the target it would be 690 + 10 - 300 = 400 MiB; the forecast predicts 30.
    assert standing.excess_bytes == 30 * MiB
    over = stand(FilesystemUsage("/d", "/dev/x", 1000 * MiB, 710 * MiB, 290 * MiB), limits, 0)
    assert over.excess_bytes == 710 * MiB + 10 * MiB - 300 * MiB  # KIP-61: over today


# -- the forecaster: windows from the broker's settings, history across a reload -----------
def _forecaster(tmp_path: Path, **retention: object) -> Forecaster:
    (tmp_path / "logs").mkdir(exist_ok=True)
    return Forecaster(load_config(write_config(tmp_path, tmp_path / "logs", **retention)))


def _steady(forecaster: Forecaster, seconds: float, t0: float = 0.0) -> None:
    for i in range(int(seconds * 4) + 1):
        forecaster.observe_usage("/d", t0 + i * 0.25, int(MiB * (t0 + i * 0.25)))


def test_the_forecast_rate_waits_for_two_periods_and_the_delay_a_warning_for_a_minute(
    tmp_path: Path,
) -> None:
    forecaster = _forecaster(tmp_path)
    forecaster.reclaim.set_settings(ReclaimSettings(15.0, 0.5, "broker"))
    assert forecaster.reclaim.model.rate_window_s == 30.5
    _steady(forecaster, 20.0)
    assert forecaster.growth_rate("/d") is None  # 20 s is not the 30.5 s a forecast spans
    assert forecaster.recent_rate("/d") is None
    _steady(forecaster, 12.0, t0=20.25)
    assert forecaster.growth_rate("/d") == pytest.approx(MiB, rel=0.05)
    # With Kafka's defaults a forecast needs 660 s; a warning judges by a minute.
    slow = _forecaster(tmp_path)
    assert slow.reclaim.model.rate_window_s == 660.0
    _steady(slow, 61.0)
    assert slow.growth_rate("/d") is None
    assert slow.recent_rate("/d") == pytest.approx(MiB, rel=0.05)


def test_a_reload_keeps_the_growth_history(tmp_path: Path) -> None:
    old = _forecaster(tmp_path)
    _steady(old, 30.0)
    new = _forecaster(tmp_path)
    new.reclaim.set_settings(ReclaimSettings(5.0, 0.5, "broker"))  # a 10.5 s window
    assert new.growth_rate("/d") is None
    new.adopt_history(old)
    assert new.growth_rate("/d") == pytest.approx(MiB, rel=0.05)


def test_the_send_lead_leaves_the_loop_a_few_polls(tmp_path: Path) -> None:
    assert _forecaster(tmp_path).reclaim.model.send_lead_s == SEND_LEAD_S
    slow = _forecaster(tmp_path, usage_poll_interval="1s")
    assert slow.reclaim.model.send_lead_s == 4.0


def test_the_send_lead_grows_with_slow_cycles() -> None:
    model = ReclaimModel(ReclaimSettings(check_interval_s=15.0, delete_delay_s=0.5))
    assert model.send_lead == SEND_LEAD_S
    model.observe_cycle(0.2)
    assert model.send_lead == SEND_LEAD_S
    model.observe_cycle(1.5)  # a busy machine: a cycle started 2 s ahead might be late
    assert model.send_lead == pytest.approx(4.5)
    for _ in range(8):  # the slow one has left the last eight
        model.observe_cycle(0.1)
    assert model.send_lead == SEND_LEAD_S


def test_a_request_a_slow_cycle_sends_too_late_for_a_check_is_sized_for_the_next() -> None:
    """Sized at the forecast for the check 0.5 s away, a request a loaded machine's cycle
    sends 1.5 s later reaches the broker after that check: it is reclaimed a period later,
    and the disk overshot by a period's growth. With slow cycles the forecast counts on the
    check after (a longer latency: more asked, earlier), never on one it cannot reach."""
    period, delay = 2.0, 0.3
    model = ReclaimModel(ReclaimSettings(check_interval_s=period, delete_delay_s=delay))
    model.observe_check(100.0)  # checks at 100, 102, 104, ...
    t = 101.5  # beyond the margin (0.2 s) of the check at 102
    assert model.latency_at(t) == (pytest.approx(102.0 - t + delay), "measured")
    model.observe_cycle(1.5)
    assert model.reach_s == 1.5
    assert model.latency_at(t) == (pytest.approx(104.0 - t + delay), "measured")
    # Phase unknown, our request waiting unrenamed: the check it awaits is due by 102.2; a
    # request that reaches the broker after that is not sure to feed it: the worst case.
    unknown = ReclaimModel(ReclaimSettings(check_interval_s=period, delete_delay_s=delay))
    unknown.observe_request(100.0)
    assert unknown.latency_at(101.5)[0] == pytest.approx(102.2 - 101.5 + delay)
    unknown.observe_cycle(1.5)
    assert unknown.latency_at(101.5)[0] == pytest.approx(period + delay)
    # One cycle that waited out a hung broker counts for a period at most, not seven.
    model.observe_cycle(7.0)
    assert model.reach_s == period
    assert model.latency_at(t)[0] == pytest.approx(104.0 - t + delay)
    for _ in range(8):  # quick cycles again: the usual margin only
        model.observe_cycle(0.05)
    assert model.latency_at(t)[0] == pytest.approx(102.0 - t + delay)
