"""``diskguard run``: the daemon loop.

One thread decides; everything else only wakes it. inotify (watchdog) events are *hints* —
the kernel queue can overflow and watchdog hides that — so three clocks drive the loop:

- a hint or the usage poll (``retention.usage_poll_interval``: one ``statvfs`` per
  filesystem, microseconds) notices a crossing within a fraction of a second: flow control
  steps at once and a retention cycle runs when a filesystem is over its ceiling;
- the ``check_interval`` timer runs a retention cycle regardless: the rescan is the truth;
- the ``snapshots.interval`` timer (and every flow/alert transition) runs a full scan
  (stat of every file) for the usage snapshot.

All timers use the monotonic clock, so wall-clock jumps never stall or rush the loop.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import Any

from watchdog.events import (
    DirCreatedEvent,
    DirDeletedEvent,
    DirMovedEvent,
    FileClosedEvent,
    FileCreatedEvent,
    FileDeletedEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer

from diskguard.config import Config, ConfigError, load_config
from diskguard.flow.actuators import Actuators
from diskguard.flow.ballast import Ballast
from diskguard.flow.state import ALERT_DEGRADED, FlowLimits, FlowState, Transition, step
from diskguard.host import fsusage, sdnotify
from diskguard.host.atomicfile import write_json_atomic
from diskguard.host.openfiles import bytes_by_device, scan_deleted_open_files
from diskguard.kafkalog import lockfile
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import configure_logging, get_logger
from diskguard.metrics import Metrics
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.inputs import limits_for, with_forecast
from diskguard.retention.mode import BROKER
from diskguard.retention.outcome import CycleOutcome
from diskguard.retention.planner import Limits, over_ceiling, room_above_ceiling
from diskguard.retention.stuck import MAX_BACKOFF_S, StuckTracker
from diskguard.snapshots.kafkasink import KafkaSink
from diskguard.snapshots.record import DeletedBytesCounter, build_snapshot
from diskguard.snapshots.spool import Spool, SpoolError

log = get_logger("diskguard.daemon")

STATE_FILE = "state.json"
#: state.json is rewritten at least this often (seconds) while the daemon runs.
STATE_EVERY_S = 5.0


class _ReclaimEvents(FileSystemEventHandler):
    """inotify renames/unlinks of segments we asked the broker for: the reclaim latency."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon

    def on_moved(self, event: FileSystemEvent) -> None:
        self._daemon.runtime.reclaim.on_event(
            "moved", str(event.src_path), str(event.dest_path), time.monotonic()
        )

    def on_deleted(self, event: FileSystemEvent) -> None:
        self._daemon.runtime.reclaim.on_event("deleted", str(event.src_path), "", time.monotonic())


#: Only changes: opens, reads and closes without a write are left out of the inotify mask.
#: Our own reads of checkpoints and ``.lock`` produced those, and each woke the loop for
#: another cycle that read them again: a busy loop while stuck over a limit (issue 11 item 7).
_EVENT_FILTER = [
    FileCreatedEvent,
    DirCreatedEvent,
    FileDeletedEvent,
    DirDeletedEvent,
    FileMovedEvent,
    DirMovedEvent,
    FileModifiedEvent,
    FileClosedEvent,
]


@dataclass(frozen=True)
class HintSummary:
    """What the hints since the last iteration said, in the categories a plan cares about.

    ``structural``: a name appeared, went or moved, or a file written to was closed (a roll,
    a deletion, a checkpoint rewritten): the plan's inputs changed. Appends (``modified``, the
    active segment growing) still wake the loop but change only sizes, which usage shows.
    ``lock_dirs``: dirs whose ``.lock`` had an event; whether that matters is for a probe to
    say, because diskguard's own offline sweep opens ``.lock`` for writing too.
    """

    structural: bool = False
    lock_dirs: frozenset[str] = frozenset()


