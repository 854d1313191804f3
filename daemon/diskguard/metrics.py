"""Prometheus metrics and the ``/healthz`` probe, served over HTTP (edge).

Names follow node_exporter's filesystem metrics (``node_filesystem_size_bytes`` ...) with a
``diskguard_`` prefix and the same ``mountpoint``/``device`` labels, so a dashboard can join
diskguard's view with node_exporter's and an alert can be written once for both. The alert
level mirrors Redpanda's ``storage_disk_free_space_alert`` (0 ok, 1 low, 2 degraded).

A private ``CollectorRegistry`` keeps the process-wide default registry (and whatever a
library registers there) out of the scrape, and lets tests run several instances at once.
The server is a small ``http.server`` rather than ``prometheus_client.start_http_server``
because it also serves ``/healthz``: 200 while the daemon loop completes cycles, 503 once it
has stalled — a liveness signal a load balancer or Kubernetes probe can use without systemd.

Size: one class declares every metric, so the names a dashboard and the alert rules join on
are read in one place; split by kind they would be scattered for no other gain.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

from diskguard import __version__
from diskguard.flow.state import FlowLimits
from diskguard.kafkalog.model import FilesystemUsage

__all__ = ["DELETE_MODES", "KNOWN_ACTUATORS", "Metrics", "parse_listen"]

#: Label values pre-created at 0 so ``rate()``/``increase()`` work from the first scrape.
DELETE_MODES: tuple[str, ...] = ("broker", "offline")
KNOWN_ACTUATORS: tuple[str, ...] = ("exec", "quota", "acl", "holds")

_FS_LABELS = ("mountpoint", "device")
_SCAN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def parse_listen(listen: str) -> tuple[str, int]:
    """``"127.0.0.1:9309"``, ``"[::1]:9309"``, ``":9309"`` -> ``(host, port)``; ValueError if bad.

    An empty host means every IPv4 address (``0.0.0.0``), as node_exporter's ``:9100``.
    """
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f'expected HOST:PORT such as "127.0.0.1:9309", got {listen!r}')
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return (host or "0.0.0.0"), int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # A restart must not fail on a port still in TIME_WAIT.
    allow_reuse_address = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class Metrics:
    """Everything the daemon loop reports, and the HTTP endpoint that serves it.

    ``stale_after`` is how long after the last completed cycle ``/healthz`` still says ok;
    pick a few times the loop's ``check_interval``. Before the first cycle it says 503.
    """

    def __init__(
        self, stale_after: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.stale_after = stale_after
        self._clock = clock
        self._last_cycle_monotonic: float | None = None
        #: (gauge, label values) -> its child, see ``_series``.
        self._children: dict[tuple[Gauge, tuple[str, ...]], Gauge] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        r = self.registry

        def fs_gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, _FS_LABELS, registry=r)

        self.size_bytes = fs_gauge(
            "diskguard_filesystem_size_bytes", "Filesystem size in bytes (statvfs f_blocks)."
        )
        self.avail_bytes = fs_gauge(
            "diskguard_filesystem_avail_bytes",
            "Bytes a non-root process may still write (statvfs f_bavail), as df's Avail.",
        )
        self.used_bytes = fs_gauge(
            "diskguard_filesystem_used_bytes",
            "Bytes in use by anything (f_blocks - f_bfree), as df's Used.",
        )
        self.usage_ratio = fs_gauge(
            "diskguard_filesystem_usage_ratio",
            "used / (used + avail): df's Use% as a ratio, what disk_usage_percent limits.",
        )
        self.limit_ratio = fs_gauge(
            "diskguard_filesystem_limit_ratio",
            "Configured retention.disk_usage_percent as a ratio (1 = no limit).",
        )
        self.pending_reclaim_bytes = fs_gauge(
            "diskguard_filesystem_pending_reclaim_bytes",
            "Bytes already on their way out (*.deleted, -delete dirs, below log start offset).",
        )
        self.overfull = fs_gauge(
            "diskguard_filesystem_overfull",
            "1 while flow control is enforced (overfull), 0 once underfull again.",
        )
        self.free_space_alert = fs_gauge(
            "diskguard_filesystem_free_space_alert",
            "0 ok, 1 low free space, 2 degraded (below min_free_bytes).",
        )
        self.deleted_open_bytes = fs_gauge(
            "diskguard_filesystem_deleted_open_bytes",
            "Bytes held by deleted-but-still-open files: counted by df, invisible to du.",
        )
        self.growth_rate = fs_gauge(
            "diskguard_filesystem_growth_bytes_per_second",
            "Write rate of the filesystem (increases only; deletions do not count as growth).",
        )
        self.reclaim_latency = Gauge(
            "diskguard_broker_reclaim_latency_seconds",
            "Measured time from diskguard's DeleteRecords to the segment files being gone "
            "(quantile 0.5 and max over recent requests).",
            [*_FS_LABELS, "quantile"],
            registry=r,
        )
        self.reclaim_expected = fs_gauge(
            "diskguard_broker_reclaim_expected_seconds",
            "Time until space asked of the broker now is freed (next retention check + "
            "delete delay; worst case until a check has been seen).",
        )
        self.reclaim_headroom_needed = fs_gauge(
            "diskguard_broker_reclaim_headroom_needed_bytes",
            "Growth at the current write rate over the broker's worst-case reclaim latency "
            "(log.retention.check.interval.ms + log.segment.delete.delay.ms).",
        )
        self.predicted_usage_ratio = fs_gauge(
            "diskguard_filesystem_predicted_usage_ratio",
            "Usage predicted for when space asked now is freed (used + growth - pending).",
        )
        self.segments_deleted = Counter(
            "diskguard_segments_deleted",
            "Log segments deleted (broker: DeleteRecords; offline: unlinked).",
            ["mode"],
            registry=r,
        )
        self.deleted_bytes = Counter(
            "diskguard_deleted_bytes",
            "Allocated bytes of the log segments deleted.",
            ["mode"],
            registry=r,
        )
        self.scan_duration = Histogram(
            "diskguard_scan_duration_seconds",
            "Wall time of one log-dir scan.",
            buckets=_SCAN_BUCKETS,
            registry=r,
        )
        self.partitions_set_aside = Gauge(
            "diskguard_partitions_set_aside",
            "Partitions kept out of retention's plans for now: deleting from them failed in a "
            "way that recurs (an ACL denying DELETE, an immutable file); younger segments of "
            "other partitions go instead.",
            registry=r,
        )
        self.last_cycle = Gauge(
            "diskguard_last_cycle_timestamp_seconds",
            "Unix time the daemon loop last completed a cycle.",
            registry=r,
        )
        self.actuator_failures = Counter(
            "diskguard_actuator_failures",
            "Flow-control actuator runs that failed (exec exit != 0, quota/ACL API errors).",
            ["actuator"],
            registry=r,
        )
        self.hold_leases_expired = Counter(
            "diskguard_hold_leases_expired",
            "Holds of another guard of the cluster let go because it stopped renewing its "
            "lease (killed, hung or cut off): its ACLs and throttles no longer count.",
            registry=r,
        )
        self.retention_unreachable_bytes = fs_gauge(
            "diskguard_filesystem_retention_unreachable_bytes",
            "Excess the last retention cycle could not cover: only active, protected, "
            "hard-linked or extent-sharing segments were left, or deletions there did not free "
            "their space (0 = the target is reachable).",
        )
        self.overfull_limit_ratio = fs_gauge(
            "diskguard_filesystem_overfull_limit_ratio",
            "Usage ratio at which flow control engages: the lowest of overfull_percent, "
            "overfull_bytes and the min_free_bytes floor.",
        )
        self.underfull_limit_ratio = fs_gauge(
            "diskguard_filesystem_underfull_limit_ratio",
            "Usage ratio below which flow control is released: the lowest of "
            "underfull_percent, underfull_bytes and the min_free_bytes floor.",
        )
        build = Info("diskguard_build", "diskguard version.", registry=r)
        build.info({"version": __version__})
        for mode in DELETE_MODES:
            self.segments_deleted.labels(mode)
            self.deleted_bytes.labels(mode)
        for actuator in KNOWN_ACTUATORS:
            self.actuator_failures.labels(actuator)

    # -- what the daemon loop calls ------------------------------------------------------

    def observe_filesystem(
        self,
        usage: FilesystemUsage,
        limit_percent: float,
        pending_reclaim_bytes: int,
        overfull: bool,
        alert_level: int,
        deleted_open_bytes: int | None = None,
    ) -> None:
        """Record one filesystem's state after a cycle; labels are its mount and device."""
        series = self._series
        labels = (usage.mount, usage.device)
        series(self.size_bytes, labels).set(usage.total_bytes)
        series(self.avail_bytes, labels).set(usage.available_bytes)
        series(self.used_bytes, labels).set(usage.used_bytes)
        series(self.usage_ratio, labels).set(usage.usage_percent / 100.0)
        series(self.limit_ratio, labels).set(limit_percent / 100.0)
        series(self.pending_reclaim_bytes, labels).set(pending_reclaim_bytes)
        series(self.overfull, labels).set(1 if overfull else 0)
        series(self.free_space_alert, labels).set(alert_level)
        if deleted_open_bytes is not None:
            series(self.deleted_open_bytes, labels).set(deleted_open_bytes)

    def observe_forecast(
        self,
        usage: FilesystemUsage,
        growth_bytes_per_s: float,
        expected_latency_s: float,
        headroom_needed_bytes: int,
        predicted_usage_percent: float,
        latency_p50_s: float | None,
        latency_max_s: float | None,
    ) -> None:
        """Broker-mode forecast of one filesystem: rate, reclaim latency, headroom needed."""
        series = self._series
        labels = (usage.mount, usage.device)
        series(self.growth_rate, labels).set(growth_bytes_per_s)
        series(self.reclaim_expected, labels).set(expected_latency_s)
        series(self.reclaim_headroom_needed, labels).set(headroom_needed_bytes)
        series(self.predicted_usage_ratio, labels).set(predicted_usage_percent / 100.0)
        for quantile, value in (("0.5", latency_p50_s), ("max", latency_max_s)):
            if value is not None:
                series(self.reclaim_latency, (*labels, quantile)).set(value)

    def _series(self, gauge: Gauge, labels: tuple[str, ...]) -> Gauge:
        """``gauge.labels(*labels)``, kept: the loop sets ~14 filesystem gauges at every usage
        poll (4 a second), and ``labels()`` checks its arguments and takes the gauge's lock
        each time — a third of an idle poll's work. ``forget_filesystem`` drops
        what it removes, so a series removed is never set again through a stale child."""
        key = (gauge, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = gauge.labels(*labels)
        return child

    def forget_filesystem(self, mount: str, device: str) -> None:
        """Drop a filesystem's series (a log dir removed by a config reload)."""
        for gauge in (
            self.size_bytes,
            self.avail_bytes,
            self.used_bytes,
            self.usage_ratio,
            self.retention_unreachable_bytes,
            self.overfull_limit_ratio,
            self.underfull_limit_ratio,
            self.limit_ratio,
            self.pending_reclaim_bytes,
            self.overfull,
            self.free_space_alert,
            self.deleted_open_bytes,
            self.growth_rate,
            self.reclaim_expected,
            self.reclaim_headroom_needed,
            self.predicted_usage_ratio,
        ):
            with contextlib.suppress(KeyError):
                gauge.remove(mount, device)
        for quantile in ("0.5", "max"):
            with contextlib.suppress(KeyError):
                self.reclaim_latency.remove(mount, device, quantile)
        self._children = {
            key: child for key, child in self._children.items() if key[1][:2] != (mount, device)
        }

    def count_deleted(self, mode: str, segments: int, bytes: int) -> None:
        """Segments handed to the broker (``broker``) or unlinked (``offline``)."""
        self.segments_deleted.labels(mode).inc(segments)
        self.deleted_bytes.labels(mode).inc(bytes)

    def observe_scan(self, seconds: float) -> None:
        self.scan_duration.observe(seconds)

    def cycle_done(self, ts: float | None = None) -> None:
        """The loop finished a cycle at Unix time ``ts`` (now if None); feeds ``/healthz``."""
        self.last_cycle.set(time.time() if ts is None else ts)
        self._last_cycle_monotonic = self._clock()

    def actuator_failed(self, name: str) -> None:
        self.actuator_failures.labels(name).inc()

    def hold_lease_expired(self) -> None:
        self.hold_leases_expired.inc()

    def observe_retention(self, mount: str, device: str, unreachable_bytes: int) -> None:
        """One retention cycle's verdict for a filesystem: how much of its excess no deletable
        segment can cover. A gauge, not an event, so an alert can say it *persists*."""
        self.retention_unreachable_bytes.labels(mount, device).set(max(0, unreachable_bytes))

    def observe_flow_limits(
        self, mount: str, device: str, limits: FlowLimits, capacity_bytes: int
    ) -> None:
        """Where the overfull/underfull band lies, as usage ratios (used / capacity, capacity
        = used + avail), whatever mix of percent, byte and free-space limits the config uses:
        a dashboard draws it against ``usage_ratio`` without knowing the config."""
        if capacity_bytes <= 0:
            return
        floor = max(0.0, 1.0 - limits.min_free_bytes / capacity_bytes)
        over, under = [floor], [floor]
        if limits.overfull_percent is not None:
            over.append(limits.overfull_percent / 100.0)
        if limits.overfull_bytes is not None:
            over.append(limits.overfull_bytes / capacity_bytes)
        if limits.underfull_percent is not None:
            under.append(limits.underfull_percent / 100.0)
        if limits.underfull_bytes is not None:
            under.append(limits.underfull_bytes / capacity_bytes)
        self.overfull_limit_ratio.labels(mount, device).set(min(over))
        self.underfull_limit_ratio.labels(mount, device).set(min(under))

    # -- health ---------------------------------------------------------------------------

    def health(self) -> tuple[bool, str]:
        """``(healthy, reason)``: healthy while the last cycle is younger than stale_after."""
        last = self._last_cycle_monotonic
        if last is None:
            return False, "no cycle completed yet"
        age = self._clock() - last
        if age > self.stale_after:
            return False, f"last cycle {age:.0f}s ago (stale after {self.stale_after:.0f}s)"
        return True, "ok"

    def render(self) -> bytes:
        """The exposition text, as a scrape would get it."""
        return generate_latest(self.registry)

    # -- HTTP -----------------------------------------------------------------------------

    def start(self, listen: str) -> tuple[str, int]:
        """Serve ``/metrics`` and ``/healthz`` on ``listen`` (port 0 = any free port).

        Returns the bound ``(host, port)``. Raises ValueError for a malformed address and
        OSError if the port cannot be bound, so the caller can name the config key.
        """
        if self._server is not None:
            raise RuntimeError("metrics server already started")
        host, port = parse_listen(listen)
        server_cls: type[_Server] = _Server6 if ":" in host else _Server
        server = server_cls((host, port), _handler_for(self))
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.5},
            name="diskguard-metrics",
            daemon=True,
        )
        self._thread.start()
        bound = server.server_address
        return str(bound[0]), int(bound[1])

    @property
    def port(self) -> int | None:
        return int(self._server.server_address[1]) if self._server is not None else None

    def stop(self) -> None:
        """Stop serving and release the port; safe to call twice."""
        server, thread = self._server, self._thread
        self._server = self._thread = None
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)


def _handler_for(metrics: Metrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = f"diskguard/{__version__}"

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._reply(200, CONTENT_TYPE_LATEST, metrics.render())
            elif path == "/healthz":
                healthy, reason = metrics.health()
                self._reply(200 if healthy else 503, "text/plain; charset=utf-8", reason + "\n")
            elif path == "/":
                body = '<html><body><a href="/metrics">metrics</a> <a href="/healthz">healthz</a>'
                self._reply(200, "text/html; charset=utf-8", body + "</body></html>\n")
            else:
                self._reply(404, "text/plain; charset=utf-8", "not found\n")

        def _reply(self, code: int, content_type: str, body: bytes | str) -> None:
            data = body.encode() if isinstance(body, str) else body
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            # Scrapes every 15 s would flood the journal; errors surface in Prometheus.
            return

    return Handler
