"""``diskguard_filesystem_retention_unreachable_bytes``: what the retention-unreachable alert
reads. (The daemon sets it each cycle; tests/test_prometheus_alerts_e2e.py scrapes it.)"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

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
