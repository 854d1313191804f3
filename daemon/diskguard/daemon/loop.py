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

``Daemon`` is this module's loop plus three mixins, one file each: ``forecast`` (the
broker-mode look-ahead and the metrics of it), ``flowcontrol`` (flow state steps and
actuators), ``cycles`` (running retention cycles, skipping them while stuck). What the loop
uses but does not own: ``watch`` (inotify hints), ``statefile`` (its memory and
``state.json``), ``snapshot`` (usage records).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from diskguard.config import Config, load_config
from diskguard.daemon.brokerprobe import BrokerProbe
from diskguard.daemon.cycles import RetentionCycles
from diskguard.daemon.flowcontrol import FlowControl
from diskguard.daemon.snapshot import record_snapshots
from diskguard.daemon.statefile import STATE_EVERY_S, Memory, status_line, write_state
from diskguard.daemon.watch import Watcher
from diskguard.errors import ConfigError
from diskguard.flow.ballast import Ballast
from diskguard.flow.limits import flow_limits
from diskguard.flow.reconcile import Actuators
from diskguard.flow.state import FlowState
from diskguard.host import fsusage, sdnotify
from diskguard.host.openfiles import held_by_mount
from diskguard.kafkalog.model import FilesystemUsage
from diskguard.logs import configure_logging, get_logger
from diskguard.metrics import Metrics
from diskguard.retention.cycle import RetentionCycle
from diskguard.retention.outcome import CycleOutcome
from diskguard.retention.stuck import StuckTracker
from diskguard.snapshots.kafkasink import KafkaSink
from diskguard.snapshots.record import DeletedBytesCounter
from diskguard.snapshots.spool import Spool, SpoolError

log = get_logger("diskguard.daemon")

#: The shortest time between two loop iterations woken by hints (seconds): a crossing is
#: still noticed within this much of the write that made it, and a stream of appends costs
#: at most 1 / HINT_PACE_S iterations a second.
HINT_PACE_S = 0.02
#: CPU time a quiet retention cycle may spend dating partition heads ahead of need
#: (``dating.warm_heads``), so the first cycle over a limit finds them dated.
WARM_HEADS_S = 0.1


@dataclass
class _Timers:
    next_full: float = 0.0
    next_snapshot: float = 0.0


