"""Metrics over real HTTP on an ephemeral port, parsed with Prometheus' own text parser."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from diskguard.kafkalog.model import FilesystemUsage
from diskguard.metrics import Metrics, parse_listen


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def served(clock: FakeClock) -> Iterator[tuple[Metrics, str]]:
    metrics = Metrics(stale_after=30.0, clock=clock)
    host, port = metrics.start("127.0.0.1:0")
    assert port > 0
    yield metrics, f"http://{host}:{port}"
    metrics.stop()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


FS = frozenset({("mountpoint", "/var/lib/kafka"), ("device", "/dev/sdb1")})
USAGE = FilesystemUsage(
    mount="/var/lib/kafka",
    device="/dev/sdb1",
    total_bytes=100 * 2**30,
    used_bytes=80 * 2**30,
    available_bytes=15 * 2**30,
)


def test_scrape_has_node_exporter_style_filesystem_metrics(served: tuple[Metrics, str]) -> None:
    metrics, base = served
    metrics.observe_filesystem(
        USAGE,
        limit_percent=85.0,
        pending_reclaim_bytes=3 * 2**20,
        overfull=True,
        alert_level=1,
        deleted_open_bytes=5 * 2**20,
    )
    status, content_type, body = _get(base + "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain")
    samples = _samples(body)
    assert samples[("diskguard_filesystem_size_bytes", FS)] == 100 * 2**30
    assert samples[("diskguard_filesystem_avail_bytes", FS)] == 15 * 2**30
    assert samples[("diskguard_filesystem_used_bytes", FS)] == 80 * 2**30
    assert samples[("diskguard_filesystem_usage_ratio", FS)] == pytest.approx(80 / 95)
    assert samples[("diskguard_filesystem_limit_ratio", FS)] == pytest.approx(0.85)
    assert samples[("diskguard_filesystem_pending_reclaim_bytes", FS)] == 3 * 2**20
    assert samples[("diskguard_filesystem_overfull", FS)] == 1
    assert samples[("diskguard_filesystem_free_space_alert", FS)] == 1
    assert samples[("diskguard_filesystem_deleted_open_bytes", FS)] == 5 * 2**20

    metrics.observe_filesystem(USAGE, 85.0, 0, overfull=False, alert_level=0)
    samples = _samples(_get(base + "/metrics")[2])
    assert samples[("diskguard_filesystem_overfull", FS)] == 0
    assert samples[("diskguard_filesystem_free_space_alert", FS)] == 0

    metrics.forget_filesystem("/var/lib/kafka", "/dev/sdb1")
    samples = _samples(_get(base + "/metrics")[2])
    assert ("diskguard_filesystem_size_bytes", FS) not in samples

    # Back after a reload: the series are set anew, not through the children kept before.
    metrics.observe_filesystem(USAGE, 85.0, 0, overfull=True, alert_level=2)
    metrics.observe_forecast(USAGE, 1.5, 2.0, 3, 81.0, 0.25, 0.5)
    samples = _samples(_get(base + "/metrics")[2])
    assert samples[("diskguard_filesystem_size_bytes", FS)] == 100 * 2**30
    assert samples[("diskguard_filesystem_overfull", FS)] == 1
    assert samples[("diskguard_broker_reclaim_latency_seconds", FS | {("quantile", "max")})] == 0.5


def test_counters_histogram_and_cycle_timestamp(served: tuple[Metrics, str]) -> None:
    metrics, base = served
    samples = _samples(_get(base + "/metrics")[2])
    # Known label values exist at 0 from the first scrape so rate() has a baseline.
    assert samples[("diskguard_segments_deleted_total", frozenset({("mode", "broker")}))] == 0
    assert samples[("diskguard_actuator_failures_total", frozenset({("actuator", "exec")}))] == 0

    metrics.count_deleted("broker", segments=3, bytes=3 * 2**30)
    metrics.count_deleted("broker", segments=1, bytes=2**30)
    metrics.count_deleted("offline", segments=2, bytes=100)
    metrics.observe_scan(0.02)
    metrics.observe_scan(3.0)
    metrics.cycle_done(1_700_000_000.5)
    metrics.actuator_failed("quota")
    metrics.actuator_failed("quota")
    samples = _samples(_get(base + "/metrics")[2])
    broker = frozenset({("mode", "broker")})
    offline = frozenset({("mode", "offline")})
    assert samples[("diskguard_segments_deleted_total", broker)] == 4
    assert samples[("diskguard_deleted_bytes_total", broker)] == 4 * 2**30
    assert samples[("diskguard_segments_deleted_total", offline)] == 2
    assert samples[("diskguard_deleted_bytes_total", offline)] == 100
    assert samples[("diskguard_scan_duration_seconds_count", frozenset())] == 2
    assert samples[("diskguard_scan_duration_seconds_sum", frozenset())] == pytest.approx(3.02)
    le_005 = frozenset({("le", "0.05")})
    assert samples[("diskguard_scan_duration_seconds_bucket", le_005)] == 1
    assert samples[("diskguard_last_cycle_timestamp_seconds", frozenset())] == 1_700_000_000.5
    assert samples[("diskguard_actuator_failures_total", frozenset({("actuator", "quota")}))] == 2
    assert ("diskguard_build_info", frozenset({("version", "0.1.0")})) in samples


def test_only_diskguard_metrics_in_the_private_registry(served: tuple[Metrics, str]) -> None:
    _, base = served
    names = {family.name for family in text_string_to_metric_families(_get(base + "/metrics")[2])}
    assert names and all(name.startswith("diskguard_") for name in names)


def test_healthz_follows_the_loop(served: tuple[Metrics, str], clock: FakeClock) -> None:
    metrics, base = served
    status, _, body = _get(base + "/healthz")
    assert (status, body) == (503, "no cycle completed yet\n")
    metrics.cycle_done()
    assert _get(base + "/healthz")[:3:2] == (200, "ok\n")
    clock.now += 29
    assert _get(base + "/healthz")[0] == 200
    clock.now += 2
    status, _, body = _get(base + "/healthz")
    assert status == 503
    assert "stale" in body
    metrics.cycle_done()
    assert _get(base + "/healthz")[0] == 200
    assert _get(base + "/nope")[0] == 404


def test_two_instances_and_restart_on_the_same_port() -> None:
    first, second = Metrics(), Metrics()
    _, port = first.start("127.0.0.1:0")
    second.start("127.0.0.1:0")
    try:
        assert second.port != port
    finally:
        second.stop()
        first.stop()
        first.stop()  # idempotent
    again = Metrics()
    again.start(f"127.0.0.1:{port}")
    try:
        assert _get(f"http://127.0.0.1:{port}/metrics")[0] == 200
    finally:
        again.stop()


def test_ipv6_loopback() -> None:
    metrics = Metrics()
    try:
        host, port = metrics.start("[::1]:0")
    except OSError as exc:  # pragma: no cover - only on hosts without IPv6
        pytest.fail(f"IPv6 loopback unavailable: {exc}")
    try:
        assert host == "::1"
        assert _get(f"http://[::1]:{port}/metrics")[0] == 200
    finally:
        metrics.stop()


def test_port_in_use_is_an_oserror() -> None:
    first = Metrics()
    _, port = first.start("127.0.0.1:0")
    try:
        with pytest.raises(OSError):
            Metrics().start(f"127.0.0.1:{port}")
    finally:
        first.stop()


@pytest.mark.parametrize(
    ("listen", "expected"),
    [
        ("127.0.0.1:9309", ("127.0.0.1", 9309)),
        (":9309", ("0.0.0.0", 9309)),
        ("[::]:9309", ("::", 9309)),
        ("localhost:0", ("localhost", 0)),
    ],
)
def test_parse_listen(listen: str, expected: tuple[str, int]) -> None:
    assert parse_listen(listen) == expected


@pytest.mark.parametrize("bad", ["9309", "host:", "host:99999", "host:http"])
def test_parse_listen_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_listen(bad)
