"""Gauges added for the alert rules and the dashboard: the retention-unreachable bytes and
the overfull/underfull band as usage ratios. (The daemon sets them each retention cycle;
tests/test_prometheus_alerts_e2e.py scrapes them from a running daemon.)"""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diskguard.flow.state import FlowLimits
from diskguard.metrics import Metrics

NAME = "diskguard_filesystem_retention_unreachable_bytes"


def _values(metrics: Metrics) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == NAME:
                out[(s.labels["mountpoint"], s.labels["device"])] = s.value
    return out


def test_unreachable_bytes_per_filesystem_and_forgotten_on_reload() -> None:
    metrics = Metrics()
    metrics.observe_retention("/data/a", "/dev/sdb1", 5 * 2**30)
    metrics.observe_retention("/data/b", "/dev/sdc1", 0)
    assert _values(metrics) == {("/data/a", "/dev/sdb1"): 5 * 2**30, ("/data/b", "/dev/sdc1"): 0}
    metrics.observe_retention("/data/a", "/dev/sdb1", 0)
    assert _values(metrics)[("/data/a", "/dev/sdb1")] == 0
    metrics.forget_filesystem("/data/a", "/dev/sdb1")
    assert _values(metrics) == {("/data/b", "/dev/sdc1"): 0}


def _ratio(metrics: Metrics, name: str) -> float:
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            if s.name == name and s.labels == {"mountpoint": "/data/a", "device": "/dev/sdb1"}:
                return float(s.value)
    raise AssertionError(f"no {name}")


def _band(limits: FlowLimits, capacity: int) -> tuple[float, float]:
    metrics = Metrics()
    metrics.observe_flow_limits("/data/a", "/dev/sdb1", limits, capacity)
    return (
        _ratio(metrics, "diskguard_filesystem_overfull_limit_ratio"),
        _ratio(metrics, "diskguard_filesystem_underfull_limit_ratio"),
    )


def test_flow_band_is_whichever_limit_comes_first() -> None:
    """Percent, byte and free-space limits can be mixed; flow control engages at the lowest
    overfull one and releases under every underfull one, so the band drawn is the lowest."""
    cap = 1000 * 2**20
    percent = FlowLimits(overfull_percent=90, underfull_percent=80, min_free_bytes=10 * 2**20)
    assert _band(percent, cap) == pytest.approx((0.90, 0.80))
    both = FlowLimits(
        overfull_percent=90,
        underfull_percent=80,
        overfull_bytes=850 * 2**20,
        underfull_bytes=700 * 2**20,
        min_free_bytes=10 * 2**20,
    )
    assert _band(both, cap) == pytest.approx((0.85, 0.70))
    floor_only = FlowLimits(min_free_bytes=50 * 2**20)
    assert _band(floor_only, cap) == pytest.approx((0.95, 0.95))
    assert _band(FlowLimits(min_free_bytes=2 * cap), cap) == (0.0, 0.0)


def test_flow_band_dropped_with_the_filesystem() -> None:
    metrics = Metrics()
    metrics.observe_flow_limits("/data/a", "/dev/sdb1", FlowLimits(min_free_bytes=0), 100)
    metrics.forget_filesystem("/data/a", "/dev/sdb1")
    with pytest.raises(AssertionError):
        _ratio(metrics, "diskguard_filesystem_overfull_limit_ratio")