class Daemon(RetentionCycles, FlowControl):
    """The loop: wiring, signals, reload, the timers that schedule cycles and snapshots."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._reload = False
        self._watch = Watcher(self._wake)
        self._probe = BrokerProbe(self._probe_broker, config.retention.check_interval, self._wake)
        #: Stuck over a limit: what the last cycle saw, and the rescan back-off.
        self.stuck = StuckTracker()
        self._locks_seen: dict[str, bool] = {}
        self._backoff = config.retention.check_interval
        self.memory = Memory()
        self._last_outcome: CycleOutcome | None = None
        self._next_watchdog = 0.0
        self._next_budget_check = 0.0
        self._warned: set[str] = set()
        self._reclaim_slow: dict[str, float] = {}
        self._next_state_write = 0.0
        self._last_poll_at = time.monotonic()
        self._last_iteration_at = 0.0
        self.deleted = DeletedBytesCounter()
        self.metrics = Metrics(stale_after=max(60.0, 6 * config.retention.check_interval))
        self._build(config)

    # -- wiring ---------------------------------------------------------------
    def _build(self, config: Config) -> None:
        """(Re)create everything that depends on the config."""
        state_dir = Path(config.daemon.state_dir)
        state_dir.mkdir(parents=True, exist_ok=True)
        self.runtime = RetentionCycle(config, stuck=self.stuck, warm_heads_s=WARM_HEADS_S)
        self._probe.interval = max(1.0, config.retention.check_interval)
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

    def _probe_broker(self) -> bool:
        """The background probe (``brokerprobe``): the current cycle's client, quietly."""
        broker = self.runtime.broker
        return broker is not None and broker.reachable(quiet=True, probe=True)

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
        self._watch.stop()
        self._teardown()
        old_mounts = dict(self.devices)
        self.config = new
        configure_logging(new.logging.format, new.logging.level)
        self._build(new)
        for mount, device in old_mounts.items():
            if mount not in self.devices:
                self.metrics.forget_filesystem(mount, device)
                self.memory.flow.pop(mount, None)
        self._watch.start(self.config.broker.log_dirs, self)
        log.info("config_reloaded", config=str(source))
        sdnotify.ready(status_line(self.memory))

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
            self.runtime.forecaster.observe_usage(mount, time.monotonic(), usage.used_bytes)
        return out

    def _snapshot(self) -> None:
        outcome = self._retention(full=True)
        # Partition dirs made since the last check may be past the watch limit (watchdog
        # says nothing): say so, and keep the rescans at check_interval.
        self._watch.verify(self.config.broker.log_dirs)
        if outcome is None:
            return
        self._measure_deleted_open()
        record_snapshots(
            outcome.scan, self.config.snapshots.host, self.memory, self.deleted, self.spool
        )

    def _measure_deleted_open(self) -> None:
        """Space held by deleted-but-open files ("df says full, du says not"), per mount.

        A walk of /proc/*/fd: done with the snapshot, not on every usage poll.
        """
        try:
            held = held_by_mount(self.mounts)
        except OSError as exc:
            log.warning("open_files_scan_failed", error=exc.strerror or str(exc))
            return
        self.memory.deleted_open.update(held)

    # -- the loop -------------------------------------------------------------
    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        self._recover()
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
        write_state(self.memory, self.config.daemon.state_dir, self.runtime.ceilings.pending)
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
            reclaim_check_interval_s=self.runtime.forecaster.reclaim.settings.check_interval_s,
            reclaim_delete_delay_s=self.runtime.forecaster.reclaim.settings.delete_delay_s,
            reclaim_settings_source=self.runtime.forecaster.reclaim.settings.source,
        )
        self._watch.start(self.config.broker.log_dirs, self)
        self._probe.start()
        sdnotify.ready(status_line(self.memory))
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
            self._watch.stop()
            self._probe.stop()
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
        if hinted and not self._stop.is_set():
            # Pace wake-ups: a busy broker's appends are a stream of inotify hints, and one
            # iteration per hint was hundreds a second, each reading usage and metrics again.
            # Hints that arrive meanwhile are handled by the next iteration, at most
            # HINT_PACE_S later.
            since = time.monotonic() - self._last_iteration_at
            if since < HINT_PACE_S:
                self._stop.wait(HINT_PACE_S - since)
        self._last_iteration_at = time.monotonic()
        self._wake.clear()
        hint = self._watch.take()
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
            and self.runtime.ceilings.byte_budget
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
                    self.ballast.ensure(usage, flow_limits(cfg, usage.total_bytes))
        if self.sink is not None:
            self.sink.ship()
        elif self.spool is not None:
            self.spool.flush_queue()
        self._observe(usages)
        # Also every few seconds: `plan`, `enforce` and `status` read the measured growth rate
        # and reclaim latency from it while the daemon runs.
        if changed or transitions or time.monotonic() >= self._next_state_write:
            self._next_state_write = time.monotonic() + STATE_EVERY_S
            write_state(self.memory, self.config.daemon.state_dir, self.runtime.ceilings.pending)
            sdnotify.status(status_line(self.memory))
        if watchdog_every and time.monotonic() >= self._next_watchdog:
            # Pinged from the loop itself: a stuck loop stops pinging and systemd restarts it.
            sdnotify.watchdog()
            self._next_watchdog = time.monotonic() + watchdog_every / 3


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
    # ``kill -USR2``: every thread's stack on stderr (the journal), for a daemon that seems
    # stuck; it goes on running.
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    daemon = Daemon(config)
    if config.metrics.listen:
        daemon.metrics.start(config.metrics.listen)
    try:
        return daemon.run()
    finally:
        daemon.metrics.stop()