class _Hint(FileSystemEventHandler):
    """A change under a log dir wakes the loop; what changed is found by rescanning."""

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake
        self._mutex = threading.Lock()
        self._structural = False
        self._locks: set[str] = set()

    def on_any_event(self, event: FileSystemEvent) -> None:
        kind = event.event_type
        if kind in ("opened", "closed_no_write"):
            return  # reads (ours among them) change nothing
        with self._mutex:
            for raw in (event.src_path, getattr(event, "dest_path", "")):
                path = os.fsdecode(raw)
                if not path:
                    continue
                if os.path.basename(path) == lockfile.LOCK_FILE:
                    self._locks.add(os.path.dirname(path))
                elif kind != "modified":
                    self._structural = True
        self._wake.set()

    def take(self) -> HintSummary:
        with self._mutex:
            summary = HintSummary(self._structural, frozenset(self._locks))
            self._structural = False
            self._locks.clear()
        return summary


@dataclass
class _Timers:
    next_full: float = 0.0
    next_snapshot: float = 0.0


@dataclass
class _Memory:
    """What the loop remembers between cycles (also written to ``state.json`` for `status`)."""

    flow: dict[str, FlowState] = field(default_factory=dict)
    last_deletion: dict[str, dict[str, Any]] = field(default_factory=dict)
    usage: dict[str, FilesystemUsage] = field(default_factory=dict)
    pending: dict[str, int] = field(default_factory=dict)
    deleted_open: dict[str, int] = field(default_factory=dict)
    #: mount -> growth rate and broker reclaim latency view (status, metrics, snapshots).
    reclaim: dict[str, dict[str, Any]] = field(default_factory=dict)


