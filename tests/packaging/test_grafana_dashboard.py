"""config/grafana/diskguard.json: a well-formed importable dashboard whose every query a real
Prometheus accepts, and answers with data wherever the metrics it reads are exported.

The Prometheus scrapes an in-process ``Metrics`` endpoint fed with a filesystem that fills up
while the test waits, so rates, ``deriv`` and ``predict_linear`` have samples to work on.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diskguard.flow.state import FlowLimits
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.metrics import Metrics
from support.promserver import PrometheusServer

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "config" / "grafana" / "diskguard.json"
DS = {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
MiB = 2**20

#: Set by the daemon only in broker mode (growth and the broker's reclaim latency); the
#: in-process feed here does not export them, so their queries are checked for errors only.
BROKER_FORECAST = {
    "diskguard_filesystem_growth_bytes_per_second",
    "diskguard_filesystem_predicted_usage_ratio",
    "diskguard_broker_reclaim_latency_seconds",
    "diskguard_broker_reclaim_expected_seconds",
    "diskguard_broker_reclaim_headroom_needed_bytes",
}

#: Grafana's built-in variables, as it would expand them for a short range.
BUILTINS = {
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
}


def load() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])  # collapsed rows hold their panels


def targets(dash: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel."""
    return [(p["title"], t["expr"]) for p in panels(dash) for t in p.get("targets", [])]


def substitute(expr: str, variables: set[str]) -> str:
    """What Grafana sends: built-ins expanded, every dashboard variable set to "All" (.*)."""

    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in BUILTINS:
            return BUILTINS[name]
        assert name in variables, f"undefined variable ${name} in {expr}"
        return ".*"

    out = re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", repl, expr)
    assert "$" not in out, out
    return out


def test_dashboard_is_importable_with_a_prometheus_input() -> None:
    dash = load()
    assert 38 <= dash["schemaVersion"] <= 40
    assert dash["uid"] == "diskguard" and dash["title"]
    (ds_input,) = dash["__inputs"]
    assert ds_input["name"] == "DS_PROMETHEUS" and ds_input["pluginId"] == "prometheus"
    ids = [p["id"] for p in panels(dash)]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels(dash):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DS, panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(t["datasource"] == DS and t["expr"].strip() for t in panel["targets"])
    for var in dash["templating"]["list"]:
        assert var["datasource"] == DS and var["allValue"] == ".*", var["name"]


def test_dashboard_shows_what_operators_need() -> None:
    exprs = "\n".join(e for _, e in targets(load()))
    for needed in (
        "diskguard_filesystem_usage_ratio",
        "diskguard_filesystem_limit_ratio",
        "diskguard_filesystem_overfull_limit_ratio",
        "diskguard_filesystem_underfull_limit_ratio",
        "rate(diskguard_segments_deleted_total",
        "rate(diskguard_deleted_bytes_total",
        "diskguard_filesystem_pending_reclaim_bytes",
        "diskguard_filesystem_overfull",
        "diskguard_filesystem_free_space_alert",
        'diskguard_broker_reclaim_latency_seconds{instance=~"$instance", '
        'mountpoint=~"$mountpoint", quantile="max"}',
        "diskguard_broker_reclaim_expected_seconds",
        "predict_linear(diskguard_filesystem_avail_bytes",
        "diskguard_partitions_set_aside",
    ):
        assert needed in exprs, needed


def _feed(metrics: Metrics, step: int) -> None:
    """One more moment of a 100 MiB filesystem filling by 1 MiB per step."""
    usage = FilesystemUsage(
        mount="/data/a",
        device="/dev/sdb1",
        total_bytes=100 * MiB,
        used_bytes=(70 + step) * MiB,
        available_bytes=(30 - step) * MiB,
    )
    metrics.observe_filesystem(
        usage, 85.0, 2 * MiB, overfull=step > 3, alert_level=1, deleted_open_bytes=MiB
    )
    metrics.observe_retention("/data/a", "/dev/sdb1", MiB * step)
    limits = FlowLimits(overfull_percent=90, underfull_percent=80, min_free_bytes=MiB)
    metrics.observe_flow_limits("/data/a", "/dev/sdb1", limits, 100 * MiB)
    metrics.count_deleted("offline", segments=1, bytes=MiB)
    metrics.observe_scan(0.01 * step)
    metrics.cycle_done()


def test_every_panel_query_runs_in_a_real_prometheus(tmp_path: Path) -> None:
    dash = load()
    variables = {v["name"] for v in dash["templating"]["list"]}
    metrics = Metrics()
    _, port = metrics.start("127.0.0.1:0")
    try:
        _feed(metrics, 0)
        with PrometheusServer(tmp_path / "prom", [f"127.0.0.1:{port}"]) as prom:
            # Enough scrapes (1 s apart) for rate/deriv/predict_linear, the disk filling.
            step, deadline = 0, time.monotonic() + 30
            while not prom.value("count_over_time(diskguard_build_info[1m]) >= 4"):
                assert time.monotonic() < deadline, prom.log_tail()
                step = min(step + 1, 20)
                _feed(metrics, step)
                time.sleep(0.5)
            exported = {
                s.name
                for family in text_string_to_metric_families(metrics.render().decode())
                for s in family.samples
            }
            checked_data = 0
            for title, expr in targets(dash):
                query = substitute(expr, variables)
                answer = prom.query(query)
                assert answer["status"] == "success", (title, query, answer)
                names = set(re.findall(r"\bdiskguard_\w+", query))
                # A name this feed does not export must be one of the documented broker-mode
                # forecast metrics (a typo would otherwise pass as "no data").
                assert names - exported <= BROKER_FORECAST, (title, names - exported)
                if names <= exported:
                    # Every metric it reads is exported: it must show something.
                    assert answer["data"]["result"], (title, query)
                    checked_data += 1
            assert checked_data >= 15
            for var in dash["templating"]["list"]:
                m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
                assert m, var["query"]
                selector = substitute(m.group(1), variables)
                found = {labels[m.group(2)] for labels, _ in prom.value(selector)}
                assert found == (
                    {"/data/a"} if m.group(2) == "mountpoint" else {f"127.0.0.1:{port}"}
                )
    finally:
        metrics.stop()


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ('x{mountpoint=~"$mountpoint"}[$__rate_interval]', 'x{mountpoint=~".*"}[1m]'),
        ('x{instance=~"${instance}"}', 'x{instance=~".*"}'),
        ('x{instance=~"${instance:regex}"}', 'x{instance=~".*"}'),
    ],
)
def test_substitute(expr: str, expected: str) -> None:
    assert substitute(expr, {"mountpoint", "instance"}) == expected