class Daemon:
    def __init__(self, config: Config) -> None:
        self.config = config
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._reload = False
        self._observer: Any = None
        self._hint: _Hint | None = None
        #: Stuck over a limit: what the last cycle saw, and the rescan back-off.
        self.stuck = StuckTracker()
        self._locks_seen: dict[str, bool] = {}
        self._backoff = config.retention.check_interval
        self.memory = _Memory()
        self._last_outcome: CycleOutcome | None = None
        self._next_watchdog = 0.0
        self._next_budget_check = 0.0
        self._warned: set[str] = set()
        self._reclaim_slow: dict[str, float] = {}
        self._next_state_write = 0.0
        self._last_poll_at = time.monotonic()
        self.deleted = DeletedBytesCounter()
        self.metrics = Metrics(stale_after=max(60.0, 6 * config.retention.check_interval))
        self._build(config)

    # -- wiring ---------------------------------------------------------------
    def _build(self, config: Config) -> None:
        """(Re)create everything that depends on the config."""
        state_dir = Path(config.daemon.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.runtime = RetentionCycle(config)
        self.runtime.stuck = self.stuck
        # One entry per device (st_dev), whatever mount point leads to it: a bind mount of
        # the same disk is the same filesystem. The key is the label, the first mount point
        # seen for the device, as scan() labels it (metrics, state.json, snapshots).
        self.mounts: dict[str, list[str]] = {}
        self.devices: dict[str, str] = {}
        for group in fsusage.group_by_device([str(d) for d in config.broker.log_dirs]):
            self.mounts.setdefault(group.mount, []).extend(group.paths)
            self.devices[group.mount] = group.device
        self.actuators = Actuators(config, state_dir, on_failure=self.metrics.actuator_failed)
        self.ballast = Ballast(config.ballast, state_dir) if config.ballast.path else None
        self.spool: Spool | None = None
        try:
            self.spool = Spool(
                state_dir / "spool",
                config.snapshots.spool_max_bytes,
                config.snapshots.spool_file_bytes,
            )
        except SpoolError as exc:
            # Snapshots are a report; guarding the disk is the job. Keep guarding.
            log.error("spool_unavailable", error=str(exc), snapshots="disabled")
        self.sink: KafkaSink | None = None
        if self.spool and config.snapshots.topic and config.broker.bootstrap_servers:
            self.sink = KafkaSink(
                config.broker.bootstrap_servers,
                config.snapshots.topic,
                dict(config.broker.client),
                self.spool,
            )

    def _teardown(self) -> None:
        if self.sink is not None:
            self.sink.close(timeout=3.0)
        if self.spool is not None:
            self.spool.close()
        self.actuators.close()
        self.runtime.close()

    # -- signals --------------------------------------------------------------
    def _on_stop(self, signum: int, _frame: FrameType | None) -> None:
        self._stop.set()
        self._wake.set()

    def _on_hup(self, _signum: int, _frame: FrameType | None) -> None:
        self._reload = True
        self._wake.set()

    def request_stop(self) -> None:
        self._stop.set()
        self._wake.set()

    # -- watching -------------------------------------------------------------
    def _start_watching(self) -> None:
        """inotify hints; without them (watch limit, a vanished dir) the poll still guards."""
        try:
            observer = Observer()  # watchdog opens its inotify instance here
        except OSError as exc:
            log.warning(
                "watch_failed",
                error=exc.strerror or str(exc),
                fallback="usage poll and periodic rescan only",
            )
            return
        handler = _Hint(self._wake)
        reclaim_events = _ReclaimEvents(self)
        for log_dir in self.config.broker.log_dirs:
            try:
                try:
                    watch = observer.schedule(
                        handler, str(log_dir), recursive=True, event_filter=_EVENT_FILTER
                    )
                except TypeError:  # a watchdog without event_filter: _Hint drops reads itself
                    watch = observer.schedule(handler, str(log_dir), recursive=True)
                # Same watch (renames and unlinks pass its filter): our segments' reclaim times.
                observer.add_handler_for_watch(reclaim_events, watch)
            except OSError as exc:
                log.warning("watch_failed", log_dir=str(log_dir), error=str(exc))
        observer.daemon = True
        try:
            observer.start()
        except OSError as exc:
            log.warning(
                "watch_failed",
                error=exc.strerror or str(exc),
                fallback="usage poll and periodic rescan only",
            )
            return
        self._observer = observer
        self._hint = handler

    def _stop_watching(self) -> None:
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=2)
            self._observer = None
            self._hint = None

    # -- reload ---------------------------------------------------------------
    def _do_reload(self) -> None:
        self._reload = False
        sdnotify.reloading()
        source = self.config.source
        try:
            new = load_config(Path(source))
        except ConfigError as exc:
            for problem in exc.problems:
                log.error("config_reload_rejected", problem=problem, config=str(source))
            sdnotify.ready("config reload rejected; previous config stays in force")
            return
        self._stop_watching()
        self._teardown()
        old_mounts = dict(self.devices)
        self.config = new
        configure_logging(new.logging.format, new.logging.level)
        self._build(new)
        for mount, device in old_mounts.items():
            if mount not in self.devices:
                self.metrics.forget_filesystem(mount, device)
                self.memory.flow.pop(mount, None)
        self._start_watching()
        log.info("config_reloaded", config=str(source))
        sdnotify.ready(self._status_line())

    # -- one iteration ----------------------------------------------------------
    def _read_usage(self) -> dict[str, FilesystemUsage]:
        out = {}
        for mount, dirs in self.mounts.items():
            try:
                usage = fsusage.usage_of(dirs[0], mount, self.devices[mount])
            except OSError as exc:
                log.error("usage_read_failed", mount=mount, error=exc.strerror or str(exc))
                continue
            out[mount] = usage
            self.runtime.observe_usage(mount, time.monotonic(), usage.used_bytes)
        return out

    def _account_reclaim(self, usages: dict[str, FilesystemUsage], now: float) -> None:
        """Between scans, a drop in usage is pending reclaim the broker has freed.

        ``pending`` is measured only by a scan (plus what a cycle asked for); without this the
        forecast would keep subtracting space the broker already gave back, predict too low,
        and ask only once the disk is over its ceiling. What was written meanwhile (rate x
        elapsed) is added back, so a drop during steady writes counts in full.
        """
        for mount, usage in usages.items():
            before = self.memory.usage.get(mount)
            pending = self.memory.pending.get(mount, 0)
            if before is None or not pending or usage.used_bytes >= before.used_bytes:
                continue
            elapsed = max(0.0, now - self._last_poll_at)
            written = (self.runtime.growth_rate(mount) or 0.0) * elapsed
            freed = before.used_bytes - usage.used_bytes + int(written)
            self.memory.pending[mount] = max(0, pending - freed)

    def _broker_mode(self) -> bool:
        last = self._last_outcome
        return last is not None and last.mode.mode == BROKER

    def _forecast_limits(self, mount: str) -> Limits:
        """The retention limits with this filesystem's forecast (broker mode only)."""
        limits = limits_for(self.config, BROKER)
        if not self._broker_mode():
            return limits
        return with_forecast(limits, self.runtime.forecast(mount))

    def _predicted(self, mount: str, usage: FilesystemUsage) -> FilesystemUsage | None:
        """Broker mode: the usage expected when space asked for now is freed, if higher."""
        if not self._broker_mode():
            return None
        grown = self._forecast_limits(mount).growth_bytes - self.memory.pending.get(mount, 0)
        if grown <= 0:
            return None
        return replace(
            usage,
            used_bytes=usage.used_bytes + grown,
            available_bytes=max(0, usage.available_bytes - grown),
        )

    def _flow(self, usages: dict[str, FilesystemUsage]) -> list[Transition]:
        transitions: list[Transition] = []
        for mount, usage in usages.items():
            limits = FlowLimits.from_config(self.config, usage.total_bytes)
            predicted = self._predicted(mount, usage)
            # Flow control engages on the predicted usage too: when even what the broker will
            # free cannot keep the disk under the overfull limit, producers must slow now.
            seen = predicted if predicted is not None else usage
            state, changes = step(self.memory.flow.get(mount, FlowState()), seen, limits)
            self.memory.flow[mount] = state
            for raw in changes:
                change = replace(
                    raw, usage_percent=usage.usage_percent, free_bytes=usage.available_bytes
                )
                if change.event == "overfull":
                    by_usage = limits.is_overfull(usage)
                    change = replace(
                        change,
                        reason="usage" if by_usage else "predicted",
                        predicted_usage_percent=None
                        if by_usage or predicted is None
                        else (predicted.usage_percent),
                    )
                fields = change.fields()
                if change.event == "overfull":
                    log.warning("overfull", **fields)
                elif change.event == "overfull_cleared":
                    log.info("overfull_cleared", **fields)
                elif change.level == ALERT_DEGRADED:
                    # Level 2 means overfull: an operator must see it (flow_control_applied
                    # then says whether anything holds producers back).
                    log.warning("disk_alert", **fields)
                else:
                    log.info("disk_alert", **fields)
                transitions.append(change)
        return transitions

    def _act_on_transitions(self, transitions: list[Transition]) -> None:
        if not transitions:
            return
        topics = self._topics_by_mount()
        for change in transitions:
            engaged = self.actuators.apply(change, topics=topics.get(change.mount, []))
            if change.event in ("overfull", "overfull_cleared"):
                self._log_flow_control_applied(change, engaged)
            if self.ballast is not None:
                self.ballast.on_transition(change)

    @staticmethod
    def _log_flow_control_applied(change: Transition, engaged: tuple[str, ...]) -> None:
        """Say what really holds producers back: the ``overfull`` text is Qpid's fixed
        contract ("flow control will be enforced") whether or not anything can enforce it,
        so this line names the actuators engaged, or says plainly that none is."""
        overfull = change.event == "overfull"
        if engaged:
            verb = "producers are being blocked by" if overfull else "producers released by"
            message = f"{verb}: {', '.join(engaged)}"
        else:
            message = "no actuator configured: producers are NOT held back"
        fields = {
            "mount": change.mount,
            "transition": change.event,
            "actuators": list(engaged),
            "message": message,
        }
        if overfull and not engaged:
            log.warning("flow_control_applied", **fields)
        else:
            log.info("flow_control_applied", **fields)

    def _topics_by_mount(self) -> dict[str, list[str]]:
        last = self._last_outcome
        out: dict[str, list[str]] = {}
        if last is None:
            return out
        for fs in last.scan.filesystems:
            out[fs.usage.mount] = sorted({p.topic for d in fs.log_dirs for p in d.partitions})
        return out

    def _over_retention_limit(self, usages: dict[str, FilesystemUsage]) -> bool:
        """Does any filesystem need a retention cycle now (today's usage or the forecast)?"""
        for mount, usage in usages.items():
            pending = self.memory.pending.get(mount, 0)
            if over_ceiling(usage, self._forecast_limits(mount), pending)[0]:
                return True
        return len(usages) < len(self.mounts)

    def _check_reclaim_headroom(self, usages: dict[str, FilesystemUsage]) -> None:
        """``broker_reclaim_slow``: the space between the ceiling and a full disk cannot absorb
        the growth over the broker's worst-case reclaim latency at the current write rate.
        Logged when it begins and every 10 minutes while it lasts."""
        if not self._broker_mode():
            return
        settings = self.runtime.reclaim.settings
        now = time.monotonic()
        for mount, usage in usages.items():
            rate = self.runtime.growth_rate(mount) or 0.0
            needed = int(rate * settings.worst_latency_s)
            room = room_above_ceiling(usage, self.config.retention.disk_usage_percent)
            last = self._reclaim_slow.get(mount)
            if needed <= room:
                self._reclaim_slow.pop(mount, None)
                continue
            if last is not None and now - last < 600.0:
                continue
            self._reclaim_slow[mount] = now
            log.warning(
                "broker_reclaim_slow",
                mount=mount,
                growth_bytes_per_s=round(rate, 1),
                reclaim_latency_s=settings.worst_latency_s,
                headroom_needed_bytes=needed,
                headroom_bytes=room,
                settings_source=settings.source,
                change=settings.settings_to_change(),
                message="the broker frees space too late for this write rate: lower "
                "log.retention.check.interval.ms / log.segment.delete.delay.ms, or lower "
                "retention.disk_usage_percent",
            )

    def _stuck_and_unchanged(self, usages: dict[str, FilesystemUsage], hint: HintSummary) -> bool:
        """True while every filesystem over its limit is stuck (see ``stuck``) and nothing a
        plan reads changed since the cycle that found it so: skip the cycle.

        A plan reads usage, file names, checkpoints, ``.lock`` and the config. Appends
        (``modified`` hints) change only sizes, which the usage check sees; a ``.lock`` event
        counts only if a probe answers differently (our own offline sweep opens it for
        writing); a reload resets the full-rescan timer, which runs a cycle regardless.
        """
        if not self.stuck.states or len(usages) < len(self.mounts):
            return False
        limits = limits_for(self.config, BROKER)
        over = {m for m, u in usages.items() if over_ceiling(u, limits, 0)[0]}
        if over != {m for m, s in self.stuck.states.items() if s.over_percent}:
            return False  # a filesystem crossed its limit either way since the last cycle
        if hint.structural or self.stuck.usage_moved(usages):
            return False
        return not any(
            d in self._locks_seen and lockfile.held_by_other(d) != self._locks_seen[d]
            for d in hint.lock_dirs
        )

    def _rescan_interval(self, usages: dict[str, FilesystemUsage], unchanged: bool) -> float:
        """``check_interval``, doubled after each periodic rescan that found the same stuck
        state (up to ``MAX_BACKOFF_S``); back to ``check_interval`` on any change."""
        base = self.config.retention.check_interval
        limits = limits_for(self.config, BROKER)
        over = [m for m, u in usages.items() if over_ceiling(u, limits, 0)[0]]
        if unchanged and self.stuck.all_stuck(over):
            self._backoff = min(max(base, MAX_BACKOFF_S), self._backoff * 2)
        else:
            self._backoff = base
        return self._backoff

    def _retention(self, full: bool = False) -> CycleOutcome | None:
        try:
            outcome = self.runtime.run(act=True, full=full)
        except Exception as exc:
            log.exception("cycle_failed", error=f"{type(exc).__name__}: {exc}")
            return None
        self._last_outcome = outcome
        self.metrics.observe_scan(outcome.duration_s)
        for fsp in outcome.plan.filesystems:
            self.metrics.observe_retention(fsp.mount, fsp.device, fsp.unreachable_bytes)
            capacity = fsp.used_bytes + fsp.available_bytes
            limits = FlowLimits.from_config(self.config, fsp.total_bytes)
            self.metrics.observe_flow_limits(fsp.mount, fsp.device, limits, capacity)
        for warning in outcome.warnings:
            # Each distinct problem once (a damaged index would otherwise repeat every cycle).
            if warning not in self._warned:
                if len(self._warned) > 10_000:
                    self._warned.clear()
                self._warned.add(warning)
                log.warning("scan_warning", message=warning)
        by_mode: dict[str, tuple[int, int]] = {}
        for res in outcome.results:
            if not res.ok:
                continue
            d = res.deletion
            self.deleted.add(d.mount, res.freed_bytes)
            count, size = by_mode.get(res.mode, (0, 0))
            by_mode[res.mode] = (count + 1, size + res.freed_bytes)
            self.memory.last_deletion[d.mount] = {
                "ts": time.time(),
                "topic": d.topic,
                "partition": d.partition,
                "base_offset": d.base_offset,
                "bytes": d.bytes,
                "mode": res.mode,
            }
        for mode, (count, size) in by_mode.items():
            self.metrics.count_deleted(mode, count, size)
        asked: dict[str, int] = {}
        for res in outcome.results:
            if res.ok and res.mode == BROKER:
                asked[res.deletion.mount] = asked.get(res.deletion.mount, 0) + res.freed_bytes
        for fs in outcome.scan.filesystems:
            # What this cycle asked the broker for is pending from now on, not from the next
            # scan: the forecast and flow control must not count it as still to be freed.
            mount = fs.usage.mount
            self.memory.pending[mount] = fs.pending_reclaim_bytes + asked.get(mount, 0)
            # The scan's usage is the baseline for the drops ``_account_reclaim`` counts next:
            # what was freed before the scan is already out of its pending.
            self.memory.usage[mount] = fs.usage
        self._last_poll_at = time.monotonic()
        if self.stuck.states:
            # What the .lock looked like to this cycle: a later .lock event is a change only
            # if a probe answers differently.
            self._locks_seen = {
                str(d): lockfile.held_by_other(d) for d in self.config.broker.log_dirs
            }
        return outcome

    def _snapshot(self) -> None:
        outcome = self._retention(full=True)
        if outcome is None:
            return
        self._measure_deleted_open()
        ts_ms = int(time.time() * 1000)
        for fs in outcome.scan.filesystems:
            mount = fs.usage.mount
            topics = outcome.scan.topics_by_mount.get(mount, {})
            state = self.memory.flow.get(mount, FlowState())
            record = build_snapshot(
                host=self.config.snapshots.host,
                ts_ms=ts_ms,
                fs=fs,
                topic_bytes={t: (u.partitions, u.bytes) for t, u in topics.items()},
                kafka_bytes=sum(d.kafka_bytes or 0 for d in fs.log_dirs),
                deleted_bytes=self.deleted.take(mount),
                flow_state="overfull" if state.overfull else "normal",
                alert_level=state.alert_level or 0,
                reclaim=_snapshot_reclaim(self.memory.reclaim.get(mount)),
            )
            if self.spool is not None:
                self.spool.append(record)

    def _measure_deleted_open(self) -> None:
        """Space held by deleted-but-open files ("df says full, du says not"), per mount.

        A walk of /proc/*/fd: done with the snapshot, not on every usage poll.
        """
        try:
            found = scan_deleted_open_files(list(self.mounts))
        except OSError as exc:
            log.warning("open_files_scan_failed", error=exc.strerror or str(exc))
            return
        held = bytes_by_device(found.files)
        for mount in self.mounts:
            try:
                self.memory.deleted_open[mount] = held.get(os.stat(mount).st_dev, 0)
            except OSError:
                continue

    def _reclaim_view(self, mount: str, usage: FilesystemUsage) -> dict[str, Any]:
        """Rate, the broker's reclaim latency (settings and measured) and what they imply."""
        rt = self.runtime
        forecast = rt.forecast(mount)
        view: dict[str, Any] = dict(rt.reclaim.summary([mount])[mount])
        predicted = self._predicted(mount, usage) or usage
        rate = rt.growth_rate(mount)
        view.update(
            growth_bytes_per_s=None if rate is None else round(rate, 1),
            expected_latency_s=round(forecast.latency_s, 3),
            latency_source=forecast.latency_source,
            headroom_needed_bytes=int((rate or 0.0) * rt.reclaim.settings.worst_latency_s),
            predicted_usage_percent=round(predicted.usage_percent, 3),
            broker_mode=self._broker_mode(),
        )
        return view

    def _observe(self, usages: dict[str, FilesystemUsage]) -> None:
        self._check_reclaim_headroom(usages)
        for mount, usage in usages.items():
            view = self._reclaim_view(mount, usage)
            self.memory.reclaim[mount] = view
            self.metrics.observe_forecast(
                usage,
                growth_bytes_per_s=view["growth_bytes_per_s"] or 0.0,
                expected_latency_s=view["expected_latency_s"],
                headroom_needed_bytes=view["headroom_needed_bytes"],
                predicted_usage_percent=view["predicted_usage_percent"],
                latency_p50_s=view["latency_p50_s"],
                latency_max_s=view["latency_max_s"],
            )
            state = self.memory.flow.get(mount, FlowState())
            self.metrics.observe_filesystem(
                usage,
                limit_percent=self.config.retention.disk_usage_percent,
                pending_reclaim_bytes=self.memory.pending.get(mount, 0),
                overfull=bool(state.overfull),
                alert_level=state.alert_level or 0,
                deleted_open_bytes=self.memory.deleted_open.get(mount),
            )
        self.memory.usage = usages
        self._last_poll_at = time.monotonic()
        self.metrics.cycle_done()

    def _write_state(self) -> None:
        data = {
            "pid": os.getpid(),
            "updated": time.time(),
            "filesystems": {
                mount: {
                    "flow_state": "overfull" if st.overfull else "normal",
                    "alert_level": st.alert_level or 0,
                    "last_deletion": self.memory.last_deletion.get(mount),
                    "pending_reclaim_bytes": self.memory.pending.get(mount, 0),
                    "reclaim": self.memory.reclaim.get(mount),
                }
                for mount, st in self.memory.flow.items()
            },
        }
        try:
            write_json_atomic(Path(self.config.daemon.state_dir) / STATE_FILE, data)
        except OSError as exc:
            log.warning("state_write_failed", error=exc.strerror or str(exc))

    def _status_line(self) -> str:
        parts = []
        for mount, usage in sorted(self.memory.usage.items()):
            st = self.memory.flow.get(mount, FlowState())
            flag = " OVERFULL" if st.overfull else ""
            parts.append(f"{mount} {usage.usage_percent:.1f}%{flag}")
        return "; ".join(parts) or "starting"

    # -- the loop -------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        self._recover()
        # Keep a little space for audit lines even when the disk fills up later.
        self.runtime.audit.ensure_reserve()
        # A restart must not release producers of a disk still between the limits: continue
        # the episode the actuators' state file says was open.
        for mount in self.actuators.recorded_overfull_mounts():
            if mount in self.mounts:
                self.memory.flow[mount] = FlowState(overfull=True)
        usages = self._read_usage()
        transitions = self._flow(usages)
        self._snapshot()  # the first full scan; also runs a retention cycle
        first = self._last_outcome
        self.actuators.reconcile(
            {m: bool(s.overfull) for m, s in self.memory.flow.items()}, self._topics_by_mount()
        )
        self._act_on_transitions(transitions)
        self._observe(usages)
        self._write_state()
        log.info(
            "daemon_started",
            config=str(self.config.source),
            log_dirs=[str(d) for d in self.config.broker.log_dirs],
            filesystems=sorted(self.mounts),
            partitions=(
                sum(len(d.partitions) for fs in first.scan.filesystems for d in fs.log_dirs)
                if first
                else 0
            ),
            mode=first.mode.mode if first else "unknown",
            # What the broker-mode forecast starts from (measured values follow in status).
            reclaim_check_interval_s=self.runtime.reclaim.settings.check_interval_s,
            reclaim_delete_delay_s=self.runtime.reclaim.settings.delete_delay_s,
            reclaim_settings_source=self.runtime.reclaim.settings.source,
        )
        self._start_watching()
        sdnotify.ready(self._status_line())
        watchdog_every = sdnotify.watchdog_interval()
        timers = _Timers()
        now = time.monotonic()
        timers.next_full = now + self.config.retention.check_interval
        timers.next_snapshot = now + self.config.snapshots.interval
        try:
            while not self._stop.is_set():
                self._iteration(timers, watchdog_every)
        finally:
            sdnotify.stopping()
            self._stop_watching()
            self._teardown()
            log.info("daemon_stopped")
        return 0

    def _iteration(self, timers: _Timers, watchdog_every: float | None) -> None:
        cfg = self.config
        now = time.monotonic()
        poll = cfg.retention.usage_poll_interval
        if watchdog_every:
            poll = min(poll, watchdog_every / 2)
        timeout = max(0.0, min(timers.next_full - now, timers.next_snapshot - now, poll))
        hinted = self._wake.wait(timeout)
        self._wake.clear()
        hint = self._hint.take() if self._hint is not None else HintSummary()
        if self._stop.is_set():
            return
        if self._reload:
            self._do_reload()
            timers.next_full = 0.0
        now = time.monotonic()
        usages = self._read_usage()
        self._account_reclaim(usages, now)
        transitions = self._flow(usages)
        full_due = now >= timers.next_full
        snapshot_due = now >= timers.next_snapshot or bool(transitions)
        # Stuck over a limit and nothing a plan reads has changed: another cycle would only
        # repeat the last one. Usage growth, a real change, a reload end this at once.
        unchanged = self._stuck_and_unchanged(usages, hint)
        # A byte budget needs a stat of every file to check: on a hint, but at most once a
        # second, or a busy broker's stream of inotify events would keep us scanning.
        needs_bytes = (
            hinted
            and not unchanged
            and cfg.retention.max_bytes is not None
            and now >= self._next_budget_check
        )
        if needs_bytes:
            self._next_budget_check = now + 1.0
        changed = False
        if snapshot_due:
            self._snapshot()
            timers.next_snapshot = time.monotonic() + cfg.snapshots.interval
            timers.next_full = time.monotonic() + self._rescan_interval(usages, unchanged)
            changed = True
        elif (
            full_due
            or needs_bytes
            # While stuck, also when a stuck filesystem went back under: it is cleared then.
            or ((self._over_retention_limit(usages) or bool(self.stuck.states)) and not unchanged)
        ):
            self._retention()
            timers.next_full = time.monotonic() + self._rescan_interval(usages, unchanged)
            changed = True
        self._act_on_transitions(transitions)
        if changed:
            # Topics come and go: a topic created while its disk is overfull needs its ACL too.
            self.actuators.reconcile(
                {m: bool(s.overfull) for m, s in self.memory.flow.items()},
                self._topics_by_mount(),
            )
        if changed and self.ballast is not None:
            fresh = self._read_usage()
            for mount, usage in fresh.items():
                if fsusage_contains(mount, self.ballast.path):
                    self.ballast.ensure(usage, FlowLimits.from_config(cfg, usage.total_bytes))
        if self.sink is not None:
            self.sink.ship()
        elif self.spool is not None:
            self.spool.flush_queue()
        self._observe(usages)
        # Also every few seconds: `plan`, `enforce` and `status` read the measured growth rate
        # and reclaim latency from it while the daemon runs.
        if changed or transitions or time.monotonic() >= self._next_state_write:
            self._next_state_write = time.monotonic() + STATE_EVERY_S
            self._write_state()
            sdnotify.status(self._status_line())
        if watchdog_every and time.monotonic() >= self._next_watchdog:
            # Pinged from the loop itself: a stuck loop stops pinging and systemd restarts it.
            sdnotify.watchdog()
            self._next_watchdog = time.monotonic() + watchdog_every / 3

    def _recover(self) -> None:
        """Finish half-done offline deletions from a previous run before anything else.

        ``recover`` skips (and records) entries of log dirs another process holds.
        """
        try:
            done = self.runtime.files.recover([str(d) for d in self.config.broker.log_dirs])
        except Exception as exc:
            log.exception("offline_recover_failed", error=str(exc))
            return
        if done:
            log.info("offline_recovered", segments=len(done))


#: The reclaim view's fields a snapshot record carries (docs/snapshots.md).
_SNAPSHOT_RECLAIM_KEYS = (
    "growth_bytes_per_s",
    "check_interval_s",
    "delete_delay_s",
    "latency_p50_s",
    "latency_max_s",
    "latency_samples",
)


def _snapshot_reclaim(view: dict[str, Any] | None) -> dict[str, Any] | None:
    if view is None:
        return None
    return {key: view.get(key) for key in _SNAPSHOT_RECLAIM_KEYS}


def fsusage_contains(mount: str, path: Path | None) -> bool:
    """Whether ``path`` lives on the device labelled ``mount`` (by ``st_dev``, so a path
    through another mount point of the same device counts)."""
    if path is None:
        return False
    try:
        return os.stat(path.parent).st_dev == os.stat(mount).st_dev
    except OSError:
        return False


def run_daemon(config: Config) -> int:
    configure_logging(config.logging.format, config.logging.level)
    daemon = Daemon(config)
    if config.metrics.listen:
        daemon.metrics.start(config.metrics.listen)
    try:
        return daemon.run()
    finally:
        daemon.metrics.stop()
